// Automatic codec choice (`"compression": "auto"`): compression pays only where the link is slow
// compared with the codec's cost, so at start-up the ranks measure instead of guessing.
//
// For each candidate (none, bf16, int8) a GradientReducer over a probe buffer (random values,
// min(gradient size, 4M) elements, the job's bucket sizes) is timed end to end — encode, the
// collectives and decode, i.e. what a step would expose if nothing overlapped — over a few
// repetitions (median), and scaled to the job's gradient size. The fastest wins; a lossy codec
// must beat `none` by more than 5% (on a fast link exact reduction is kept). Sign and top-k are
// never chosen automatically: how much they slow convergence depends on the run, so they are a
// deliberate choice. Rank 0's measurements decide (broadcast), so every rank picks the same codec.
//
// Collective: every rank must call it with the same arguments. Thread safety: none.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/codec.h"
#include "comm/communicator.h"
#include "comm/reducer.h"

namespace tf::comm {

struct CodecChoice {
  CodecConfig codec;
  std::string reason;  // "measured ...: none 812 ms, bf16 431 ms, int8 236 ms per step -> int8"
  struct Candidate {
    std::string name;
    double predicted_ms = 0;  // for the job's full gradient
  };
  std::vector<Candidate> candidates;
};

// grad_elements: the job's gradient size; base: the job's reducer options (buckets, error
// feedback, seed) — its codec is ignored.
StatusOr<CodecChoice> ChooseCodec(Communicator* comm, int64_t grad_elements, const ReducerOptions& base);

// Turns per-candidate timings (ms for the full gradient, rank 0's, same order as candidates) into
// the choice and its reason: the fastest, a lossy codec only if it beats `none` by more than 5%.
// Shared by the host and device versions; pure (tested).
StatusOr<CodecChoice> DecideCodec(const std::vector<std::string>& candidates, const std::vector<double>& ms,
                                  int64_t grad_elements, int world, const std::string& where);

}  // namespace tf::comm
