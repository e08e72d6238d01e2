#include "engine/cli/bench.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include "base/format.h"
#include "engine/cli/command.h"
#include "engine/monitoring.h"
#include "engine/trainer.h"
#include "kernels/matmul.h"
#include "kernels/random.h"
#include "model/gpt2.h"
#include "model/step_work.h"
#include "monitor/system_metrics.h"
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
      .print_progress = false, .write_outputs = false, .distributed = true, .evaluate = false, .monitor = false};
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
  r.rank = trainer->topology().rank;
  r.world = trainer->topology().world;
  TF_ASSIGN_OR_RETURN(r.peak_rss_bytes, trainer->GatherOverRanks(static_cast<double>(monitor::PeakResidentBytes())));
  r.state_bytes = trainer->state_bytes_line();
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

// `trainflow bench`: the flags, the configs as `train` reads them, and the printed result.
namespace {

struct BenchArgs {
  BenchOptions options;
  std::string model_path, train_path;
  bool no_fuse_residual = false, nondeterministic = false;
};

int CmdBench(const BenchArgs& a, const std::vector<std::string>& extras) {
  GPT2Config config;
  TrainConfig tc;
  Status s = LoadConfigs(a.model_path, a.train_path, extras, [&](nlohmann::json* t) {
    if (a.no_fuse_residual) (*t)["fuse_residual"] = false;
    if (a.nondeterministic) (*t)["deterministic"] = false;
  }, &config, &tc);
  if (!s.ok()) return Fail(s);
  const BenchOptions& bopt = a.options;
  auto r = RunBench(config, tc, bopt);
  if (!r.ok()) return Fail(r.status());
  if (r->rank != 0) return 0;
  std::string where = r->device == "cuda" ? "device=cuda" : fmt::format("threads={}", omp_get_max_threads());
  if (r->world > 1) where += fmt::format(" ranks={} zero_stage={}", r->world, tc.zero_stage);
  fmt::print("bench: {} ({} params) B={} T={} {}: median {:.2f} ms/step (min {:.2f}, max {:.2f}) "
             "over {} steps after {} warm-up, {:.0f} tokens/s, {:.1f} GFLOP/s (6*params*tokens)\n",
             a.model_path, FormatParameterCount(NumParameters(config)), tc.batch_size, tc.seq_len, where, r->median_ms,
             r->min_ms, r->max_ms, bopt.steps, bopt.warmup, r->tokens_per_s, r->gflops);
  if (r->gemm_peak_gflops > 0) {
    fmt::print("bench: SGEMM ceiling {:.1f} GFLOP/s ({} 2048^3, median); training step at {:.1f}% of it\n",
               r->gemm_peak_gflops, cpu::gemm_engine_name(), 100.0 * r->gflops / r->gemm_peak_gflops);
  }
  if (r->device == "cuda") {
    fmt::print("bench: {} on CUDA ({}): MFU {:.1f}% (6*params), {:.1f}% with attention FLOPs (llm.c's count); "
               "device memory {:.2f} GB planned, {:.2f} GB in use\n",
               tc.dtype, r->cuda_options, 100.0 * r->mfu, 100.0 * r->mfu_with_attention, r->planned_gb,
               r->device_used_gb);
  }
  if (!r->profile.empty()) {
    double total = 0;
    for (const auto& row : r->profile) total += row.ms_per_step;
    fmt::print("bench: GPU time per step by piece of work ({} profiled steps; {:.2f} ms in all); roofline = the "
               "piece's least time at {:.0f} TFLOP/s and the measured {:.0f} GB/s copy bandwidth:\n",
               bopt.profile_steps, total, r->peak_tflops, r->copy_gbs);
    for (const auto& row : r->profile) {
      const std::string roof = row.roofline_ms < 0 ? std::string("  roofline -")
                                                   : fmt::format("  roofline {:8.3f} ms, at {:5.1f}%", row.roofline_ms,
                                                                 100.0 * row.roofline_ms / row.ms_per_step);
      fmt::print("PROFILE {:<18} {:8.3f} ms {:5.1f}%  {:6.1f} calls{}\n", row.name, row.ms_per_step,
                 100.0 * row.ms_per_step / total, row.calls_per_step, roof);
    }
    fmt::print("bench: roofline step {:.2f} ms (every piece at its ceiling): MFU {:.1f}% at most with this "
               "structure of the step; measured {:.2f} ms\n",
               r->roofline_step_ms, 100.0 * r->roofline_mfu, r->median_ms);
  }
  {
    std::string peaks;
    double most = 0;
    for (size_t i = 0; i < r->peak_rss_bytes.size(); ++i) {
      peaks += fmt::format("{}{}", i == 0 ? "" : ", ", FormatBytes(static_cast<int64_t>(r->peak_rss_bytes[i])));
      most = std::max(most, r->peak_rss_bytes[i]);
    }
    fmt::print("bench: state per rank (zero_stage {}): {}\n", tc.zero_stage, r->state_bytes);
    fmt::print("bench: peak resident memory by rank: {}\n", peaks);
    r->peak_rss_max = most;
  }
  // Only what was measured: MFU and device memory exist on a GPU, the GEMM ceiling with --gemm-peak.
  std::string result = fmt::format("BENCH_RESULT ms_per_step={:.3f} tokens_per_s={:.1f} gflops={:.2f}", r->median_ms,
                                   r->tokens_per_s, r->gflops);
  result += fmt::format(" peak_rss_bytes={:.0f}", r->peak_rss_max);
  if (r->gemm_peak_gflops > 0) result += fmt::format(" gemm_peak_gflops={:.2f}", r->gemm_peak_gflops);
  if (r->device == "cuda") {
    result += fmt::format(" mfu={:.4f} mfu_with_attention={:.4f} device_used_gb={:.2f}", r->mfu,
                          r->mfu_with_attention, r->device_used_gb);
  }
  fmt::print("{}\n", result);
  return 0;
}

}  // namespace

Command AddBenchCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Time the training step `train` runs (median of N, warm-up excluded)");
  auto a = std::make_shared<BenchArgs>();
  BenchOptions& bopt = a->options;
  cmd->add_option("--model", a->model_path, "Model config")->required();
  cmd->add_option("--train", a->train_path, "Training config (batch shape, device, model options)");
  cmd->add_option("--steps", bopt.steps, "Timed steps")->check(WholeNumber(1, 1 << 20))->capture_default_str();
  cmd->add_option("--warmup", bopt.warmup, "Untimed warm-up steps")->check(WholeNumber(0, 1 << 20))->capture_default_str();
  cmd->add_option("--peak-tflops", bopt.peak_tflops, "CUDA peak for MFU (default: the GPU's dense datasheet figure, docs/monitoring.md; unknown GPUs: H100's bf16 989, fp32 67)")
      ->check(FiniteRange(0, 1e6));
  cmd->add_flag("--gemm-peak", bopt.gemm_peak, "Also measure the SGEMM ceiling (2048^3, the build's GEMM engine)");
  cmd->add_flag("--no-fuse-residual", a->no_fuse_residual, "CUDA: as --fuse-residual false");
  cmd->add_flag("--nondeterministic-attention", a->nondeterministic, "CUDA, attention cudnn: as --deterministic false");
  cmd->add_option("--profile-steps", bopt.profile_steps,
                  "CUDA: after the timed steps, N more with the GPU time of each piece of work (table)")
      ->check(WholeNumber(0, 100))
      ->capture_default_str();
  cmd->allow_extras();
  cmd->footer("Any training config key can be given as --key value, as for train (`trainflow train --help`, "
              "docs/configs.md); those that shape the step:\n" +
              TrainKeysHelp({"batch_size", "seq_len", "grad_accum_steps", "zero_stage", "shard_group_size", "threads",
                             "device", "dtype", "attention", "recompute", "gelu_fusion", "fuse_residual",
                             "deterministic"}));
  return {[cmd] { return cmd->parsed(); }, [cmd, a] { return CmdBench(*a, cmd->remaining()); }};
}

}  // namespace tf
