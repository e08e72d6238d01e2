#include "comm/auto_codec.h"

#include <algorithm>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "base/aligned_buffer.h"

namespace tf::comm {

StatusOr<CodecChoice> ChooseCodec(Communicator* comm, int64_t grad_elements, const ReducerOptions& base) {
  CodecChoice choice;
  if (comm->world() == 1) {
    choice.reason = "one rank: nothing to send";
    return choice;
  }
  const int64_t probe_n = std::max<int64_t>(1, std::min<int64_t>(grad_elements, int64_t{4} << 20));
  AlignedBuffer probe(probe_n);
  std::mt19937 rng(1234u + static_cast<unsigned>(comm->rank()));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  // Ready ranges of about 1 MB, announced all at once (the probe times the reduction itself).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t e = probe_n; e > 0; e -= int64_t{1} << 18) ranges.emplace_back(std::max<int64_t>(0, e - (int64_t{1} << 18)), e);

  const char* kCandidates[] = {"none", "bf16", "int8"};
  constexpr int kReps = 3;
  std::vector<double> ms;  // per candidate, rank 0's median, scaled to the full gradient
  for (const char* name : kCandidates) {
    ReducerOptions ro = base;
    TF_ASSIGN_OR_RETURN(ro.codec, ParseCodec(name));
    TF_ASSIGN_OR_RETURN(auto reducer, GradientReducer::Create(comm, probe.span(), ranges, ro));
    std::vector<double> times;
    for (int rep = 0; rep <= kReps; ++rep) {  // rep 0 warms up
      for (int64_t i = 0; i < probe_n; ++i) probe.data()[i] = normal(rng);
      const auto t0 = std::chrono::steady_clock::now();
      reducer->BeginStep(rep);
      for (auto [b, e] : ranges) reducer->MarkReady(b, e);
      TF_RETURN_IF_ERROR(reducer->Finish());
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    ms.push_back(times[times.size() / 2] * static_cast<double>(grad_elements) / static_cast<double>(probe_n));
  }
  // Rank 0 decides for everyone (timings differ slightly from rank to rank).
  TF_RETURN_IF_ERROR(comm->Broadcast(ms.data(), ms.size() * sizeof(double), 0));
  return DecideCodec({std::begin(kCandidates), std::end(kCandidates)}, ms, grad_elements, comm->world(), "host");
}

StatusOr<CodecChoice> DecideCodec(const std::vector<std::string>& candidates, const std::vector<double>& ms,
                                  int64_t grad_elements, int world, const std::string& where) {
  if (candidates.empty() || candidates.size() != ms.size() || candidates[0] != "none") {
    return Status::InvalidArgument("auto codec: candidates must start with none and match the timings");
  }
  CodecChoice choice;
  size_t best = 0;
  for (size_t i = 1; i < ms.size(); ++i) {
    if (ms[i] < ms[best]) best = i;
  }
  if (best != 0 && ms[best] > 0.95 * ms[0]) best = 0;  // a lossy codec must clearly pay
  TF_ASSIGN_OR_RETURN(choice.codec, ParseCodec(candidates[best]));
  std::string list;
  for (size_t i = 0; i < ms.size(); ++i) {
    choice.candidates.push_back({candidates[i], ms[i]});
    list += fmt::format("{}{} {:.0f} ms", i ? ", " : "", candidates[i], ms[i]);
  }
  const double gbps = ms[0] > 0 ? 2.0 * grad_elements * 4 * (world - 1) / world / (ms[0] * 1e6) : 0;
  choice.reason = fmt::format("auto ({}): reducing {:.1f} MB of gradients measured at {}; exact reduction runs at "
                              "{:.2f} GB/s -> {}",
                              where, grad_elements * 4 / 1e6, list, gbps, candidates[best]);
  return choice;
}

}  // namespace tf::comm
