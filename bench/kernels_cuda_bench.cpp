// Throughput of the CUDA kernels (kernels/*.cu) at GPT-2 124M training shapes, against the
// device's measured copy bandwidth. Shapes: B = 16, T = 1024 (N = 16384 rows), C = 768, V = 50257
// padded to Vp = 50304, 124,475,904 parameters (padded vocabulary) for the optimizer. Every kernel
// runs with fp32 and bf16 storage (arg "bf16"); elementwise, LayerNorm forward and cross-entropy
// also with misaligned pointers (arg "scalar" = 1: what the 16-byte accesses gain).
//
// All kernels are memory-bound: bytes_per_second counts the compulsory traffic (inputs read once,
// outputs written once, read-modify-write twice; re-reads from cache not counted); "of_copy_bw" =
// that / the device-to-device cudaMemcpy bandwidth measured once (2 x bytes / time over 1 GiB,
// printed to stderr), a plain fraction shown with a "/s" suffix. Timing: CUDA events around each
// iteration (UseManualTime) after a few warm-up launches. Without a device every benchmark
// reports "no CUDA device" and is skipped.
//
// Run: build/bench/kernels_cuda_bench [--benchmark_filter=LayerNorm] [--benchmark_min_time=0.5s]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include "bench/cuda_bench_util.h"
#include "kernels/classifier.h"
#include "kernels/cuda_runtime.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/layernorm.h"
#include "kernels/optimizer.h"
#include "model/config.h"
#include "model/parameters.h"

namespace tf {
namespace {

using bench::Failed;
using bench::RandomDevice;
using bench::ReportBytes;
using bench::SkipWithoutDevice;
using bench::TimeLaunches;
using cuda::DeviceBuffer;
using cuda::DType;

constexpr int kB = 16, kT = 1024, kN = kB * kT, kC = 768;
constexpr int kV = 50257, kVp = 50304, kMaxT = 1024;
constexpr long kParams = 124'475'904;  // GPT-2 124M with the padded vocabulary

DType ArgDType(const benchmark::State& state) { return state.range(0) != 0 ? DType::kBF16 : DType::kF32; }
double ElemBytes(DType dt) { return static_cast<double>(cuda::DTypeSize(dt)); }

// Token ids: uniform over [0, V), or log-uniform (p(k) ~ 1/(k+1), a Zipf-like law: the most frequent
// token takes ~9% of the positions), which exercises encoder_backward's hot-token runs.
std::vector<int32_t> Tokens(size_t n, int V, bool zipf, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> v(n);
  for (auto& x : v) {
    const double k = zipf ? std::exp(u(rng) * std::log(V + 1.0)) - 1.0 : u(rng) * V;
    x = std::clamp(static_cast<int32_t>(k), 0, V - 1);
  }
  return v;
}

StatusOr<DeviceBuffer> UploadInts(const std::vector<int32_t>& v) {
  TF_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Allocate(v.size() * sizeof(int32_t)));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(buf.data(), v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return buf;
}

// ---- Encoder ------------------------------------------------------------------------------------

void BM_CudaEncoderForward(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  TF_BENCH_ASSIGN(wte, RandomDevice(size_t(kVp) * kC, dt, 0.02f, 1));
  TF_BENCH_ASSIGN(wpe, RandomDevice(size_t(kMaxT) * kC, dt, 0.01f, 2));
  TF_BENCH_ASSIGN(out, DeviceBuffer::Allocate(size_t(kN) * kC * cuda::DTypeSize(dt)));
  TF_BENCH_ASSIGN(inp, UploadInts(Tokens(kN, kV, false, 3)));
  TimeLaunches(state, [&] {
    return cuda::encoder_forward(out.data(), inp.as<int32_t>(), wte.data(), wpe.data(), kB, kT, kC, dt, nullptr);
  });
  // Reads N rows of wte, T rows of wpe and the ids; writes out.
  ReportBytes(state, ElemBytes(dt) * (2.0 * kN * kC + kT * kC) + 4.0 * kN);
}
BENCHMARK(BM_CudaEncoderForward)->ArgName("bf16")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Args: bf16, zipf (token distribution). Uses the caller-provided scratch, as a training step would.
void BM_CudaEncoderBackward(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  const bool zipf = state.range(1) != 0;
  const auto tokens = Tokens(kN, kV, zipf, 5);
  TF_BENCH_ASSIGN(dout, RandomDevice(size_t(kN) * kC, dt, 1.0f, 4));
  TF_BENCH_ASSIGN(dwte, RandomDevice(size_t(kVp) * kC, dt, 1e-3f, 6));
  TF_BENCH_ASSIGN(dwpe, RandomDevice(size_t(kMaxT) * kC, dt, 1e-3f, 7));
  TF_BENCH_ASSIGN(inp, UploadInts(tokens));
  auto scratch_bytes = cuda::encoder_backward_scratch_bytes(kB, kT);
  if (Failed(state, scratch_bytes.status())) return;
  TF_BENCH_ASSIGN(scratch, DeviceBuffer::Allocate(*scratch_bytes));
  TimeLaunches(state, [&] {
    return cuda::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.as<int32_t>(), kB, kT, kC, dt,
                                  scratch.data(), *scratch_bytes, nullptr);
  });
  const double distinct = static_cast<double>(std::set<int32_t>(tokens.begin(), tokens.end()).size());
  state.counters["distinct_tokens"] = distinct;
  // Reads dout and the ids; read-modify-writes one dwte row per distinct token and T rows of dwpe.
  ReportBytes(state, ElemBytes(dt) * (1.0 * kN * kC + 2.0 * distinct * kC + 2.0 * kT * kC) + 4.0 * kN);
}
BENCHMARK(BM_CudaEncoderBackward)
    ->ArgNames({"bf16", "zipf"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- Elementwise --------------------------------------------------------------------------------

// A pointer `shift` elements into buf (shift 1: not 16-byte aligned, so the kernels take their
// one-element-per-access path — the "scalar" arg of the benchmarks below, against the 16-byte one).
void* At(const DeviceBuffer& buf, DType dt, int shift) {
  return static_cast<char*>(buf.data()) + shift * cuda::DTypeSize(dt);
}

// Args: op (0 = GELU forward on N x 4C, 1 = GELU backward on N x 4C, 2 = residual add on N x C),
// bf16, scalar (1 = misaligned pointers: the V = 1 path).
void BM_CudaElementwise(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const int op = static_cast<int>(state.range(0));
  const DType dt = state.range(1) != 0 ? DType::kBF16 : DType::kF32;
  const int shift = static_cast<int>(state.range(2));
  const long n = (op == 2 ? 1L : 4L) * kN * kC;
  TF_BENCH_ASSIGN(a, RandomDevice(n + 1, dt, 1.0f, 40));
  TF_BENCH_ASSIGN(b, RandomDevice(n + 1, dt, 1.0f, 41));
  TF_BENCH_ASSIGN(out, DeviceBuffer::Allocate((n + 1) * cuda::DTypeSize(dt)));
  TimeLaunches(state, [&] {
    switch (op) {
      case 0: return cuda::gelu_forward(At(out, dt, shift), At(a, dt, shift), n, dt, nullptr);
      case 1: return cuda::gelu_backward(At(out, dt, shift), At(a, dt, shift), At(b, dt, shift), n, dt, nullptr);
      default: return cuda::residual_forward(At(out, dt, shift), At(a, dt, shift), At(b, dt, shift), n, dt, nullptr);
    }
  });
  ReportBytes(state, ElemBytes(dt) * n * (op == 0 ? 2.0 : 3.0));
}
BENCHMARK(BM_CudaElementwise)
    ->ArgNames({"op", "bf16", "scalar"})
    ->ArgsProduct({{0, 1, 2}, {1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- LayerNorm ----------------------------------------------------------------------------------

// Args: bf16, scalar (1 = input and output one element off alignment: the V = 1 path).
void BM_CudaLayerNormForward(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  const int shift = static_cast<int>(state.range(1));
  TF_BENCH_ASSIGN(inp, RandomDevice(size_t(kN) * kC + 1, dt, 1.0f, 8));
  TF_BENCH_ASSIGN(w, RandomDevice(kC, dt, 1.0f, 9));
  TF_BENCH_ASSIGN(b, RandomDevice(kC, dt, 0.1f, 10));
  TF_BENCH_ASSIGN(out, DeviceBuffer::Allocate((size_t(kN) * kC + 1) * cuda::DTypeSize(dt)));
  TF_BENCH_ASSIGN(stats, DeviceBuffer::Allocate(2 * size_t(kN) * sizeof(float)));
  TimeLaunches(state, [&] {
    return cuda::layernorm_forward(At(out, dt, shift), stats.as<float>(), stats.as<float>() + kN, At(inp, dt, shift),
                                   w.data(), b.data(), kN, kC, dt, nullptr);
  });
  ReportBytes(state, ElemBytes(dt) * (2.0 * kN * kC + 2.0 * kC) + 8.0 * kN);
}
BENCHMARK(BM_CudaLayerNormForward)
    ->ArgNames({"bf16", "scalar"})
    ->ArgsProduct({{0, 1}, {0}})
    ->Args({1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_CudaLayerNormBackward(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  TF_BENCH_ASSIGN(inp, RandomDevice(size_t(kN) * kC, dt, 1.0f, 11));
  TF_BENCH_ASSIGN(dout, RandomDevice(size_t(kN) * kC, dt, 1.0f, 12));
  TF_BENCH_ASSIGN(dinp, RandomDevice(size_t(kN) * kC, dt, 1.0f, 13));
  TF_BENCH_ASSIGN(w, RandomDevice(kC, dt, 1.0f, 14));
  TF_BENCH_ASSIGN(b, RandomDevice(kC, dt, 0.1f, 15));
  TF_BENCH_ASSIGN(dw, RandomDevice(kC, dt, 1.0f, 16));
  TF_BENCH_ASSIGN(db, RandomDevice(kC, dt, 1.0f, 17));
  TF_BENCH_ASSIGN(out, DeviceBuffer::Allocate(size_t(kN) * kC * cuda::DTypeSize(dt)));
  TF_BENCH_ASSIGN(stats, DeviceBuffer::Allocate(2 * size_t(kN) * sizeof(float)));
  const size_t scratch_bytes = cuda::layernorm_backward_scratch_bytes(kN, kC);
  TF_BENCH_ASSIGN(scratch, DeviceBuffer::Allocate(scratch_bytes));
  float* mean = stats.as<float>();
  float* rstd = mean + kN;
  if (Failed(state, cuda::layernorm_forward(out.data(), mean, rstd, inp.data(), w.data(), b.data(), kN, kC, dt,
                                            nullptr))) {
    return;
  }
  TimeLaunches(state, [&] {
    return cuda::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean, rstd,
                                    kN, kC, dt, scratch.as<float>(), scratch_bytes, nullptr);
  });
  // Reads dout, inp, weight, mean, rstd; read-modify-writes dinp, dweight, dbias.
  ReportBytes(state, ElemBytes(dt) * (4.0 * kN * kC + 5.0 * kC) + 8.0 * kN);
}
BENCHMARK(BM_CudaLayerNormBackward)->ArgName("bf16")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- Classifier ---------------------------------------------------------------------------------

// Args: bf16, grad (1 = loss and in-place gradient, the training step; 0 = loss only). With the
// gradient the logits are overwritten, so later iterations run on the previous gradient; the work
// does not depend on the values.
// Third arg: scalar (1 = logits one element off alignment: the V = 1 path).
void BM_CudaCrossEntropy(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  const bool with_grad = state.range(1) != 0;
  const int shift = static_cast<int>(state.range(2));
  TF_BENCH_ASSIGN(logits, RandomDevice(size_t(kN) * kVp + 1, dt, 3.0f, 18));
  TF_BENCH_ASSIGN(targets, UploadInts(Tokens(kN, kV, false, 19)));
  TF_BENCH_ASSIGN(losses, DeviceBuffer::Allocate(size_t(kN) * sizeof(float)));
  TimeLaunches(state, [&] {
    return cuda::crossentropy_forward_backward(At(logits, dt, shift), losses.as<float>(), targets.as<int32_t>(), kN,
                                               kV, kVp, with_grad ? 1.0f / kN : 0.0f, dt, nullptr);
  });
  ReportBytes(state, ElemBytes(dt) * (1.0 * kN * kV + (with_grad ? 1.0 * kN * kVp : 0.0)) + 8.0 * kN);
}
BENCHMARK(BM_CudaCrossEntropy)
    ->ArgNames({"bf16", "grad", "scalar"})
    ->ArgsProduct({{0, 1}, {1, 0}, {0}})
    ->Args({1, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- Optimizer (all 124M parameters) ------------------------------------------------------------

void BM_CudaSumSquares(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  TF_BENCH_ASSIGN(g, RandomDevice(kParams, dt, 1e-3f, 20));
  const size_t scratch_bytes = cuda::sum_squares_scratch_bytes(kParams);
  TF_BENCH_ASSIGN(scratch, DeviceBuffer::Allocate(scratch_bytes));
  TF_BENCH_ASSIGN(result, DeviceBuffer::Allocate(sizeof(double)));
  TimeLaunches(state, [&] {
    return cuda::sum_squares(g.data(), kParams, dt, result.as<double>(), scratch.data(), scratch_bytes, nullptr);
  });
  ReportBytes(state, ElemBytes(dt) * kParams);
}
BENCHMARK(BM_CudaSumSquares)->ArgName("bf16")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

// fp32: gradients fp32, params_out aliases the master (no copy). bf16 (mixed precision): gradients
// bf16, params_out is the bf16 working copy.
void BM_CudaAdamW(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  const bool bf16 = dt == DType::kBF16;
  TF_BENCH_ASSIGN(master, RandomDevice(kParams, DType::kF32, 0.02f, 21));
  TF_BENCH_ASSIGN(m, RandomDevice(kParams, DType::kF32, 1e-3f, 22));
  TF_BENCH_ASSIGN(v, DeviceBuffer::Allocate(kParams * sizeof(float)));
  TF_BENCH_ASSIGN(g, RandomDevice(kParams, dt, 1e-3f, 24));
  TF_BENCH_ASSIGN(params, DeviceBuffer::Allocate(bf16 ? kParams * sizeof(uint16_t) : 0));
  // Second moments start at zero (they must be non-negative).
  if (cudaMemset(v.data(), 0, kParams * sizeof(float)) != cudaSuccess) {
    state.SkipWithError("cudaMemset failed");
    return;
  }
  const math::AdamWParams h{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f};  // step 1's bias corrections
  TimeLaunches(state, [&] {
    return cuda::adamw_step(master.as<float>(), m.as<float>(), v.as<float>(), g.data(),
                            bf16 ? params.data() : master.data(), kParams, 1.0f, h, dt, dt, nullptr);
  });
  // Reads the gradients; read-modify-writes master, m, v; writes the bf16 copy.
  ReportBytes(state, kParams * (ElemBytes(dt) + 6.0 * sizeof(float) + (bf16 ? 2.0 : 0.0)));
}
BENCHMARK(BM_CudaAdamW)->ArgName("bf16")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The model's optimizer step as GPT2Cuda runs it: the whole flat buffer in one launch over GPT-2
// 124M's decay runs, the clip factor read from the device sum of squares (adamw_step_ranges), against
// the same update issued per tensor (148 launches, the clip factor a host float): what one launch
// saves in launch gaps. Same bytes as BM_CudaAdamW.
void BM_CudaAdamWModelStep(benchmark::State& state) {
  if (SkipWithoutDevice(state)) return;
  const DType dt = ArgDType(state);
  const bool bf16 = dt == DType::kBF16;
  const bool per_tensor = state.range(1) != 0;
  const GPT2Config config{.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = kV, .block_size = kMaxT,
                          .padded_vocab_size = kVp};
  const ParameterLayout layout(config);
  const long n = static_cast<long>(layout.total());
  TF_BENCH_ASSIGN(master, RandomDevice(n, DType::kF32, 0.02f, 31));
  TF_BENCH_ASSIGN(m, RandomDevice(n, DType::kF32, 1e-3f, 32));
  TF_BENCH_ASSIGN(v, DeviceBuffer::Allocate(n * sizeof(float)));
  TF_BENCH_ASSIGN(g, RandomDevice(n, dt, 1e-3f, 34));
  TF_BENCH_ASSIGN(params, DeviceBuffer::Allocate(bf16 ? n * sizeof(uint16_t) : 0));
  TF_BENCH_ASSIGN(sum, DeviceBuffer::Allocate(sizeof(double)));
  const std::vector<DecayRange> runs = DecayRanges(layout);
  std::vector<uint8_t> table(runs.size() * 9);
  for (size_t r = 0; r < runs.size(); ++r) {
    std::memcpy(table.data() + r * 8, &runs[r].end, 8);
    table[runs.size() * 8 + r] = runs[r].decay ? 1 : 0;
  }
  TF_BENCH_ASSIGN(d_table, DeviceBuffer::Allocate(table.size()));
  const double sum_sq = 4.0;  // norm 2 > clip 1: the clip factor is applied
  if (cudaMemset(v.data(), 0, n * sizeof(float)) != cudaSuccess ||
      cudaMemcpy(d_table.data(), table.data(), table.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(sum.data(), &sum_sq, sizeof(double), cudaMemcpyHostToDevice) != cudaSuccess) {
    state.SkipWithError("cudaMemset/cudaMemcpy failed");
    return;
  }
  const math::AdamWParams h{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f};
  const size_t es = cuda::DTypeSize(dt);
  void* out_base = bf16 ? params.data() : master.data();
  TimeLaunches(state, [&]() -> Status {
    if (!per_tensor) {
      return cuda::adamw_step_ranges(master.as<float>(), m.as<float>(), v.as<float>(), g.data(), out_base, n,
                                     d_table.as<int64_t>(), d_table.as<uint8_t>() + runs.size() * 8,
                                     static_cast<int>(runs.size()), sum.as<double>(), 1.0, h, dt, dt, nullptr);
    }
    const float scale = static_cast<float>(1.0 / (2.0 + 1e-6));
    for (const ParamTensor& t : layout.tensors()) {
      math::AdamWParams ht = h;
      ht.weight_decay = t.weight_decay ? h.weight_decay : 0.0f;
      void* out = bf16 ? static_cast<void*>(static_cast<char*>(params.data()) + t.offset * 2)
                       : static_cast<void*>(master.as<float>() + t.offset);
      TF_RETURN_IF_ERROR(cuda::adamw_step(master.as<float>() + t.offset, m.as<float>() + t.offset,
                                          v.as<float>() + t.offset, static_cast<char*>(g.data()) + t.offset * es, out,
                                          t.numel, scale, ht, dt, dt, nullptr));
    }
    return Status::OK();
  });
  ReportBytes(state, n * (ElemBytes(dt) + 6.0 * sizeof(float) + (bf16 ? 2.0 : 0.0)));
}
BENCHMARK(BM_CudaAdamWModelStep)
    ->ArgNames({"bf16", "per_tensor"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tf
