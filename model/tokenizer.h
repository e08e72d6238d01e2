// Tokenizers: text <-> token ids for training data and sampling.
//
// Two implementations behind one small interface:
//   * byte:  vocab 256, id = byte value, no end-of-text token; exact for any byte string.
//   * gpt2:  OpenAI's GPT-2 byte-level BPE (encoder.json + vocab.bpe), bit-for-bit the ids
//            of OpenAI's encoder.py for valid UTF-8 text, plus the special token
//            "<|endoftext|>" = 50256 (see LoadGpt2Tokenizer). Format notes: docs/tokenizers.md.
//
// Ownership: factories return a std::unique_ptr the caller owns; a tokenizer keeps no
// reference to its input files or to the strings passed to it.
// Thread safety: a tokenizer is immutable after construction; Encode/Decode and the
// accessors are const and safe to call concurrently from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tf {

class Tokenizer {
 public:
  Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  virtual ~Tokenizer();

  // Any byte string is accepted (it need not be valid UTF-8); never fails.
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // Concatenates the bytes of each id. An id outside [0, vocab_size()) becomes U+FFFD
  // ("\xEF\xBF\xBD"); nothing is skipped. Decode(Encode(s)) == s for every s.
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
  // The end-of-text token id, or -1 if the tokenizer has none.
  virtual int eot_token() const = 0;
  // "byte" or "gpt2": the kind accepted by MakeTokenizer.
  virtual std::string name() const = 0;
  // Identifies the vocabulary and merges (xxh64 of every id's bytes, then the merges in rank
  // order), whatever the files' formatting; 0 for the byte tokenizer, which has no files. Stored in
  // token files and weights so that data, model and tokenizer can be checked against each other.
  virtual uint64_t fingerprint() const = 0;
};

// The vocabulary size of a tokenizer kind without loading it: byte 256, gpt2 50257; 0 otherwise.
int TokenizerVocabSize(const std::string& kind);
// The kind a model of this vocabulary size was most likely trained with, for weights that do not
// record it: 256 -> "byte", 50257 -> "gpt2", else "".
std::string TokenizerKindForVocab(int vocab_size);

// Where the GPT-2 files are looked for when no directory is named, in order:
// <binary's directory>/../third_party/gpt2-tokenizer (build/trainflow in a checkout, where the setup
// scripts fetch them); <binary's directory>/../share/trainflow/gpt2-tokenizer (an installed tree);
// ./third_party/gpt2-tokenizer.
std::vector<std::string> Gpt2TokenizerSearchPath();
// The directory holding encoder.json and vocab.bpe: `dir` when given, else $TRAINFLOW_TOKENIZER_DIR
// when set (either is taken as given: NotFound naming the missing file and how to fetch it), else
// the first of Gpt2TokenizerSearchPath() that has both (NotFound listing where it looked, the fetch
// script, --tokenizer-dir and TRAINFLOW_TOKENIZER_DIR).
StatusOr<std::string> FindGpt2TokenizerDir(const std::string& dir);

// The byte tokenizer: vocab_size 256, id = byte value, eot_token -1.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// Loads the GPT-2 BPE tokenizer from OpenAI's encoder.json and vocab.bpe
// (scripts/fetch_gpt2_tokenizer.sh fetches them).
// Encode: the literal text "<|endoftext|>" anywhere in the input becomes the single token
// 50256 (as tiktoken's allowed_special="all"); the text between such markers is
// pre-tokenized with GPT-2's regex (PCRE2, UTF+UCP) and BPE-merged by rank. Bytes that are
// not valid UTF-8 are never dropped: they are BPE-encoded as raw bytes, so round trips
// stay exact.
// Errors: NotFound naming a missing file; Corruption naming the file and line for
// malformed JSON, a bad vocab.bpe line, or a vocabulary the merges do not fit.
StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json_path,
                                                       const std::string& vocab_bpe_path);

// kind "byte" -> MakeByteTokenizer(); kind "gpt2" -> LoadGpt2Tokenizer on
// <dir>/encoder.json and <dir>/vocab.bpe, dir = FindGpt2TokenizerDir(gpt2_dir) ("" searches;
// gpt2_dir is unused for "byte").
// Any other kind -> InvalidArgument naming it and the allowed values.
StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& kind,
                                                   const std::string& gpt2_dir);

}  // namespace tf
