// Slurm helpers for `trainflow slurm`: reading what Slurm puts in a job's environment (SLURM_JOB_NODELIST,
// SLURM_TASKS_PER_NODE) and writing sbatch scripts (--time, --nodelist/--exclude, --job-name, quoted
// command words). Pure: no processes, files or environment; the caller reads the variables and writes the
// script. Errors are InvalidArgument naming the text (quoted, cut to 80 bytes) and what is wrong with it.
// Thread safety: free functions on values; safe from any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace tf::slurm {

// The most names ExpandNodeList returns and entries ParseTasksPerNode returns (and the largest repeat).
inline constexpr int64_t kMaxNodes = 65536;

// Slurm's compressed host list to names, in order, duplicates kept: "node[01-03,7],gpu-a1,rack[1-2]-n[1-2]"
// -> node01 node02 node03 node7 gpu-a1 rack1-n1 rack1-n2 rack2-n1 rack2-n2. Names are split at commas outside
// brackets and trimmed of surrounding whitespace; a bracket holds comma-separated numbers and ranges lo-hi of
// at most 18 digits, each padded with zeros to the width of its lower bound ("n[08-10]" -> n08 n09 n10);
// several brackets in a name expand left-most slowest. Errors: an empty list or name, whitespace inside a
// name, an unbalanced, nested or empty bracket, non-digits in a bracket, hi < lo, over kMaxNodes names.
StatusOr<std::vector<std::string>> ExpandNodeList(const std::string& list);

// The reverse, for sbatch --nodelist/--exclude. A name's group is its prefix (all but its trailing digits)
// and a width: the number of trailing digits if they are zero-padded ("n08"), or if another name of the
// prefix is zero-padded to that many; otherwise none, so plain numbers of any length share a group
// ("n9,n10" -> "n[9-10]"; "n08,n9,n10" -> "n[08,10],n9"). A name without trailing digits, or with more
// than 18, is a group of its own. Groups appear in order of first appearance; a group's distinct names
// sorted by number, consecutive numbers as ranges: "node[1-2,4]"; a group of one distinct name stays plain.
// Contract: ExpandNodeList(CompressNodeList(x)) is x with duplicates removed and each group's names brought
// together at its first appearance, sorted by number. "" for an empty x.
// REQUIRES: names non-empty, without whitespace, ',', '[' or ']' (as ExpandNodeList returns them).
std::string CompressNodeList(const std::vector<std::string>& names);

// SLURM_TASKS_PER_NODE to one count per node: "2(x3),1" -> {2, 2, 2, 1}; "4" -> {4}. Items trimmed of
// whitespace. Errors: malformed text, a count outside 1..INT_MAX, a repeat outside 1..kMaxNodes, more than
// kMaxNodes entries in total.
StatusOr<std::vector<int>> ParseTasksPerNode(const std::string& text);

// An sbatch --time value to seconds: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS" (fields of
// digits, surrounding whitespace trimmed); "UNLIMITED" or "INFINITE" in any case -> -1. The leading field may
// exceed its unit ("90" is 90 minutes, "100:00" is 100 minutes); minutes and seconds after it must be below
// 60, hours after a day below 24. Errors: empty, negative, non-numeric or malformed text, a field out of
// range, a total over INT64_MAX seconds. "0" is 0 here, though Slurm reads a zero limit as none.
StatusOr<int64_t> ParseSlurmTime(const std::string& text);
// "HH:MM:SS" under a day, "D-HH:MM:SS" from a day on, "UNLIMITED" for a negative value;
// ParseSlurmTime(FormatSlurmTime(s)) == s for every s >= 0.
std::string FormatSlurmTime(int64_t seconds);

// One word for POSIX sh: a non-empty word of [A-Za-z0-9_./:=,@%+-] as it is, anything else in single
// quotes with each ' written as '\''. REQUIRES: no NUL byte (sh cannot carry one).
std::string ShellQuote(const std::string& s);

// A value written into an #SBATCH line for `flag` (--partition, --account, --qos, --constraint,
// --mem): what Slurm accepts there, never a newline, a space or a leading '-'. InvalidArgument names
// the flag and the offending character.
Status CheckSbatchValue(const std::string& flag, const std::string& value);
// A path written into #SBATCH lines and comments (the job directory, the working directory): no
// control character, space, quote, '%', '\\', '$' or '`'. InvalidArgument names `what`.
Status CheckSbatchPath(const std::string& what, const std::string& path);
// An --sbatch-arg: exactly one long option ("--name" or "--name=value"), no spaces or control characters.
Status CheckSbatchOption(const std::string& option);

// A job name trainflow writes: 1..64 characters of [A-Za-z0-9_.-], not starting with '-' or '.'.
bool ValidJobName(const std::string& name);

}  // namespace tf::slurm
