// CUDA causal self-attention (kernels/attention.h): the unfused baseline. Heads are split into
// contiguous (B,NH,T,hs) tensors, the two products per pass are strided-batched cuBLAS GEMMs over
// the B*NH (batch, head) pairs (full (T,T) products, upper triangles included), and the causal
// softmax (and its backward) runs one warp per row. The fused path is kernels/flash_attention.cu.
//
// Precision: S and dP are fp32 GEMM outputs; P (att) and dS are stored as `dt` (GEMM inputs
// again); in fp32 mode the softmax runs in place in att and dS overwrites dP.
// Scratch (regions 256-byte aligned): q, k, v, y|dy, dq, dk, dv of B*T*C `dt` each, plus the
// (B,NH,T,T) dP (and S, dS in bf16 mode); one scratch serves every layer (1.16 GB fp32, 1.38 GB
// bf16 at B=16, T=1024, C=768, NH=12).
// Formulas, the cuBLAS operand table, layout: docs/cuda.md, "kernels/attention.cu".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/attention.h"
#include "kernels/cublas_handle.h"
#include "kernels/cuda_common.cuh"
#include "kernels/math.h"

namespace tf::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;  // softmax rows per block (one warp each)

unsigned Grid(long n) { return std::min<unsigned>(CeilDiv(n, kBlock), 65535u); }

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// ---- Kernels --------------------------------------------------------------------------------------

// Part p of dst, (B,NH,T,hs) at dst + p * part_stride elements, = the p-th C-wide column block of
// src (B,T,parts*C), split into heads. One thread per destination element (coalesced writes; the
// reads are hs-long contiguous runs). grid.y = part.
template <typename E>
__global__ void SplitHeadsKernel(E* dst, long part_stride, const E* src, int B, int T, int NH, int hs, int parts) {
  const long n = long(B) * NH * T * hs;  // elements per part
  const long C = long(NH) * hs;
  const int p = blockIdx.y;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const long d = i % hs;
    long r = i / hs;
    const long t = r % T;
    r /= T;
    const long h = r % NH;
    const long b = r / NH;
    dst[p * part_stride + i] = src[(b * T + t) * parts * C + p * C + h * hs + d];
  }
}

// The inverse: the p-th C-wide column block of dst (B,T,parts*C) = part p of src, (B,NH,T,hs) at
// src + p * part_stride elements, heads concatenated. One thread per destination element.
// grid.y = part.
template <typename E>
__global__ void MergeHeadsKernel(E* dst, const E* src, long part_stride, int B, int T, int NH, int hs, int parts) {
  const long C = long(NH) * hs;
  const long n = long(B) * T * C;  // elements per part
  const int p = blockIdx.y;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const long c = i % C;
    const long bt = i / C;  // b * T + t
    const long t = bt % T;
    const long b = bt / T;
    const long h = c / hs, d = c % hs;
    dst[bt * parts * C + p * C + c] = src[p * part_stride + ((b * NH + h) * T + t) * hs + d];
  }
}

// One warp per row of (B*NH*T, T): row r is query position t = r % T. Softmax over the causal
// prefix s <= t of scores (fp32), as the CPU does (max subtracted, math::fast_exp, fp32 sum);
// att[s] = probability for s <= t, 0 above the diagonal. att may alias scores (fp32 mode): every
// element is read and written by the same lane, the write after the last read.
template <typename E>
__global__ void CausalSoftmaxKernel(E* att, const float* scores, long rows, int T) {
  const long row = long(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps exit together
  const int t = static_cast<int>(row % T);
  const float* x = scores + row * T;
  E* p = att + row * T;
  float maxv = -INFINITY;
  for (int s = lane; s <= t; s += 32) maxv = fmaxf(maxv, x[s]);
  maxv = WarpMax(maxv);
  float sum = 0.0f;
  for (int s = lane; s <= t; s += 32) sum += math::fast_exp(x[s] - maxv);
  sum = WarpSum(sum);
  const float inv = 1.0f / sum;
  for (int s = lane; s < T; s += 32) p[s] = FromFloat<E>(s <= t ? math::fast_exp(x[s] - maxv) * inv : 0.0f);
}

// Softmax backward, one warp per row: ds[s] = scale * P[s] * (dP[s] - sum_{s'<=t} P[s'] dP[s'])
// for s <= t, 0 above the diagonal (the CPU formula). ds may alias dp (fp32 mode), as above.
template <typename E>
__global__ void CausalSoftmaxBackwardKernel(E* ds, const float* dp, const E* att, long rows, int T, float scale) {
  const long row = long(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const float* g = dp + row * T;
  const E* p = att + row * T;
  E* out = ds + row * T;
  float dot = 0.0f;
  for (int s = lane; s <= t; s += 32) dot += ToFloat(p[s]) * g[s];
  dot = WarpSum(dot);
  for (int s = lane; s < T; s += 32) out[s] = FromFloat<E>(s <= t ? ToFloat(p[s]) * (g[s] - dot) * scale : 0.0f);
}

// ---- Launchers ------------------------------------------------------------------------------------

Status LaunchSplitHeads(void* dst, long part_stride, const void* src, int B, int T, int NH, int hs, int parts,
                        DType dt, cudaStream_t stream) {
  const dim3 grid(Grid(long(B) * T * NH * hs), parts);
  return DispatchDType(dt, [&]<typename E>() {
    SplitHeadsKernel<E><<<grid, kBlock, 0, stream>>>(static_cast<E*>(dst), part_stride, static_cast<const E*>(src), B,
                                                     T, NH, hs, parts);
    return TF_CHECK_LAUNCH("SplitHeadsKernel");
  });
}

Status LaunchMergeHeads(void* dst, const void* src, long part_stride, int B, int T, int NH, int hs, int parts,
                        DType dt, cudaStream_t stream) {
  const dim3 grid(Grid(long(B) * T * NH * hs), parts);
  return DispatchDType(dt, [&]<typename E>() {
    MergeHeadsKernel<E><<<grid, kBlock, 0, stream>>>(static_cast<E*>(dst), static_cast<const E*>(src), part_stride, B,
                                                     T, NH, hs, parts);
    return TF_CHECK_LAUNCH("MergeHeadsKernel");
  });
}

Status LaunchSoftmax(void* att, const float* scores, long rows, int T, DType dt, cudaStream_t stream) {
  return DispatchDType(dt, [&]<typename E>() {
    CausalSoftmaxKernel<E><<<CeilDiv(rows, kWarpsPerBlock), kBlock, 0, stream>>>(static_cast<E*>(att), scores, rows, T);
    return TF_CHECK_LAUNCH("CausalSoftmaxKernel");
  });
}

Status LaunchSoftmaxBackward(void* ds, const float* dp, const void* att, long rows, int T, float scale, DType dt,
                             cudaStream_t stream) {
  return DispatchDType(dt, [&]<typename E>() {
    CausalSoftmaxBackwardKernel<E><<<CeilDiv(rows, kWarpsPerBlock), kBlock, 0, stream>>>(
        static_cast<E*>(ds), dp, static_cast<const E*>(att), rows, T, scale);
    return TF_CHECK_LAUNCH("CausalSoftmaxBackwardKernel");
  });
}

// One strided-batched GEMM in cuBLAS's column-major terms (see the table at the top): per batch i,
// C_i (m,n; ldc) = alpha op(A_i) op(B_i) + beta C_i. Types per operand; fp32 compute (no TF32: the
// context's math mode).
struct BatchedGemm {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  cudaDataType_t a_type = CUDA_R_32F;
  int lda = 0;
  long long stride_a = 0;
  const void* b = nullptr;
  cudaDataType_t b_type = CUDA_R_32F;
  int ldb = 0;
  long long stride_b = 0;
  void* c = nullptr;
  cudaDataType_t c_type = CUDA_R_32F;
  int ldc = 0;
  long long stride_c = 0;
  int batch = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
};

Status RunBatched(CublasContext& ctx, const BatchedGemm& g) {
  TF_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      ctx.blas(), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k,
      &g.alpha, g.a, g.a_type, g.lda, g.stride_a, g.b, g.b_type, g.ldb, g.stride_b, &g.beta, g.c, g.c_type, g.ldc,
      g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  ++ctx.stats().classic_gemms;
  return Status::OK();
}

// The scratch regions (byte offsets from the scratch base); see the layout at the top.
struct ScratchLayout {
  size_t q, k, v, h, dq, dk, dv;  // (B,NH,T,hs) of dt; h holds y (forward) or dy (backward)
  size_t scores;                  // (B,NH,T,T) floats: S (bf16 forward) and dP (backward)
  size_t ds;                      // (B,NH,T,T) of dt, bf16 mode only (fp32: dS overwrites dP)
  size_t total;
};

constexpr size_t kScratchAlign = 256;
size_t AlignUp(size_t x) { return (x + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

ScratchLayout Layout(int B, int T, int C, int NH, DType dt) {
  const size_t heads = AlignUp(size_t(B) * T * C * DTypeSize(dt));
  const size_t square = size_t(B) * NH * T * T;
  ScratchLayout l{};
  size_t off = 0;
  for (size_t* slot : {&l.q, &l.k, &l.v, &l.h, &l.dq, &l.dk, &l.dv}) {
    *slot = off;
    off += heads;
  }
  l.scores = off;
  off += AlignUp(square * sizeof(float));
  l.ds = off;
  if (dt != DType::kF32) off += AlignUp(square * DTypeSize(dt));
  l.total = off;
  return l;
}

Status CheckArgs(const char* op, int B, int T, int C, int NH, const void* scratch) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0) {
    return InvalidArgument(std::string(op) + ": bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " C=" + std::to_string(C) + " NH=" + std::to_string(NH) +
                           " (need positive sizes and C % NH == 0)");
  }
  if (long(B) * NH > 0x7fffffffL) return InvalidArgument(std::string(op) + ": B*NH exceeds int");
  if (scratch == nullptr) return InvalidArgument(std::string(op) + ": scratch must not be null");
  if (reinterpret_cast<uintptr_t>(scratch) % kScratchAlign != 0) {
    return InvalidArgument(std::string(op) + ": scratch must be 256-byte aligned");
  }
  return Status::OK();
}

}  // namespace

size_t attention_scratch_bytes(int B, int T, int C, int NH, DType dt) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return 0;
  return Layout(B, T, C, NH, dt).total;
}

Status attention_forward(CublasContext& ctx, void* out, void* att, const void* qkv, int B, int T, int C, int NH,
                         DType dt, void* scratch) {
  TF_RETURN_IF_ERROR(CheckArgs("attention_forward", B, T, C, NH, scratch));
  if (out == nullptr || att == nullptr || qkv == nullptr) {
    return InvalidArgument("attention_forward: out, att and qkv must not be null");
  }
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const ScratchLayout l = Layout(B, T, C, NH, dt);
  char* base = static_cast<char*>(scratch);
  void* q = base + l.q;
  void* k = base + l.k;
  void* v = base + l.v;
  void* y = base + l.h;
  const long part_stride = static_cast<long>((l.k - l.q) / DTypeSize(dt));  // q -> k -> v, in elements
  cudaStream_t stream = ctx.stream();
  TF_RETURN_IF_ERROR(LaunchSplitHeads(q, part_stride, qkv, B, T, NH, hs, 3, dt, stream));

  const cudaDataType_t type = CudaDataType(dt);
  const int batch = B * NH;
  const long long head_stride = static_cast<long long>(T) * hs;
  const long long square_stride = static_cast<long long>(T) * T;
  // fp32: S goes straight into att and the softmax runs in place; bf16: S in fp32 scratch.
  float* scores = dt == DType::kF32 ? static_cast<float*>(att) : reinterpret_cast<float*>(base + l.scores);

  // S^T = K Q^T, scaled (the buffer holds S row-major)
  const BatchedGemm qk{.trans_a = true, .m = T, .n = T, .k = hs,
                       .a = k, .a_type = type, .lda = hs, .stride_a = head_stride,
                       .b = q, .b_type = type, .ldb = hs, .stride_b = head_stride,
                       .c = scores, .c_type = CUDA_R_32F, .ldc = T, .stride_c = square_stride,
                       .batch = batch, .alpha = scale, .beta = 0.0f};
  TF_RETURN_IF_ERROR(RunBatched(ctx, qk));

  TF_RETURN_IF_ERROR(LaunchSoftmax(att, scores, long(batch) * T, T, dt, stream));

  // Y^T = V^T P^T
  const BatchedGemm pv{.m = hs, .n = T, .k = T,
                       .a = v, .a_type = type, .lda = hs, .stride_a = head_stride,
                       .b = att, .b_type = type, .ldb = T, .stride_b = square_stride,
                       .c = y, .c_type = type, .ldc = hs, .stride_c = head_stride,
                       .batch = batch, .alpha = 1.0f, .beta = 0.0f};
  TF_RETURN_IF_ERROR(RunBatched(ctx, pv));

  return LaunchMergeHeads(out, y, 0, B, T, NH, hs, 1, dt, stream);
}

Status attention_backward(CublasContext& ctx, void* dqkv, const void* dout, const void* qkv, const void* att, int B,
                          int T, int C, int NH, DType dt, void* scratch) {
  TF_RETURN_IF_ERROR(CheckArgs("attention_backward", B, T, C, NH, scratch));
  if (dqkv == nullptr || dout == nullptr || qkv == nullptr || att == nullptr) {
    return InvalidArgument("attention_backward: dqkv, dout, qkv and att must not be null");
  }
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const ScratchLayout l = Layout(B, T, C, NH, dt);
  char* base = static_cast<char*>(scratch);
  void* q = base + l.q;
  void* k = base + l.k;
  void* v = base + l.v;
  void* dy = base + l.h;
  void* dq = base + l.dq;
  void* dk = base + l.dk;
  void* dv = base + l.dv;
  const long part_stride = static_cast<long>((l.k - l.q) / DTypeSize(dt));  // q->k->v and dq->dk->dv
  cudaStream_t stream = ctx.stream();
  TF_RETURN_IF_ERROR(LaunchSplitHeads(q, part_stride, qkv, B, T, NH, hs, 3, dt, stream));
  TF_RETURN_IF_ERROR(LaunchSplitHeads(dy, 0, dout, B, T, NH, hs, 1, dt, stream));

  const cudaDataType_t type = CudaDataType(dt);
  const int batch = B * NH;
  const long long head_stride = static_cast<long long>(T) * hs;
  const long long square_stride = static_cast<long long>(T) * T;
  float* dp = reinterpret_cast<float*>(base + l.scores);
  // fp32: dS overwrites dP in place; bf16: dS (a GEMM input again) in its own bf16 region.
  void* ds = dt == DType::kF32 ? static_cast<void*>(dp) : static_cast<void*>(base + l.ds);

  // dV^T = dY^T P
  const BatchedGemm g_dv{.trans_b = true, .m = hs, .n = T, .k = T,
                         .a = dy, .a_type = type, .lda = hs, .stride_a = head_stride,
                         .b = att, .b_type = type, .ldb = T, .stride_b = square_stride,
                         .c = dv, .c_type = type, .ldc = hs, .stride_c = head_stride,
                         .batch = batch};
  TF_RETURN_IF_ERROR(RunBatched(ctx, g_dv));

  // dP^T = V dY^T (the buffer holds dP row-major), fp32 output
  const BatchedGemm g_dp{.trans_a = true, .m = T, .n = T, .k = hs,
                         .a = v, .a_type = type, .lda = hs, .stride_a = head_stride,
                         .b = dy, .b_type = type, .ldb = hs, .stride_b = head_stride,
                         .c = dp, .c_type = CUDA_R_32F, .ldc = T, .stride_c = square_stride,
                         .batch = batch};
  TF_RETURN_IF_ERROR(RunBatched(ctx, g_dp));

  TF_RETURN_IF_ERROR(LaunchSoftmaxBackward(ds, dp, att, long(batch) * T, T, scale, dt, stream));

  // dQ^T = K^T dS^T
  const BatchedGemm g_dq{.m = hs, .n = T, .k = T,
                         .a = k, .a_type = type, .lda = hs, .stride_a = head_stride,
                         .b = ds, .b_type = type, .ldb = T, .stride_b = square_stride,
                         .c = dq, .c_type = type, .ldc = hs, .stride_c = head_stride,
                         .batch = batch};
  TF_RETURN_IF_ERROR(RunBatched(ctx, g_dq));

  // dK^T = Q^T dS
  const BatchedGemm g_dk{.trans_b = true, .m = hs, .n = T, .k = T,
                         .a = q, .a_type = type, .lda = hs, .stride_a = head_stride,
                         .b = ds, .b_type = type, .ldb = T, .stride_b = square_stride,
                         .c = dk, .c_type = type, .ldc = hs, .stride_c = head_stride,
                         .batch = batch};
  TF_RETURN_IF_ERROR(RunBatched(ctx, g_dk));

  return LaunchMergeHeads(dqkv, dq, part_stride, B, T, NH, hs, 3, dt, stream);
}

}  // namespace tf::cuda
