#if defined(TF_WITH_CUDA)
#include "model/gpt2_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "base/float16.h"
#include "kernels/flash_attention.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"

namespace tf {
namespace {

using cuda::DType;

}  // namespace

StatusOr<GPT2CudaOptions::Attention> ParseAttention(const std::string& name) {
  using A = GPT2CudaOptions::Attention;
  for (A a : {A::kFlash, A::kFlashSimt, A::kGemm, A::kCudnn}) {
    if (name == AttentionName(a)) return a;
  }
  return Status::InvalidArgument("attention must be \"flash\", \"flash_simt\", \"gemm\" or \"cudnn\", got '{}'",
                                 name);
}

const char* AttentionName(GPT2CudaOptions::Attention attention) {
  switch (attention) {
    case GPT2CudaOptions::Attention::kFlash: return "flash";
    case GPT2CudaOptions::Attention::kFlashSimt: return "flash_simt";
    case GPT2CudaOptions::Attention::kGemm: return "gemm";
    case GPT2CudaOptions::Attention::kCudnn: return "cudnn";
  }
  return "?";
}

GPT2Cuda::GPT2Cuda(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype, const Options& options)
    : config_(config),
      layout_(config),
      max_batch_(max_batch),
      max_seq_(max_seq),
      dtype_(dtype),
      options_(options) {}

GPT2Cuda::~GPT2Cuda() {
  cudnn_.reset();  // before the streams it was last given
  blas_.reset();
  if (backward_done_ != nullptr) cudaEventDestroy(backward_done_);
  for (cudaStream_t s : {stream_, comm_stream_, copy_stream_}) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
}

Status GPT2Cuda::ValidateOptions(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype,
                                 const Options& options) {
  TF_RETURN_IF_ERROR(ValidateConfig(config));
  if (max_batch <= 0 || max_seq <= 0 || max_seq > config.block_size) {
    return Status::InvalidArgument("batch {} / sequence {} invalid for block_size {}", max_batch, max_seq,
                                   config.block_size);
  }
  if (options.recompute < 0 || options.recompute > 2) {
    return Status::InvalidArgument("recompute must be 0, 1 or 2, got {}", options.recompute);
  }
  if (options.gelu_fusion < -1 || options.gelu_fusion > 2) {
    return Status::InvalidArgument("gelu_fusion must be -1 (auto), 0, 1 or 2, got {}", options.gelu_fusion);
  }
  if (options.attention == Options::Attention::kCudnn) {
    if (dtype != cuda::DType::kBF16) {
      return Status::InvalidArgument("cuDNN attention runs in bf16 only (use dtype bf16, or attention \"flash\")");
    }
    if (config.head_size() % 8 != 0 || config.head_size() > 128) {
      return Status::InvalidArgument("cuDNN attention needs a head size that is a multiple of 8 and at most 128, "
                                     "this model has {}",
                                     config.head_size());
    }
  }
  if (options.attention != Options::Attention::kGemm && config.head_size() > 128) {
    return Status::InvalidArgument("flash attention supports head sizes up to 128, this model has {} "
                                   "(use the GEMM attention)",
                                   config.head_size());
  }
  return Status::OK();
}

GPT2Cuda::Plan GPT2Cuda::MakePlan(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype,
                                  const Options& options, size_t encoder_scratch, size_t attention_scratch) {
  const ParameterLayout layout(config);
  const int64_t P = layout.total();
  const int64_t L = config.n_layer, C = config.n_embd, NH = config.n_head, Vp = config.padded_vocab_size;
  const int64_t B = max_batch, T = max_seq, N = B * T;
  const bool flash = options.attention != Options::Attention::kGemm;
  const size_t es = cuda::DTypeSize(dtype);
  Plan p{};
  // Offsets in elements, each region rounded to 64 elements (128-byte alignment in bf16).
  int64_t off = 0;
  auto take = [&](int64_t n) {
    const int64_t o = off;
    off += (n + 63) / 64 * 64;
    return o;
  };
  p.ln_stride = options.recompute >= 2 ? 0 : N * C;
  p.fch_gelu_stride = options.recompute >= 1 ? 0 : N * 4 * C;
  p.a.encoded = take(N * C);
  p.a.ln1 = take(options.recompute >= 2 ? N * C : L * N * C);
  p.a.qkv = take(L * N * 3 * C);
  p.a.atty = take(L * N * C);
  p.a.att = flash ? -1 : take(L * B * NH * T * T);
  p.a.residual2 = take(L * N * C);
  p.a.ln2 = take(options.recompute >= 2 ? N * C : L * N * C);
  p.a.fch = take(L * N * 4 * C);
  p.a.fch_gelu = take(options.recompute >= 1 ? N * 4 * C : L * N * 4 * C);
  p.a.residual3 = take(L * N * C);
  p.a.lnf = take(N * C);
  p.a.logits = take(N * Vp);
  p.a.forward_end = off;
  p.a.dresidual = take(N * C);
  p.a.dln = take(N * C);
  p.a.datty = take(N * C);
  p.a.dqkv = take(N * 3 * C);
  p.a.dfch = take(N * 4 * C);
  p.a.total = off;

  off = 0;
  p.s.ln1_mean = take(L * N);
  p.s.ln1_rstd = take(L * N);
  p.s.ln2_mean = take(L * N);
  p.s.ln2_rstd = take(L * N);
  p.s.lnf_mean = take(N);
  p.s.lnf_rstd = take(N);
  p.s.lse = flash ? take(L * LseStride(B, NH, T)) : -1;
  p.s.losses = take(N);
  p.s.total = off;

  // One scratch area, sized for the largest user (each kernel uses it only during its call).
  const int b = static_cast<int>(B), t = static_cast<int>(T), c = static_cast<int>(C), nh = static_cast<int>(NH);
  size_t need = std::max(encoder_scratch, attention_scratch);
  need = std::max(need, cuda::layernorm_backward_scratch_bytes(static_cast<int>(N), c));
  need = std::max(need, flash ? cuda::flash_attention_backward_scratch_bytes(b, t, nh)
                              : cuda::attention_scratch_bytes(b, t, c, nh, dtype));
  need = std::max(need, static_cast<size_t>(cuda::matmul_dbias_scratch_floats(static_cast<int>(N), 4 * c)) * 4);
  need = std::max(need, cuda::sum_squares_scratch_bytes(P));
  p.scratch_bytes = (need + 255) / 256 * 256;

  GPT2CudaMemory& m = p.memory;
  m.params = static_cast<size_t>(P) * es;
  m.grads = static_cast<size_t>(P) * es;
  m.master = dtype == DType::kF32 ? 0 : static_cast<size_t>(P) * 4;
  m.moments = 2 * static_cast<size_t>(P) * 4;
  m.activations = static_cast<size_t>(p.a.forward_end) * es;
  m.backward = static_cast<size_t>(p.a.total - p.a.forward_end) * es;
  m.stats = static_cast<size_t>(p.s.total) * 4;
  m.scratch = p.scratch_bytes;
  m.other = 2 * static_cast<size_t>(N) * sizeof(int32_t) + 2 * sizeof(double)  // tokens, norm, loss sum
            + DecayRanges(layout).size() * (sizeof(int64_t) + 1);            // AdamW's run table
  m.buffers = m.params + m.grads + m.master + m.moments + m.activations + m.backward + m.stats + m.scratch + m.other;
  m.cublas_workspace = cuda::CublasContext::kWorkspaceBytes;
  m.total = m.buffers + m.cublas_workspace;
  return p;
}

size_t GPT2Cuda::EstimateCudnnWorkspace(const GPT2Config& config, int max_batch, int max_seq) {
  // The deterministic backward's dS (per batch and head (ceil(T/64)*64) x (ceil(T/128)*128) bf16, as
  // cuDNN 9.19's engine reports) plus its fp32 row sums D, with 1 MiB of slack
  // (kernels/cudnn_attention.h).
  const size_t bnh = static_cast<size_t>(max_batch) * static_cast<size_t>(config.n_head);
  const size_t t = static_cast<size_t>(max_seq);
  const size_t rows = (t + 63) / 64 * 64, cols = (t + 127) / 128 * 128;
  return bnh * rows * cols * 2 + bnh * t * 4 + (size_t{1} << 20);
}

StatusOr<GPT2CudaMemory> GPT2Cuda::EstimateMemory(const GPT2Config& config, int max_batch, int max_seq,
                                                  cuda::DType dtype, const Options& options) {
  TF_RETURN_IF_ERROR(ValidateOptions(config, max_batch, max_seq, dtype, options));
  const size_t n = static_cast<size_t>(max_batch) * static_cast<size_t>(max_seq);
  // Without a device cub's sort cannot be asked for its temporary storage: bound it by the three
  // int32 arrays, cub's two alternate key/value buffers and 8 MiB of histograms (a few KiB in practice).
  size_t encoder = 3 * ((n * 4 + 255) / 256 * 256) + 2 * n * 4 + (size_t{8} << 20);
  if (cuda::DeviceCount() > 0) {
    TF_ASSIGN_OR_RETURN(encoder, cuda::encoder_backward_scratch_bytes(max_batch, max_seq));
  }
  size_t attention = 0;
  if (options.attention == Options::Attention::kCudnn) {
    attention = EstimateCudnnWorkspace(config, max_batch, max_seq);
    // With a device and cuDNN, ask cuDNN itself (as Create() will).
    if (cuda::DeviceCount() > 0) {
      if (auto cudnn = cuda::CudnnAttention::Create({.deterministic = options.deterministic_attention});
          cudnn.ok()) {
        using Dir = cuda::CudnnAttention::Direction;
        auto fwd = (*cudnn)->WorkspaceBytes(Dir::kForward, max_batch, max_seq, config.n_embd, config.n_head);
        auto bwd = (*cudnn)->WorkspaceBytes(Dir::kBackward, max_batch, max_seq, config.n_embd, config.n_head);
        if (fwd.ok() && bwd.ok()) attention = std::max(*fwd, *bwd);
      }
    }
  }
  return MakePlan(config, max_batch, max_seq, dtype, options, encoder, attention).memory;
}

StatusOr<std::unique_ptr<GPT2Cuda>> GPT2Cuda::Create(const GPT2Config& config, int max_batch, int max_seq,
                                                     cuda::DType dtype, int device) {
  return Create(config, max_batch, max_seq, dtype, Options{}, device);
}

StatusOr<std::unique_ptr<GPT2Cuda>> GPT2Cuda::Create(const GPT2Config& config, int max_batch, int max_seq,
                                                     cuda::DType dtype, const Options& options, int device) {
  TF_RETURN_IF_ERROR(ValidateOptions(config, max_batch, max_seq, dtype, options));
  if (device < 0 || cuda::DeviceCount() <= device) {
    return Status::InvalidArgument("CUDA device {} requested but {} visible", device, cuda::DeviceCount());
  }
  TF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<GPT2Cuda> m(new GPT2Cuda(config, max_batch, max_seq, dtype, options));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking));
  // The communication stream gets the highest priority, so that gradient reductions issued while
  // backward is still running are scheduled ahead of the compute kernels.
  int least = 0, greatest = 0;
  TF_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&m->comm_stream_, cudaStreamNonBlocking, greatest));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m->copy_stream_, cudaStreamNonBlocking));
  TF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m->backward_done_, cudaEventDisableTiming));
  TF_ASSIGN_OR_RETURN(cuda::CublasContext ctx, cuda::CublasContext::Create(m->stream_));
  m->blas_ = std::make_unique<cuda::CublasContext>(std::move(ctx));
  if (options.attention == Options::Attention::kCudnn) {
    auto cudnn = cuda::CudnnAttention::Create({.deterministic = options.deterministic_attention});
    if (!cudnn.ok()) return cudnn.status().WithContext("attention \"cudnn\"");
    m->cudnn_ = std::move(cudnn).value();
  }
  TF_RETURN_IF_ERROR(m->Allocate());
  return m;
}

Status GPT2Cuda::Allocate() {
  TF_ASSIGN_OR_RETURN(const size_t encoder, cuda::encoder_backward_scratch_bytes(max_batch_, max_seq_));
  size_t attention = 0;
  if (cudnn_) {
    // Builds (and caches) cuDNN's plans for the planned shape, the only one it runs (UseCudnn).
    using Dir = cuda::CudnnAttention::Direction;
    const int C = config_.n_embd, NH = config_.n_head;
    TF_ASSIGN_OR_RETURN(const size_t fwd, cudnn_->WorkspaceBytes(Dir::kForward, max_batch_, max_seq_, C, NH));
    TF_ASSIGN_OR_RETURN(const size_t bwd, cudnn_->WorkspaceBytes(Dir::kBackward, max_batch_, max_seq_, C, NH));
    attention = std::max(fwd, bwd);
  }
  plan_ = MakePlan(config_, max_batch_, max_seq_, dtype_, options_, encoder, attention);
  const GPT2CudaMemory& m = plan_.memory;
  // A plan that cannot fit is a clear error naming what to change, not a cudaMalloc failure halfway.
  size_t free_bytes = 0, total_bytes = 0;
  TF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (m.total > free_bytes) {
    std::string hint = options_.recompute < 2 ? fmt::format("recompute {} (now {})", options_.recompute + 1,
                                                            options_.recompute)
                                              : std::string("a smaller batch_size");
    if (options_.attention == Options::Attention::kGemm) hint += ", attention \"flash\" (no T x T probabilities)";
    return Status::InvalidArgument(
        "the model needs {:.2f} GB of device memory at batch {} x {} (state {:.2f}, activations {:.2f}, backward "
        "buffers {:.2f}, other {:.2f}) but {:.2f} GB of the device's {:.2f} GB are free: lower batch_size (use "
        "grad_accum_steps for the same tokens per step) or try {}",
        m.total / 1e9, max_batch_, max_seq_, (m.params + m.grads + m.master + m.moments) / 1e9,
        (m.activations + m.stats) / 1e9, m.backward / 1e9, (m.scratch + m.other + m.cublas_workspace) / 1e9,
        free_bytes / 1e9, total_bytes / 1e9, hint);
  }
  const int64_t P = layout_.total();
  const int64_t N = int64_t{max_batch_} * max_seq_;
  size_t allocated = 0;
  auto alloc = [&](cuda::DeviceBuffer* b, size_t bytes) -> Status {
    TF_ASSIGN_OR_RETURN(*b, cuda::DeviceBuffer::Allocate(bytes));
    allocated += bytes;
    return Status::OK();
  };
  TF_RETURN_IF_ERROR(alloc(&params_, m.params));
  TF_RETURN_IF_ERROR(alloc(&grads_, m.grads));
  if (m.master > 0) TF_RETURN_IF_ERROR(alloc(&master_, m.master));
  TF_RETURN_IF_ERROR(alloc(&m_, m.moments / 2));
  TF_RETURN_IF_ERROR(alloc(&v_, m.moments / 2));
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m_.data(), 0, P * 4, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v_.data(), 0, P * 4, stream_));
  TF_RETURN_IF_ERROR(alloc(&acts_, m.activations + m.backward));
  TF_RETURN_IF_ERROR(alloc(&stats_, m.stats));
  TF_RETURN_IF_ERROR(alloc(&tokens_, 2 * N * sizeof(int32_t)));
  TF_RETURN_IF_ERROR(alloc(&norm_, 2 * sizeof(double)));  // [0] the norm, [1] the accumulated loss
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(norm_.data(), 0, 2 * sizeof(double), stream_));
  TF_RETURN_IF_ERROR(alloc(&scratch_, plan_.scratch_bytes));
  {
    // AdamW's run table: the run ends (int64), then the decay flags (bytes).
    const std::vector<DecayRange> runs = DecayRanges(layout_);
    num_ranges_ = static_cast<int>(runs.size());
    std::vector<uint8_t> table(runs.size() * (sizeof(int64_t) + 1));
    for (size_t r = 0; r < runs.size(); ++r) {
      std::memcpy(table.data() + r * sizeof(int64_t), &runs[r].end, sizeof(int64_t));
      table[runs.size() * sizeof(int64_t) + r] = runs[r].decay ? 1 : 0;
    }
    TF_RETURN_IF_ERROR(alloc(&ranges_, table.size()));
    // On stream_ (non-blocking: a plain cudaMemcpy would not be ordered with it), then waited for
    // while `table` is alive.
    TF_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(ranges_.data(), table.data(), table.size(), cudaMemcpyHostToDevice, stream_));
    TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  }
  if (allocated != m.buffers) {
    return Status::Internal("GPT2Cuda: allocated {} bytes but the plan says {}", allocated, m.buffers);
  }
  memory_ = m;
  host_losses_.resize(static_cast<size_t>(N));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::OK();
}

Status GPT2Cuda::LoadParams(std::span<const float> host) {
  const int64_t P = layout_.total();
  if (static_cast<int64_t>(host.size()) != P) return Status::Internal("LoadParams: {} floats for {}", host.size(), P);
  float* master = dtype_ == DType::kF32 ? params_.as<float>() : master_.as<float>();
  // Copies on stream_ (a plain cudaMemcpy runs on the legacy stream, which the non-blocking stream_
  // is not ordered with; from pageable memory it may return before the data has landed), then
  // waited for while the host buffers are alive.
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(master, host.data(), P * 4, cudaMemcpyHostToDevice, stream_));
  if (dtype_ == DType::kBF16) {
    std::vector<uint16_t> h(static_cast<size_t>(P));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < P; ++i) h[static_cast<size_t>(i)] = FloatToBf16(host[static_cast<size_t>(i)]);
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(params_.data(), h.data(), P * 2, cudaMemcpyHostToDevice, stream_));
    TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  }
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::OK();
}

Status GPT2Cuda::StoreParams(std::span<float> host) const {
  const int64_t P = layout_.total();
  if (static_cast<int64_t>(host.size()) != P) return Status::Internal("StoreParams: {} floats for {}", host.size(), P);
  const float* master = dtype_ == DType::kF32 ? params_.as<float>() : master_.as<float>();
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), master, P * 4, cudaMemcpyDeviceToHost));
  return Status::OK();
}

Status GPT2Cuda::StoreGrads(std::span<float> host) const {
  const int64_t P = layout_.total();
  if (static_cast<int64_t>(host.size()) != P) return Status::Internal("StoreGrads: {} floats for {}", host.size(), P);
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (dtype_ == DType::kF32) {
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), grads_.data(), P * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(P));
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(h.data(), grads_.data(), P * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < P; ++i) host[static_cast<size_t>(i)] = Bf16ToFloat(h[static_cast<size_t>(i)]);
  }
  return Status::OK();
}

Status GPT2Cuda::ZeroGrad() {
  Mark("zero grads");
  TF_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(grads_.data(), 0, layout_.total() * cuda::DTypeSize(dtype_), stream_));
  EndMark();
  return Status::OK();
}

Status GPT2Cuda::AttentionForward(int l, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head;
  const int64_t NC = int64_t{B} * T * C;
  void* qkv = At(acts_, plan_.a.qkv + l * NC * 3);
  void* atty = At(acts_, plan_.a.atty + l * NC);
  if (options_.attention == Options::Attention::kGemm) {
    void* att = At(acts_, plan_.a.att + int64_t{l} * B * NH * T * T);
    return cuda::attention_forward(*blas_, atty, att, qkv, B, T, C, NH, dtype_, scratch_.data());
  }
  float* lse = stats_.as<float>() + plan_.s.lse + int64_t{l} * LseStride(B, NH, T);
  if (UseCudnn(B, T)) {
    return cudnn_->Forward(atty, lse, qkv, B, T, C, NH, dtype_, scratch_.data(), plan_.scratch_bytes, stream_);
  }
  const cuda::FlashImpl impl =
      options_.attention == Options::Attention::kFlashSimt ? cuda::FlashImpl::kSimt : cuda::FlashImpl::kAuto;
  return cuda::flash_attention_forward(atty, lse, qkv, B, T, C, NH, dtype_, stream_, impl);
}

Status GPT2Cuda::AttentionBackward(int l, int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head;
  const int64_t NC = int64_t{B} * T * C;
  void* qkv = At(acts_, plan_.a.qkv + l * NC * 3);
  void* atty = At(acts_, plan_.a.atty + l * NC);
  void* datty = At(acts_, plan_.a.datty);
  void* dqkv = At(acts_, plan_.a.dqkv);
  if (options_.attention == Options::Attention::kGemm) {
    void* att = At(acts_, plan_.a.att + int64_t{l} * B * NH * T * T);
    return cuda::attention_backward(*blas_, dqkv, datty, qkv, att, B, T, C, NH, dtype_, scratch_.data());
  }
  const float* lse = stats_.as<float>() + plan_.s.lse + int64_t{l} * LseStride(B, NH, T);
  if (UseCudnn(B, T)) {
    return cudnn_->Backward(dqkv, datty, qkv, atty, lse, B, T, C, NH, dtype_, scratch_.data(), plan_.scratch_bytes,
                            stream_);
  }
  const cuda::FlashImpl impl =
      options_.attention == Options::Attention::kFlashSimt ? cuda::FlashImpl::kSimt : cuda::FlashImpl::kAuto;
  return cuda::flash_attention_backward(dqkv, datty, qkv, atty, lse, B, T, C, NH, dtype_, scratch_.data(),
                                        plan_.scratch_bytes, stream_, impl);
}

Status GPT2Cuda::RunForward(int B, int T) {
  const int C = config_.n_embd, Vp = config_.padded_vocab_size;
  const int64_t N = int64_t{B} * T, NC = N * C;
  const Plan::Acts& a = plan_.a;
  const Plan::Stats& st = plan_.s;
  const auto& tensors = layout_.tensors();
  const int32_t* inputs = tokens_.as<int32_t>();
  float* stats = stats_.as<float>();
  cuda::CublasContext& ctx = *blas_;
  auto W = [&](size_t index) { return At(params_, tensors[index].offset); };
  // Per-layer strides of the recomputable activations, for the current N (0: one shared buffer).
  const int64_t ln_stride = plan_.ln_stride == 0 ? 0 : NC;
  const int64_t gelu_stride = plan_.fch_gelu_stride == 0 ? 0 : NC * 4;
  const int gelu_fusion = options_.GeluFusion(dtype_);
  const bool fuse_residual = options_.fuse_residual;
  Mark("embedding fwd");
  TF_RETURN_IF_ERROR(cuda::encoder_forward(At(acts_, a.encoded), inputs, W(0), W(1), B, T, C, dtype_, stream_));
  void* residual = At(acts_, a.encoded);
  for (int l = 0; l < config_.n_layer; ++l) {
    // Block tensors from p: ln_1.w, ln_1.b, qkv.w, qkv.b, proj.w, proj.b, ln_2.w,b, fc.w,b, fcproj.w,b.
    const size_t p = 2 + 12 * static_cast<size_t>(l);
    void* ln1 = At(acts_, a.ln1 + l * ln_stride);
    void* qkv = At(acts_, a.qkv + l * NC * 3);
    void* atty = At(acts_, a.atty + l * NC);
    void* residual2 = At(acts_, a.residual2 + l * NC);
    void* ln2 = At(acts_, a.ln2 + l * ln_stride);
    void* fch = At(acts_, a.fch + l * NC * 4);
    void* fch_gelu = At(acts_, a.fch_gelu + l * gelu_stride);
    void* residual3 = At(acts_, a.residual3 + l * NC);
    Mark("layernorm fwd");
    TF_RETURN_IF_ERROR(cuda::layernorm_forward(ln1, stats + st.ln1_mean + l * N, stats + st.ln1_rstd + l * N,
                                               residual, W(p), W(p + 1), static_cast<int>(N), C, dtype_, stream_));
    Mark("qkv fwd");
    TF_RETURN_IF_ERROR(cuda::matmul_forward(ctx, qkv, ln1, W(p + 2), W(p + 3), static_cast<int>(N), C, 3 * C, dtype_));
    Mark("attention fwd");
    TF_RETURN_IF_ERROR(AttentionForward(l, B, T));
    // residual2 = residual + attention projection (one GEMM with fuse_residual).
    Mark("attproj fwd");
    TF_RETURN_IF_ERROR(cuda::matmul_forward(ctx, residual2, atty, W(p + 4), W(p + 5), static_cast<int>(N), C, C,
                                            dtype_, nullptr, fuse_residual ? residual : nullptr));
    if (!fuse_residual) {
      Mark("residual add");
      TF_RETURN_IF_ERROR(cuda::accumulate(residual2, residual, NC, dtype_, stream_));
    }
    Mark("layernorm fwd");
    TF_RETURN_IF_ERROR(cuda::layernorm_forward(ln2, stats + st.ln2_mean + l * N, stats + st.ln2_rstd + l * N,
                                               residual2, W(p + 6), W(p + 7), static_cast<int>(N), C, dtype_,
                                               stream_));
    Mark("fc fwd");
    if (gelu_fusion >= 1) {
      // The fc GEMM writes the pre-activation fch and its GELU (cuBLASLt's) in one pass.
      TF_RETURN_IF_ERROR(cuda::matmul_forward(ctx, fch_gelu, ln2, W(p + 8), W(p + 9), static_cast<int>(N), C, 4 * C,
                                              dtype_, /*pre_gelu=*/fch));
    } else {
      // Unfused GELU: exactly math::gelu (the tanh form), which the backward differentiates.
      TF_RETURN_IF_ERROR(
          cuda::matmul_forward(ctx, fch, ln2, W(p + 8), W(p + 9), static_cast<int>(N), C, 4 * C, dtype_));
      Mark("gelu fwd");
      TF_RETURN_IF_ERROR(cuda::gelu_forward(fch_gelu, fch, NC * 4, dtype_, stream_));
    }
    Mark("fcproj fwd");
    TF_RETURN_IF_ERROR(cuda::matmul_forward(ctx, residual3, fch_gelu, W(p + 10), W(p + 11), static_cast<int>(N),
                                            4 * C, C, dtype_, nullptr, fuse_residual ? residual2 : nullptr));
    if (!fuse_residual) {
      Mark("residual add");
      TF_RETURN_IF_ERROR(cuda::accumulate(residual3, residual2, NC, dtype_, stream_));
    }
    residual = residual3;
  }
  const size_t f = tensors.size() - 2;
  Mark("layernorm fwd");
  TF_RETURN_IF_ERROR(cuda::layernorm_forward(At(acts_, a.lnf), stats + st.lnf_mean, stats + st.lnf_rstd, residual,
                                             W(f), W(f + 1), static_cast<int>(N), C, dtype_, stream_));
  Mark("lm head fwd");
  return cuda::matmul_forward(ctx, At(acts_, a.logits), At(acts_, a.lnf), W(0), nullptr, static_cast<int>(N), C,
                              Vp, dtype_);
}

Status GPT2Cuda::RunBackward(int B, int T) {
  const int C = config_.n_embd, Vp = config_.padded_vocab_size;
  const int64_t N = int64_t{B} * T, NC = N * C;
  const size_t es = cuda::DTypeSize(dtype_);
  const Plan::Acts& a = plan_.a;
  const Plan::Stats& st = plan_.s;
  const auto& tensors = layout_.tensors();
  const int32_t* inputs = tokens_.as<int32_t>();
  float* stats = stats_.as<float>();
  float* scratch_f = scratch_.as<float>();
  const size_t scratch_bytes = plan_.scratch_bytes;
  cuda::CublasContext& ctx = *blas_;
  auto W = [&](size_t index) { return At(params_, tensors[index].offset); };
  auto G = [&](size_t index) { return At(grads_, tensors[index].offset); };
  auto zero = [&](int64_t act_offset, int64_t n) -> Status {
    TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(At(acts_, act_offset), 0, n * es, stream_));
    return Status::OK();
  };
  // The per-layer input gradients (dln, dfch, datty) are overwritten by their GEMMs, never zeroed.
  cuda::MatmulBackwardOptions overwrite;
  overwrite.accumulate_dinp = false;
  const bool fused_dgelu = options_.GeluFusion(dtype_) >= 2;
  const int64_t ln_stride = plan_.ln_stride == 0 ? 0 : NC;
  const int64_t gelu_stride = plan_.fch_gelu_stride == 0 ? 0 : NC * 4;
  void* dresidual = At(acts_, a.dresidual);
  void* dln = At(acts_, a.dln);
  const int n = static_cast<int>(N);

  // LM head (tied): dlnf = dlogits @ wte; dwte += dlogits^T @ lnf.
  Mark("lm head bwd");
  TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, dln, G(0), nullptr, At(acts_, a.logits), At(acts_, a.lnf), W(0), n,
                                           C, Vp, dtype_, nullptr, overwrite));
  Mark("zero");
  TF_RETURN_IF_ERROR(zero(a.dresidual, NC));
  const size_t f = tensors.size() - 2;
  void* last = config_.n_layer > 0 ? At(acts_, a.residual3 + (config_.n_layer - 1) * NC) : At(acts_, a.encoded);
  Mark("layernorm bwd");
  TF_RETURN_IF_ERROR(cuda::layernorm_backward(dresidual, G(f), G(f + 1), dln, last, W(f), stats + st.lnf_mean,
                                              stats + st.lnf_rstd, n, C, dtype_, scratch_f, scratch_bytes, stream_));
  auto ready = [&](int64_t begin, int64_t end) {
    if (grad_ready_) grad_ready_(begin, end);
  };
  ready(tensors[f].offset, layout_.total());
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const size_t p = 2 + 12 * static_cast<size_t>(l);
    void* residual = l == 0 ? At(acts_, a.encoded) : At(acts_, a.residual3 + (l - 1) * NC);
    void* ln1 = At(acts_, a.ln1 + l * ln_stride);
    void* atty = At(acts_, a.atty + l * NC);
    void* residual2 = At(acts_, a.residual2 + l * NC);
    void* ln2 = At(acts_, a.ln2 + l * ln_stride);
    void* fch = At(acts_, a.fch + l * NC * 4);
    void* fch_gelu = At(acts_, a.fch_gelu + l * gelu_stride);
    void* dfch = At(acts_, a.dfch);
    void* datty = At(acts_, a.datty);
    void* dqkv = At(acts_, a.dqkv);
    // Recomputation re-runs the forward kernels on the same inputs: bit-identical activations (with
    // gelu_fusion >= 1 the forward's GELU was cuBLASLt's, so the recomputed math::gelu may differ in
    // the last bits).
    if (options_.recompute >= 1) {
      Mark("recompute");
      TF_RETURN_IF_ERROR(cuda::gelu_forward(fch_gelu, fch, NC * 4, dtype_, stream_));
    }
    Mark("fcproj bwd");
    if (fused_dgelu) {
      // dfch = (dresidual @ Wfcproj) * gelu'(fch) in the GEMM's epilogue.
      cuda::MatmulBackwardOptions dgelu = overwrite;
      dgelu.dgelu_pre = fch;
      TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, dfch, G(p + 10), G(p + 11), dresidual, fch_gelu, W(p + 10), n,
                                               4 * C, C, dtype_, scratch_f, dgelu));
    } else {
      TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, dfch, G(p + 10), G(p + 11), dresidual, fch_gelu, W(p + 10), n,
                                               4 * C, C, dtype_, scratch_f, overwrite));
      Mark("gelu bwd");
      TF_RETURN_IF_ERROR(cuda::gelu_backward(dfch, fch, dfch, NC * 4, dtype_, stream_));
    }
    if (options_.recompute >= 2) {
      Mark("recompute");
      TF_RETURN_IF_ERROR(cuda::layernorm_forward(ln2, nullptr, nullptr, residual2, W(p + 6), W(p + 7), n, C, dtype_,
                                                 stream_));
    }
    Mark("fc bwd");
    TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, dln, G(p + 8), G(p + 9), dfch, ln2, W(p + 8), n, C, 4 * C, dtype_,
                                             scratch_f, overwrite));
    Mark("layernorm bwd");
    TF_RETURN_IF_ERROR(cuda::layernorm_backward(dresidual, G(p + 6), G(p + 7), dln, residual2, W(p + 6),
                                                stats + st.ln2_mean + l * N, stats + st.ln2_rstd + l * N, n, C,
                                                dtype_, scratch_f, scratch_bytes, stream_));
    Mark("attproj bwd");
    TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, datty, G(p + 4), G(p + 5), dresidual, atty, W(p + 4), n, C, C,
                                             dtype_, scratch_f, overwrite));
    Mark("attention bwd");
    TF_RETURN_IF_ERROR(AttentionBackward(l, B, T));  // dqkv overwritten
    if (options_.recompute >= 2) {
      Mark("recompute");
      TF_RETURN_IF_ERROR(
          cuda::layernorm_forward(ln1, nullptr, nullptr, residual, W(p), W(p + 1), n, C, dtype_, stream_));
    }
    Mark("qkv bwd");
    TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, dln, G(p + 2), G(p + 3), dqkv, ln1, W(p + 2), n, C, 3 * C, dtype_,
                                             scratch_f, overwrite));
    Mark("layernorm bwd");
    TF_RETURN_IF_ERROR(cuda::layernorm_backward(dresidual, G(p), G(p + 1), dln, residual, W(p),
                                                stats + st.ln1_mean + l * N, stats + st.ln1_rstd + l * N, n, C,
                                                dtype_, scratch_f, scratch_bytes, stream_));
    ready(layout_.LayerBegin(l), layout_.LayerEnd(l));
  }
  Mark("embedding bwd");
  TF_RETURN_IF_ERROR(cuda::encoder_backward(G(0), G(1), dresidual, inputs, B, T, C, dtype_, scratch_.data(),
                                            scratch_bytes, stream_));
  ready(0, config_.n_layer > 0 ? layout_.LayerBegin(0) : static_cast<int64_t>(tensors[f].offset));
  return Status::OK();
}

StatusOr<float> GPT2Cuda::MeanLoss(int N) {
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_losses_.data(), stats_.as<float>() + plan_.s.losses, N * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += host_losses_[static_cast<size_t>(i)];
  return static_cast<float>(sum / N);
}

StatusOr<float> GPT2Cuda::Forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  if (B <= 0 || T <= 0 || B > max_batch_ || T > max_seq_) {
    return Status::InvalidArgument("batch {}x{} outside the plan ({}x{})", B, T, max_batch_, max_seq_);
  }
  const int N = B * T;
  int32_t* dev = tokens_.as<int32_t>();
  Mark("tokens to device");
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, inputs, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev + N, targets, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_RETURN_IF_ERROR(RunForward(B, T));
  Mark("cross-entropy");
  TF_RETURN_IF_ERROR(cuda::crossentropy_forward_backward(At(acts_, plan_.a.logits), stats_.as<float>() + plan_.s.losses,
                                                         dev + N, N, config_.vocab_size, config_.padded_vocab_size,
                                                         0.0f, dtype_, stream_));
  EndMark();
  return MeanLoss(N);
}

StatusOr<float> GPT2Cuda::ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                          float grad_scale) {
  TF_RETURN_IF_ERROR(TrainingPass(inputs, targets, B, T, grad_scale, /*accumulate_loss=*/false));
  return MeanLoss(B * T);
}

Status GPT2Cuda::ForwardBackwardAccumulate(const int32_t* inputs, const int32_t* targets, int B, int T,
                                           float grad_scale) {
  return TrainingPass(inputs, targets, B, T, grad_scale, /*accumulate_loss=*/true);
}

Status GPT2Cuda::TrainingPass(const int32_t* inputs, const int32_t* targets, int B, int T, float grad_scale,
                              bool accumulate_loss) {
  if (B <= 0 || T <= 0 || B > max_batch_ || T > max_seq_) {
    return Status::InvalidArgument("batch {}x{} outside the plan ({}x{})", B, T, max_batch_, max_seq_);
  }
  const int N = B * T;
  int32_t* dev = tokens_.as<int32_t>();
  Mark("tokens to device");
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, inputs, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev + N, targets, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_RETURN_IF_ERROR(RunForward(B, T));
  float* losses = stats_.as<float>() + plan_.s.losses;
  Mark("cross-entropy");
  TF_RETURN_IF_ERROR(cuda::crossentropy_forward_backward(At(acts_, plan_.a.logits), losses, dev + N, N,
                                                         config_.vocab_size, config_.padded_vocab_size,
                                                         grad_scale / static_cast<float>(N), dtype_, stream_));
  if (accumulate_loss) {
    Mark("loss accumulate");
    TF_RETURN_IF_ERROR(cuda::accumulate_loss(losses, N, 1.0 / N, norm_.as<double>() + 1, stream_));
  }
  TF_RETURN_IF_ERROR(RunBackward(B, T));
  EndMark();
  TF_CUDA_RETURN_IF_ERROR(cudaEventRecord(backward_done_, stream_));
  return Status::OK();
}

StatusOr<double> GPT2Cuda::TakeLossSum() {
  double sum = 0;
  TF_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum, norm_.as<double>() + 1, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(norm_.as<double>() + 1, 0, sizeof(double), stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return sum;
}

StatusOr<float> GPT2Cuda::Step(const AdamWConfig& c, double lr, int64_t t) {
  // Norm, clip factor and update are all enqueued on the compute stream: the clip factor is computed
  // on the device from the sum of squares (math::grad_clip_scale, the CPU optimizer's formula), so
  // there is no host round trip between them; the norm is read back once the update is queued.
  TF_RETURN_IF_ERROR(EnqueueSumSquares());
  TF_RETURN_IF_ERROR(ApplyUpdate(c, lr, t));
  return ReadNorm();
}

StatusOr<float> GPT2Cuda::GradNorm() {
  TF_RETURN_IF_ERROR(EnqueueSumSquares());
  return ReadNorm();
}

Status GPT2Cuda::EnqueueSumSquares() {
  Mark("grad norm");
  TF_RETURN_IF_ERROR(cuda::sum_squares(grads_.data(), layout_.total(), dtype_, norm_.as<double>(), scratch_.data(),
                                       plan_.scratch_bytes, stream_));
  EndMark();
  return Status::OK();
}

StatusOr<float> GPT2Cuda::ReadNorm() {
  double sq = 0;
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&sq, norm_.as<double>(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return static_cast<float>(std::sqrt(sq));
}

Status GPT2Cuda::ApplyUpdate(const AdamWConfig& c, double lr, int64_t t) {
  const int64_t P = layout_.total();
  math::AdamWParams h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(c.beta1);
  h.beta2 = static_cast<float>(c.beta2);
  h.eps = static_cast<float>(c.eps);
  h.weight_decay = static_cast<float>(c.weight_decay);  // for the runs that decay; 0 for the others
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(c.beta1, static_cast<double>(t)));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(t)));
  float* master = dtype_ == DType::kF32 ? params_.as<float>() : master_.as<float>();
  void* out = dtype_ == DType::kF32 ? static_cast<void*>(master) : params_.data();
  const auto* ends = static_cast<const int64_t*>(ranges_.data());
  const auto* decay = static_cast<const uint8_t*>(ranges_.data()) + num_ranges_ * sizeof(int64_t);
  Mark("adamw");
  TF_RETURN_IF_ERROR(cuda::adamw_step_ranges(master, m_.as<float>(), v_.as<float>(), grads_.data(), out, P, ends,
                                             decay, num_ranges_, norm_.as<double>(), c.grad_clip, h, dtype_, dtype_,
                                             stream_));
  EndMark();
  return Status::OK();
}

}  // namespace tf
#endif  // TF_WITH_CUDA
