#include "engine/cli/bench.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>
#include <omp.h>

#include "engine/monitoring.h"
#include "engine/trainer.h"
#include "kernels/matmul.h"
#include "kernels/random.h"
#include "model/gpt2.h"
#include "model/step_work.h"
#if defined(TF_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda_profiler.h"
#include "model/gpt2_cuda.h"
#endif

namespace tf {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#if defined(TF_WITH_CUDA)
// The CUDA-only parts of the report: memory, options, and the per-piece profile with its roofline.
Status CudaReport(Trainer& trainer, const GPT2Config& config, const TrainConfig& train, const BenchOptions& o,
                  BenchResult* r) {
  GPT2Cuda* model = trainer.backend().cuda_model();
  const cuda::DType dt = model->dtype();
  const GPT2CudaOptions& mo = model->options();
  // The device's datasheet peak (engine/monitoring.h), else H100/H200's.
  const double peak = o.peak_tflops > 0 ? o.peak_tflops
                                        : PeakTflops(train, trainer.backend().Describe())
                                              .value_or(dt == cuda::DType::kBF16 ? 989.0 : 67.0);
  if (o.profile_steps > 0) {
    // Extra steps with every piece of GPU work timed (after the timed steps: events between kernels
    // must not touch the figures above).
    TF_ASSIGN_OR_RETURN(std::unique_ptr<cuda::RangeProfiler> profiler,
                        cuda::RangeProfiler::Create(model->compute_stream(), 8192));
    model->set_profiler(profiler.get());
    std::vector<cuda::RangeProfiler::Total> sum;
    for (int s = 0; s < o.profile_steps; ++s) {
      TF_RETURN_IF_ERROR(trainer.Step().status());
      TF_ASSIGN_OR_RETURN(std::vector<cuda::RangeProfiler::Total> totals, profiler->Collect());
      for (const auto& t : totals) {
        auto it = std::find_if(sum.begin(), sum.end(), [&](const auto& x) { return x.name == t.name; });
        if (it == sum.end()) {
          sum.push_back(t);
        } else {
          it->ms += t.ms;
          it->count += t.count;
        }
      }
    }
    model->set_profiler(nullptr);
    // The roofline of each piece: its work (model/step_work.h) at the peak FLOP rate and the copy
    // bandwidth measured now.
    TF_ASSIGN_OR_RETURN(const double bandwidth, cuda::MeasureCopyBandwidth());
    const std::vector<PieceWork> work =
        GPT2StepWork(config, {.batch = train.batch_size,
                              .seq = train.seq_len,
                              .elem_bytes = static_cast<int>(cuda::DTypeSize(dt)),
                              .gemm_attention = mo.attention == GPT2CudaOptions::Attention::kGemm,
                              .recompute = mo.recompute,
                              .gelu_fusion = mo.GeluFusion(dt),
                              .fuse_residual = mo.fuse_residual});
    r->copy_gbs = bandwidth / 1e9;
    for (const PieceWork& p : work) r->roofline_step_ms += RooflineMs(p, peak * 1e12, bandwidth);
    for (const auto& t : sum) {
      auto it = std::find_if(work.begin(), work.end(), [&](const PieceWork& p) { return p.name == t.name; });
      const bool modelled = it != work.end() && (it->flops > 0 || it->bytes > 0);  // (not host copies)
      r->profile.push_back({t.name, t.ms / o.profile_steps, static_cast<double>(t.count) / o.profile_steps,
                            modelled ? RooflineMs(*it, peak * 1e12, bandwidth) : -1.0});
    }
    std::sort(r->profile.begin(), r->profile.end(),
              [](const auto& a, const auto& b) { return a.ms_per_step > b.ms_per_step; });
  }
  r->mfu = r->gflops / (peak * 1e3);
  r->peak_tflops = peak;
  const double tokens = static_cast<double>(train.tokens_per_step());
  const double attention_flops = 6.0 * config.n_layer * config.n_embd * static_cast<double>(train.seq_len) * tokens;
  r->mfu_with_attention = (r->gflops + attention_flops / (r->median_ms / 1000.0) / 1e9) / (peak * 1e3);
  if (r->roofline_step_ms > 0) r->roofline_mfu = r->mfu * r->median_ms / r->roofline_step_ms;
  r->planned_gb = static_cast<double>(model->memory().total) / 1e9;
  r->cuda_options = fmt::format("attention {}{}, recompute {}, gelu fusion {}, residual {}", AttentionName(mo.attention),
                                mo.attention == GPT2CudaOptions::Attention::kCudnn && !mo.deterministic_attention
                                    ? " (nondeterministic backward)"
                                    : "",
                                mo.recompute, mo.GeluFusion(dt), mo.fuse_residual ? "fused" : "unfused");
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    r->device_used_gb = static_cast<double>(total_bytes - free_bytes) / 1e9;
  }
  return Status::OK();
}
#endif

}  // namespace

double MeasureGemmPeak(int n, int k, int m, int reps) {
  // Through the build's GEMM engine (cpu::matmul_forward), the same path the model uses.
  std::vector<float> a(static_cast<size_t>(n) * k), b(static_cast<size_t>(m) * k), c(static_cast<size_t>(n) * m);
  Rng rng(3);
  for (float& x : a) x = static_cast<float>(rng.Uniform() - 0.5);
  for (float& x : b) x = static_cast<float>(rng.Uniform() - 0.5);
  std::vector<double> rates;
  for (int r = 0; r < reps + 2; ++r) {
    const auto t0 = Clock::now();
    cpu::matmul_forward(c.data(), a.data(), b.data(), nullptr, n, k, m);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r >= 2) rates.push_back(2.0 * n * k * m / s / 1e9);  // first two are warm-up
  }
  return Median(rates);
}

StatusOr<BenchResult> RunBench(const GPT2Config& config, TrainConfig train, const BenchOptions& o) {
  if (o.steps <= 0 || o.warmup < 0) return Status::InvalidArgument("bench: --steps must be > 0 and --warmup >= 0");
  train.max_steps = o.warmup + o.steps + o.profile_steps;
  train.warmup_steps = 0;
  train.compression = "none";
  train.resume_state.clear();
  train.init_from.clear();
  TF_RETURN_IF_ERROR(ValidateRun(config, train));
  Trainer::Options options{
      .print_progress = false, .write_outputs = false, .distributed = false, .evaluate = false, .monitor = false};
  // Synthetic data: uniform random tokens, enough for every micro-batch to read fresh ones.
  const size_t n = static_cast<size_t>(train.tokens_per_step()) * static_cast<size_t>(train.max_steps) + 1;
  options.train_tokens.resize(std::min<size_t>(n, size_t{1} << 26));
  Rng rng(7);
  for (uint16_t& t : options.train_tokens) t = static_cast<uint16_t>(rng.Below(static_cast<uint64_t>(config.vocab_size)));
  TF_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(config, train, std::move(options)));

  std::vector<double> ms;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const auto t0 = Clock::now();
    TF_RETURN_IF_ERROR(trainer->Step().status());  // returns after the step's results are on the host
    const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (s >= o.warmup) ms.push_back(dt);
  }
  BenchResult r;
  r.device = trainer->backend().cuda_model() != nullptr ? "cuda" : "cpu";
  r.describe = trainer->backend().Describe();
  r.median_ms = Median(ms);
  r.min_ms = *std::min_element(ms.begin(), ms.end());
  r.max_ms = *std::max_element(ms.begin(), ms.end());
  const double tokens = static_cast<double>(train.tokens_per_step());
  r.tokens_per_s = tokens / (r.median_ms / 1000.0);
  r.gflops = 6.0 * static_cast<double>(NumParameters(config)) * tokens / (r.median_ms / 1000.0) / 1e9;
#if defined(TF_WITH_CUDA)
  if (r.device == "cuda") TF_RETURN_IF_ERROR(CudaReport(*trainer, config, train, o, &r));
#endif
  if (o.gemm_peak && r.device == "cpu") r.gemm_peak_gflops = MeasureGemmPeak(2048, 2048, 2048, 7);
  return r;
}

}  // namespace tf
