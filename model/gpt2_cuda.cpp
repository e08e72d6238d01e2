#if defined(TF_WITH_CUDA)
#include "model/gpt2_cuda.h"

#include <cmath>
#include <cstring>

#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "kernels/classifier.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"

namespace tf {
namespace {

using cuda::DType;

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

GPT2Cuda::GPT2Cuda(const GPT2Config& config, int max_batch, int max_seq, cuda::DType dtype)
    : config_(config), layout_(config), max_batch_(max_batch), max_seq_(max_seq), dtype_(dtype) {}

GPT2Cuda::~GPT2Cuda() {
  blas_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

StatusOr<std::unique_ptr<GPT2Cuda>> GPT2Cuda::Create(const GPT2Config& config, int max_batch, int max_seq,
                                                     cuda::DType dtype, int device) {
  TF_RETURN_IF_ERROR(ValidateConfig(config));
  if (cuda::DeviceCount() <= device) {
    return Status::InvalidArgument("CUDA device {} requested but {} visible", device, cuda::DeviceCount());
  }
  if (max_batch <= 0 || max_seq <= 0 || max_seq > config.block_size) {
    return Status::InvalidArgument("batch {} / sequence {} invalid for block_size {}", max_batch, max_seq,
                                   config.block_size);
  }
  TF_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<GPT2Cuda> m(new GPT2Cuda(config, max_batch, max_seq, dtype));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking));
  TF_ASSIGN_OR_RETURN(cuda::CublasContext ctx, cuda::CublasContext::Create(m->stream_));
  m->blas_ = std::make_unique<cuda::CublasContext>(std::move(ctx));
  TF_RETURN_IF_ERROR(m->Allocate());
  return m;
}

Status GPT2Cuda::Allocate() {
  const int64_t P = layout_.total();
  const int64_t L = config_.n_layer, C = config_.n_embd, NH = config_.n_head, Vp = config_.padded_vocab_size;
  const int64_t B = max_batch_, T = max_seq_, N = B * T;
  const size_t es = cuda::DTypeSize(dtype_);
  auto alloc = [&](cuda::DeviceBuffer* b, size_t bytes) -> Status {
    TF_ASSIGN_OR_RETURN(*b, cuda::DeviceBuffer::Allocate(bytes));
    device_bytes_ += bytes;
    return Status::OK();
  };
  TF_RETURN_IF_ERROR(alloc(&params_, P * es));
  TF_RETURN_IF_ERROR(alloc(&grads_, P * es));
  if (dtype_ != DType::kF32) TF_RETURN_IF_ERROR(alloc(&master_, P * 4));
  TF_RETURN_IF_ERROR(alloc(&m_, P * 4));
  TF_RETURN_IF_ERROR(alloc(&v_, P * 4));
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m_.data(), 0, P * 4, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v_.data(), 0, P * 4, stream_));

  // Activations: offsets in elements, each rounded to 64 elements (128-byte alignment for bf16).
  int64_t off = 0;
  auto take = [&](int64_t n) {
    const int64_t o = off;
    off += (n + 63) / 64 * 64;
    return o;
  };
  a_.encoded = take(N * C);
  a_.ln1 = take(L * N * C);
  a_.qkv = take(L * N * 3 * C);
  a_.atty = take(L * N * C);
  a_.att = take(L * B * NH * T * T);
  a_.residual2 = take(L * N * C);
  a_.ln2 = take(L * N * C);
  a_.fch = take(L * N * 4 * C);
  a_.fch_gelu = take(L * N * 4 * C);
  a_.residual3 = take(L * N * C);
  a_.lnf = take(N * C);
  a_.logits = take(N * Vp);
  a_.dresidual = take(N * C);
  a_.dln = take(N * C);
  a_.datty = take(N * C);
  a_.dqkv = take(N * 3 * C);
  a_.dfch = take(N * 4 * C);
  TF_RETURN_IF_ERROR(alloc(&acts_, off * es));

  off = 0;
  s_.ln1_mean = take(L * N);
  s_.ln1_rstd = take(L * N);
  s_.ln2_mean = take(L * N);
  s_.ln2_rstd = take(L * N);
  s_.lnf_mean = take(N);
  s_.lnf_rstd = take(N);
  s_.losses = take(N);
  TF_RETURN_IF_ERROR(alloc(&stats_, off * 4));
  TF_RETURN_IF_ERROR(alloc(&tokens_, 2 * N * sizeof(int32_t)));
  TF_RETURN_IF_ERROR(alloc(&norm_, sizeof(double)));

  // One scratch area, sized for the largest user (each kernel uses it only during its call).
  TF_ASSIGN_OR_RETURN(size_t enc, cuda::encoder_backward_scratch_bytes(static_cast<int>(B), static_cast<int>(T)));
  size_t need = enc;
  need = std::max(need, cuda::layernorm_backward_scratch_bytes(static_cast<int>(N), static_cast<int>(C)));
  need = std::max(need, cuda::attention_scratch_bytes(static_cast<int>(B), static_cast<int>(T), static_cast<int>(C),
                                                      static_cast<int>(NH), dtype_));
  need = std::max(need, static_cast<size_t>(cuda::matmul_dbias_scratch_floats(static_cast<int>(N),
                                                                              static_cast<int>(4 * C))) *
                            4);
  need = std::max(need, cuda::sum_squares_scratch_bytes(P));
  scratch_bytes_ = (need + 255) / 256 * 256;
  TF_RETURN_IF_ERROR(alloc(&scratch_, scratch_bytes_));
  host_losses_.resize(static_cast<size_t>(N));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::OK();
}

Status GPT2Cuda::LoadParams(std::span<const float> host) {
  const int64_t P = layout_.total();
  if (static_cast<int64_t>(host.size()) != P) return Status::Internal("LoadParams: {} floats for {}", host.size(), P);
  float* master = dtype_ == DType::kF32 ? params_.as<float>() : master_.as<float>();
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(master, host.data(), P * 4, cudaMemcpyHostToDevice));
  if (dtype_ == DType::kBF16) {
    std::vector<uint16_t> h(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) h[static_cast<size_t>(i)] = ToBf16(host[static_cast<size_t>(i)]);
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpy(params_.data(), h.data(), P * 2, cudaMemcpyHostToDevice));
  }
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
    for (int64_t i = 0; i < P; ++i) host[static_cast<size_t>(i)] = FromBf16(h[static_cast<size_t>(i)]);
  }
  return Status::OK();
}

Status GPT2Cuda::ZeroGrad() {
  TF_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(grads_.data(), 0, layout_.total() * cuda::DTypeSize(dtype_), stream_));
  return Status::OK();
}

Status GPT2Cuda::RunForward(int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head, Vp = config_.padded_vocab_size;
  const int64_t N = int64_t{B} * T, NC = N * C;
  const auto& tensors = layout_.tensors();
  const int32_t* inputs = tokens_.as<int32_t>();
  float* stats = stats_.as<float>();
  cuda::CublasContext& ctx = *blas_;
  auto W = [&](size_t index) { return At(params_, tensors[index].offset); };
  TF_RETURN_IF_ERROR(cuda::encoder_forward(At(acts_, a_.encoded), inputs, W(0), W(1), B, T, C, dtype_, stream_));
  void* residual = At(acts_, a_.encoded);
  for (int l = 0; l < config_.n_layer; ++l) {
    const size_t p = 2 + 12 * static_cast<size_t>(l);  // ln_1.w, ln_1.b, qkv.w, qkv.b, proj.w, proj.b, ln_2.w,b, fc.w,b, fcproj.w,b
    void* ln1 = At(acts_, a_.ln1 + l * NC);
    void* qkv = At(acts_, a_.qkv + l * NC * 3);
    void* atty = At(acts_, a_.atty + l * NC);
    void* att = At(acts_, a_.att + int64_t{l} * B * NH * T * T);
    void* residual2 = At(acts_, a_.residual2 + l * NC);
    void* ln2 = At(acts_, a_.ln2 + l * NC);
    void* fch = At(acts_, a_.fch + l * NC * 4);
    void* fch_gelu = At(acts_, a_.fch_gelu + l * NC * 4);
    void* residual3 = At(acts_, a_.residual3 + l * NC);
    TF_RETURN_IF_ERROR(cuda::layernorm_forward(ln1, stats + s_.ln1_mean + l * N, stats + s_.ln1_rstd + l * N,
                                               residual, W(p), W(p + 1), static_cast<int>(N), C, dtype_, stream_));
    TF_RETURN_IF_ERROR(cuda::matmul_forward(ctx, qkv, ln1, W(p + 2), W(p + 3), static_cast<int>(N), C, 3 * C, dtype_));
    TF_RETURN_IF_ERROR(cuda::attention_forward(ctx, atty, att, qkv, B, T, C, NH, dtype_, scratch_.data()));
    TF_RETURN_IF_ERROR(
        cuda::matmul_forward(ctx, residual2, atty, W(p + 4), W(p + 5), static_cast<int>(N), C, C, dtype_));
    TF_RETURN_IF_ERROR(cuda::accumulate(residual2, residual, NC, dtype_, stream_));
    TF_RETURN_IF_ERROR(cuda::layernorm_forward(ln2, stats + s_.ln2_mean + l * N, stats + s_.ln2_rstd + l * N,
                                               residual2, W(p + 6), W(p + 7), static_cast<int>(N), C, dtype_,
                                               stream_));
    // Unfused GELU: exactly math::gelu (the tanh form), which the backward differentiates.
    TF_RETURN_IF_ERROR(cuda::matmul_forward(ctx, fch, ln2, W(p + 8), W(p + 9), static_cast<int>(N), C, 4 * C, dtype_));
    TF_RETURN_IF_ERROR(cuda::gelu_forward(fch_gelu, fch, NC * 4, dtype_, stream_));
    TF_RETURN_IF_ERROR(
        cuda::matmul_forward(ctx, residual3, fch_gelu, W(p + 10), W(p + 11), static_cast<int>(N), 4 * C, C, dtype_));
    TF_RETURN_IF_ERROR(cuda::accumulate(residual3, residual2, NC, dtype_, stream_));
    residual = residual3;
  }
  const size_t f = tensors.size() - 2;
  TF_RETURN_IF_ERROR(cuda::layernorm_forward(At(acts_, a_.lnf), stats + s_.lnf_mean, stats + s_.lnf_rstd, residual,
                                             W(f), W(f + 1), static_cast<int>(N), C, dtype_, stream_));
  return cuda::matmul_forward(ctx, At(acts_, a_.logits), At(acts_, a_.lnf), W(0), nullptr, static_cast<int>(N), C,
                              Vp, dtype_);
}

Status GPT2Cuda::RunBackward(int B, int T) {
  const int C = config_.n_embd, NH = config_.n_head, Vp = config_.padded_vocab_size;
  const int64_t N = int64_t{B} * T, NC = N * C;
  const size_t es = cuda::DTypeSize(dtype_);
  const auto& tensors = layout_.tensors();
  const int32_t* inputs = tokens_.as<int32_t>();
  float* stats = stats_.as<float>();
  float* scratch_f = scratch_.as<float>();
  cuda::CublasContext& ctx = *blas_;
  auto W = [&](size_t index) { return At(params_, tensors[index].offset); };
  auto G = [&](size_t index) { return At(grads_, tensors[index].offset); };
  auto zero = [&](int64_t act_offset, int64_t n) -> Status {
    TF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(At(acts_, act_offset), 0, n * es, stream_));
    return Status::OK();
  };
  void* dresidual = At(acts_, a_.dresidual);
  void* dln = At(acts_, a_.dln);
  const int n = static_cast<int>(N);

  // LM head (tied): dlnf = dlogits @ wte; dwte += dlogits^T @ lnf.
  TF_RETURN_IF_ERROR(zero(a_.dln, NC));
  TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, dln, G(0), nullptr, At(acts_, a_.logits), At(acts_, a_.lnf), W(0), n,
                                           C, Vp, dtype_, nullptr));
  TF_RETURN_IF_ERROR(zero(a_.dresidual, NC));
  const size_t f = tensors.size() - 2;
  void* last = config_.n_layer > 0 ? At(acts_, a_.residual3 + (config_.n_layer - 1) * NC) : At(acts_, a_.encoded);
  TF_RETURN_IF_ERROR(cuda::layernorm_backward(dresidual, G(f), G(f + 1), dln, last, W(f), stats + s_.lnf_mean,
                                              stats + s_.lnf_rstd, n, C, dtype_, scratch_f, scratch_bytes_, stream_));
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const size_t p = 2 + 12 * static_cast<size_t>(l);
    void* residual = l == 0 ? At(acts_, a_.encoded) : At(acts_, a_.residual3 + (l - 1) * NC);
    void* ln1 = At(acts_, a_.ln1 + l * NC);
    void* qkv = At(acts_, a_.qkv + l * NC * 3);
    void* atty = At(acts_, a_.atty + l * NC);
    void* att = At(acts_, a_.att + int64_t{l} * B * NH * T * T);
    void* residual2 = At(acts_, a_.residual2 + l * NC);
    void* ln2 = At(acts_, a_.ln2 + l * NC);
    void* fch = At(acts_, a_.fch + l * NC * 4);
    void* fch_gelu = At(acts_, a_.fch_gelu + l * NC * 4);
    void* dfch = At(acts_, a_.dfch);
    void* datty = At(acts_, a_.datty);
    void* dqkv = At(acts_, a_.dqkv);
    TF_RETURN_IF_ERROR(zero(a_.dfch, NC * 4));
    TF_RETURN_IF_ERROR(cuda::matmul_backward(ctx, dfch, G(p + 10), G(p + 11), dresidual, fch_gelu, W(p + 10), n,
                                             4 * C, C, dtype_, scratch_f));
    TF_RETURN_IF_ERROR(cuda::gelu_backward(dfch, fch, dfch, NC * 4, dtype_, stream_));
    TF_RETURN_IF_ERROR(zero(a_.dln, NC));
    TF_RETURN_IF_ERROR(
        cuda::matmul_backward(ctx, dln, G(p + 8), G(p + 9), dfch, ln2, W(p + 8), n, C, 4 * C, dtype_, scratch_f));
    TF_RETURN_IF_ERROR(cuda::layernorm_backward(dresidual, G(p + 6), G(p + 7), dln, residual2, W(p + 6),
                                                stats + s_.ln2_mean + l * N, stats + s_.ln2_rstd + l * N, n, C,
                                                dtype_, scratch_f, scratch_bytes_, stream_));
    TF_RETURN_IF_ERROR(zero(a_.datty, NC));
    TF_RETURN_IF_ERROR(
        cuda::matmul_backward(ctx, datty, G(p + 4), G(p + 5), dresidual, atty, W(p + 4), n, C, C, dtype_, scratch_f));
    TF_RETURN_IF_ERROR(cuda::attention_backward(ctx, dqkv, datty, qkv, att, B, T, C, NH, dtype_, scratch_.data()));
    TF_RETURN_IF_ERROR(zero(a_.dln, NC));
    TF_RETURN_IF_ERROR(
        cuda::matmul_backward(ctx, dln, G(p + 2), G(p + 3), dqkv, ln1, W(p + 2), n, C, 3 * C, dtype_, scratch_f));
    TF_RETURN_IF_ERROR(cuda::layernorm_backward(dresidual, G(p), G(p + 1), dln, residual, W(p),
                                                stats + s_.ln1_mean + l * N, stats + s_.ln1_rstd + l * N, n, C,
                                                dtype_, scratch_f, scratch_bytes_, stream_));
  }
  return cuda::encoder_backward(G(0), G(1), dresidual, inputs, B, T, C, dtype_, scratch_.data(), scratch_bytes_,
                                stream_);
}

StatusOr<float> GPT2Cuda::MeanLoss(int N) {
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_losses_.data(), stats_.as<float>() + s_.losses, N * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += host_losses_[static_cast<size_t>(i)];
  return static_cast<float>(sum / N);
}

StatusOr<float> GPT2Cuda::Forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  if (B > max_batch_ || T > max_seq_) return Status::InvalidArgument("batch {}x{} exceeds the plan", B, T);
  const int N = B * T;
  int32_t* dev = tokens_.as<int32_t>();
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, inputs, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev + N, targets, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_RETURN_IF_ERROR(RunForward(B, T));
  TF_RETURN_IF_ERROR(cuda::crossentropy_forward_backward(At(acts_, a_.logits), stats_.as<float>() + s_.losses,
                                                         dev + N, N, config_.vocab_size, config_.padded_vocab_size,
                                                         0.0f, dtype_, stream_));
  return MeanLoss(N);
}

StatusOr<float> GPT2Cuda::ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                          float grad_scale) {
  if (B > max_batch_ || T > max_seq_) return Status::InvalidArgument("batch {}x{} exceeds the plan", B, T);
  const int N = B * T;
  int32_t* dev = tokens_.as<int32_t>();
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, inputs, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev + N, targets, N * 4, cudaMemcpyHostToDevice, stream_));
  TF_RETURN_IF_ERROR(RunForward(B, T));
  TF_RETURN_IF_ERROR(cuda::crossentropy_forward_backward(At(acts_, a_.logits), stats_.as<float>() + s_.losses,
                                                         dev + N, N, config_.vocab_size, config_.padded_vocab_size,
                                                         grad_scale / static_cast<float>(N), dtype_, stream_));
  TF_RETURN_IF_ERROR(RunBackward(B, T));
  return MeanLoss(N);
}

StatusOr<float> GPT2Cuda::Step(const AdamWConfig& c, double lr, int64_t t) {
  const int64_t P = layout_.total();
  TF_RETURN_IF_ERROR(cuda::sum_squares(grads_.data(), P, dtype_, norm_.as<double>(), scratch_.data(), scratch_bytes_,
                                       stream_));
  double sq = 0;
  TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&sq, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  TF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const double norm = std::sqrt(sq);
  const float scale = (c.grad_clip > 0 && norm > c.grad_clip) ? static_cast<float>(c.grad_clip / (norm + 1e-6)) : 1.0f;
  math::AdamWParams h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(c.beta1);
  h.beta2 = static_cast<float>(c.beta2);
  h.eps = static_cast<float>(c.eps);
  h.bias_correction1 = static_cast<float>(1.0 - std::pow(c.beta1, static_cast<double>(t)));
  h.bias_correction2 = static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(t)));
  float* master = dtype_ == DType::kF32 ? params_.as<float>() : master_.as<float>();
  for (const ParamTensor& pt : layout_.tensors()) {
    h.weight_decay = pt.weight_decay ? static_cast<float>(c.weight_decay) : 0.0f;
    void* out = dtype_ == DType::kF32 ? static_cast<void*>(master + pt.offset) : At(params_, pt.offset);
    TF_RETURN_IF_ERROR(cuda::adamw_step(master + pt.offset, m_.as<float>() + pt.offset, v_.as<float>() + pt.offset,
                                        At(grads_, pt.offset), out, pt.numel, scale, h, dtype_, dtype_, stream_));
  }
  return static_cast<float>(norm);
}

}  // namespace tf
#endif  // TF_WITH_CUDA
