// CUDA linear layers (kernels/matmul.h): cuBLASLt GEMMs with fused bias / GELU / residual / DGELU
// epilogues, a classic cuBLAS path with separate epilogue kernels, and a deterministic
// bias-gradient reduction.
//
// Each row-major product is issued as its column-major transpose (Y = X W^T as Y^T = W X^T), with
// no data movement. The fused GELU is the library's (the documented tanh form, not bit-identical to
// math::gelu); it needs OC % 8 == 0 and a 16-byte-aligned pre_gelu, otherwise the unfused path
// (BiasGeluKernel, math::gelu exactly) runs. A configuration cuBLASLt has no algorithm for runs
// the classic path (cublasGemmEx + epilogue kernels, any shape); real errors are returned. The
// heuristic is asked once per configuration and cached (CublasContext::lt_algo_cache). dbias is
// our own two-kernel fp32 column sum in a fixed order (BiasPartialSumKernel, BiasReduceKernel),
// not BGRADB: deterministic and accumulating.
// Operand mapping, each epilogue and why: docs/cuda.md, "kernels/matmul.cu".
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cublas_handle.h"
#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.h"
#include "kernels/math.h"
#include "kernels/matmul.h"

namespace tf::cuda {
namespace {

constexpr int kBlock = 256;

// Bias-gradient reduction geometry. A block covers kBiasTileCols consecutive channels (one warp
// wide, coalesced) and one slice of rows, kBiasTileRows rows at a time.
constexpr int kBiasTileCols = 32;
constexpr int kBiasTileRows = 8;
constexpr int kBiasRowsPerSlice = 512;  // target rows per slice...
constexpr int kBiasMaxSlices = 64;      // ...but never more slices than this (bounds the scratch)

int BiasSlices(int N) { return std::clamp((N + kBiasRowsPerSlice - 1) / kBiasRowsPerSlice, 1, kBiasMaxSlices); }

// ---- Kernels --------------------------------------------------------------------------------------

// The unfused epilogue over y (N,OC) = the GEMM result x W^T. bias (OC) may be null. With gelu:
// pre = y + b and out = gelu(y + b) (pre is y's buffer); without: out = y + b (out may be y).
template <typename T>
__global__ void BiasGeluKernel(T* out, T* pre, const T* bias, long n, int OC, bool gelu) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    float x = ToFloat(pre[i]);
    if (bias != nullptr) x += ToFloat(bias[i % OC]);
    if (gelu) {
      pre[i] = FromFloat<T>(x);
      out[i] = FromFloat<T>(math::gelu(x));
    } else {
      out[i] = FromFloat<T>(x);
    }
  }
}

// partial[slice][o] = sum of dout[r][o] over the rows r of slice blockIdx.y, in fp32.
// Block (kBiasTileCols, kBiasTileRows); grid (ceil(OC / kBiasTileCols), slices).
template <typename T>
__global__ void BiasPartialSumKernel(float* partial, const T* dout, int N, int OC, int rows_per_slice) {
  __shared__ float tile[kBiasTileRows][kBiasTileCols + 1];
  const int col = blockIdx.x * kBiasTileCols + threadIdx.x;
  const int r0 = blockIdx.y * rows_per_slice;
  const int r1 = min(N, r0 + rows_per_slice);
  float acc = 0.0f;
  if (col < OC) {
    for (int r = r0 + threadIdx.y; r < r1; r += kBiasTileRows) acc += ToFloat(dout[long(r) * OC + col]);
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float s = 0.0f;
    for (int y = 0; y < kBiasTileRows; ++y) s += tile[y][threadIdx.x];  // fixed order
    partial[long(blockIdx.y) * OC + col] = s;
  }
}

// dbias[o] += sum over slices (in order) of partial[slice][o].
template <typename T>
__global__ void BiasReduceKernel(T* dbias, const float* partial, int slices, int OC) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float s = 0.0f;
  for (int g = 0; g < slices; ++g) s += partial[long(g) * OC + col];
  dbias[col] = FromFloat<T>(ToFloat(dbias[col]) + s);
}

// ---- Launchers ------------------------------------------------------------------------------------

Status LaunchBiasGelu(void* out, void* pre, const void* bias, int N, int OC, bool gelu, DType dt,
                      cudaStream_t stream) {
  const long n = long(N) * OC;
  const unsigned grid = std::min<unsigned>(CeilDiv(n, kBlock), 65535u);
  return DispatchDType(dt, [&]<typename T>() {
    BiasGeluKernel<T><<<grid, kBlock, 0, stream>>>(static_cast<T*>(out), static_cast<T*>(pre),
                                                   static_cast<const T*>(bias), n, OC, gelu);
    return TF_CHECK_LAUNCH("BiasGeluKernel");
  });
}

Status LaunchBiasBackward(void* dbias, float* scratch, const void* dout, int N, int OC, DType dt,
                          cudaStream_t stream) {
  const int slices = BiasSlices(N);
  const int rows_per_slice = (N + slices - 1) / slices;
  return DispatchDType(dt, [&]<typename T>() {
    const dim3 grid(CeilDiv(OC, kBiasTileCols), slices), block(kBiasTileCols, kBiasTileRows);
    BiasPartialSumKernel<T><<<grid, block, 0, stream>>>(scratch, static_cast<const T*>(dout), N, OC, rows_per_slice);
    TF_RETURN_IF_ERROR(TF_CHECK_LAUNCH("BiasPartialSumKernel"));
    BiasReduceKernel<T><<<CeilDiv(OC, kBlock), kBlock, 0, stream>>>(static_cast<T*>(dbias), scratch, slices, OC);
    return TF_CHECK_LAUNCH("BiasReduceKernel");
  });
}

// ---- GEMMs ----------------------------------------------------------------------------------------

// One GEMM in cuBLAS's column-major terms: D (m,n; ldd) = alpha op(A) op(B) + beta C, op(A) (m,k),
// op(B) (k,n), C = D unless c is set (then C has D's shape and leading dimension). A is stored (k,m)
// when trans_a, else (m,k); B is stored (n,k) when trans_b, else (k,n).
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  void* d = nullptr;
  int ldd = 0;
  const void* c = nullptr;  // cuBLASLt only; the classic path requires c == nullptr or c == d
  float alpha = 1.0f;
  float beta = 0.0f;
};

// A cuBLASLt epilogue: kind, bias vector (m elements of the storage type), GELU aux matrix (m,n).
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

// Owners of cuBLASLt descriptors (destroyed on every return path).
template <typename H, cublasStatus_t (*Destroy)(H)>
struct LtObject {
  H h = nullptr;
  LtObject() = default;
  LtObject(const LtObject&) = delete;
  LtObject& operator=(const LtObject&) = delete;
  ~LtObject() {
    if (h != nullptr) Destroy(h);
  }
};
using LtDesc = LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <typename V>
Status SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  TF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
  return Status::OK();
}
template <typename V>
Status SetPref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  TF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  return Status::OK();
}

// The alignment (bytes, a power of two <= 256) every column of a matrix starts at: the common
// alignment of its base address and of its leading dimension in bytes. Told to the heuristic so
// that it never picks a kernel that assumes more (its default assumption is 256).
uint32_t MatrixAlignment(const void* p, int ld, DType dt) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(long(ld) * DTypeSize(dt));
  uint32_t a = 256;
  while (a > 1 && bits % a != 0) a >>= 1;
  return a;
}

// Status code LtMatmul uses for "cuBLASLt has no algorithm for this": the caller falls back.
constexpr StatusCode kNoLtAlgorithm = StatusCode::kUnimplemented;

std::string GemmName(const Gemm& g) {
  return "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k);
}

// D = alpha op(A) op(B) + beta C with epilogue e through cuBLASLt: fp32 compute and scale type (no
// TF32), split-K partials reduced in fp32. Returns kNoLtAlgorithm when no algorithm fits.
Status LtMatmul(CublasContext& ctx, const Gemm& g, const Epilogue& e, DType dt) {
  const cudaDataType_t type = CudaDataType(dt);
  LtDesc desc;
  TF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TF_RETURN_IF_ERROR(SetDesc(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, op_a));
  TF_RETURN_IF_ERROR(SetDesc(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, op_b));
  TF_RETURN_IF_ERROR(SetDesc(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(e.kind)));
  if (e.bias != nullptr) {
    TF_RETURN_IF_ERROR(SetDesc(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias));
    TF_RETURN_IF_ERROR(SetDesc(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(type)));
  }
  if (e.aux != nullptr) {
    TF_RETURN_IF_ERROR(SetDesc(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, e.aux));
    TF_RETURN_IF_ERROR(SetDesc(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, e.aux_ld));
  }

  // Layouts describe the stored matrices (before op): rows, cols, leading dimension.
  LtLayout la, lb, ld, lc;
  TF_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&la.h, type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
  TF_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&lb.h, type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
  TF_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&ld.h, type, g.m, g.n, g.ldd));
  TF_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&lc.h, type, g.m, g.n, g.ldd));
  const void* c = g.c != nullptr ? g.c : g.d;

  LtPreference pref;
  TF_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref.h));
  TF_RETURN_IF_ERROR(SetPref(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{ctx.workspace_bytes()}));
  // Split-K partial sums in the compute type (fp32) or none; never reduced in place in bf16.
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  TF_RETURN_IF_ERROR(SetPref(pref.h, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reductions));
  TF_RETURN_IF_ERROR(SetPref(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, MatrixAlignment(g.a, g.lda, dt)));
  TF_RETURN_IF_ERROR(SetPref(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, MatrixAlignment(g.b, g.ldb, dt)));
  TF_RETURN_IF_ERROR(SetPref(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, MatrixAlignment(c, g.ldd, dt)));
  TF_RETURN_IF_ERROR(SetPref(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, MatrixAlignment(g.d, g.ldd, dt)));

  // The algorithm: from the context's cache, keyed by everything the heuristic query sees, or asked
  // for once. (C == D with beta = 1 accumulates in place; C != D adds another matrix, a residual.)
  std::string key;
  for (long v : {long(dt), long(g.trans_a), long(g.trans_b), long(g.m), long(g.n), long(g.k), long(g.lda),
                 long(g.ldb), long(g.ldd), long(e.kind), long(e.bias != nullptr), long(e.aux != nullptr), long(e.aux_ld),
                 long(c != g.d), long(g.beta != 0.0f), long(MatrixAlignment(g.a, g.lda, dt)),
                 long(MatrixAlignment(g.b, g.ldb, dt)), long(MatrixAlignment(c, g.ldd, dt)),
                 long(MatrixAlignment(g.d, g.ldd, dt)), long(MatrixAlignment(e.bias, 0, dt)),
                 long(MatrixAlignment(e.aux, 0, dt))}) {
    key += std::to_string(v);
    key += ',';
  }
  auto& cache = ctx.lt_algo_cache();
  auto cached = cache.find(key);
  if (cached == cache.end()) {
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    ++ctx.stats().lt_heuristic_queries;
    cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(ctx.lt(), desc.h, la.h, lb.h, lc.h, ld.h, pref.h, 1,
                                                        &heuristic, &found);
    // NOT_SUPPORTED: no kernel for this configuration; INVALID_VALUE: a combination cuBLASLt rejects
    // (e.g. an epilogue for this type). Both fall back: the classic path reports arguments that are
    // invalid for it too.
    CublasContext::LtAlgo entry;
    if (hst == CUBLAS_STATUS_SUCCESS && found > 0 && heuristic.state == CUBLAS_STATUS_SUCCESS) {
      entry.found = true;
      entry.algo = heuristic.algo;
    } else if (hst != CUBLAS_STATUS_SUCCESS && hst != CUBLAS_STATUS_NOT_SUPPORTED && hst != CUBLAS_STATUS_INVALID_VALUE) {
      return CublasError(hst, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);  // a real error: not cached
    }
    cached = cache.emplace(key, entry).first;
  }
  if (!cached->second.found) {
    ++ctx.stats().lt_fallbacks;
    return Status(kNoLtAlgorithm, "cuBLASLt has no algorithm for " + GemmName(g));
  }
  cublasStatus_t st = cublasLtMatmul(ctx.lt(), desc.h, &g.alpha, g.a, la.h, g.b, lb.h, &g.beta, c, lc.h, g.d, ld.h,
                                     &cached->second.algo, ctx.workspace(), ctx.workspace_bytes(), ctx.stream());
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    cached->second.found = false;  // the same call would fail again: fall back from now on
    ++ctx.stats().lt_fallbacks;
    return Status(kNoLtAlgorithm, "cublasLtMatmul: not supported for " + GemmName(g));
  }
  if (st != CUBLAS_STATUS_SUCCESS) return CublasError(st, "cublasLtMatmul", __FILE__, __LINE__);
  ++ctx.stats().lt_gemms;
  return Status::OK();
}

// The same GEMM (no epilogue) through the classic handle: any shape, fp32 compute, no TF32 (the
// handle's math mode, set by CublasContext).
Status ClassicGemm(CublasContext& ctx, const Gemm& g, DType dt) {
  if (g.c != nullptr && g.c != g.d) return Error(StatusCode::kInternal, "ClassicGemm: C must be D");
  const cudaDataType_t type = CudaDataType(dt);
  TF_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(ctx.blas(), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &g.alpha, g.a, type,
                                         g.lda, g.b, type, g.ldb, &g.beta, g.d, type, g.ldd, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
  ++ctx.stats().classic_gemms;
  return Status::OK();
}

// A GEMM without epilogue: cuBLASLt when the context asks for it and has an algorithm, else classic.
Status PlainGemm(CublasContext& ctx, const Gemm& g, DType dt) {
  if (ctx.options().use_lt_epilogues) {
    Status s = LtMatmul(ctx, g, Epilogue{}, dt);
    if (s.code() != kNoLtAlgorithm) return s;  // done, or a real error
  }
  return ClassicGemm(ctx, g, dt);
}

Status CheckDims(const char* op, int N, int C, int OC) {
  if (N < 0 || C <= 0 || OC <= 0) {
    return InvalidArgument(std::string(op) + ": bad shape N=" + std::to_string(N) + " C=" + std::to_string(C) +
                           " OC=" + std::to_string(OC) + " (need N >= 0, C > 0, OC > 0)");
  }
  return Status::OK();
}

}  // namespace

long matmul_dbias_scratch_floats(int N, int OC) { return long(BiasSlices(std::max(N, 1))) * std::max(OC, 0); }

Status matmul_forward(CublasContext& ctx, void* out, const void* inp, const void* weight, const void* bias, int N,
                      int C, int OC, DType dt, void* pre_gelu, const void* residual) {
  TF_RETURN_IF_ERROR(CheckDims("matmul_forward", N, C, OC));
  if (out == nullptr || inp == nullptr || weight == nullptr) {
    return InvalidArgument("matmul_forward: out, inp and weight must not be null");
  }
  if (pre_gelu == out) return InvalidArgument("matmul_forward: pre_gelu must not alias out");
  if (pre_gelu != nullptr && residual != nullptr) {
    return InvalidArgument("matmul_forward: a residual cannot be combined with the fused GELU");
  }
  if (N == 0) return Status::OK();
  const bool gelu = pre_gelu != nullptr;

  // out^T (OC,N) = W (OC,C) . inp^T (C,N): A = weight stored column-major (C,OC), transposed.
  Gemm g;
  g.trans_a = true;
  g.trans_b = false;
  g.m = OC;
  g.n = N;
  g.k = C;
  g.a = weight;
  g.lda = C;
  g.b = inp;
  g.ldb = C;
  g.ldd = OC;
  g.alpha = 1.0f;
  g.beta = residual != nullptr ? 1.0f : 0.0f;

  // cuBLASLt's aux matrix needs a leading dimension divisible by 8 (and we ask 16-byte alignment).
  const bool fusable = !gelu || (OC % 8 == 0 && reinterpret_cast<uintptr_t>(pre_gelu) % 16 == 0);
  if (ctx.options().use_lt_epilogues && fusable) {
    Epilogue e;
    e.bias = bias;
    if (gelu) {
      e.kind = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      e.aux = pre_gelu;
      e.aux_ld = OC;
    } else if (bias != nullptr) {
      e.kind = CUBLASLT_EPILOGUE_BIAS;
    }
    g.d = out;
    g.c = residual;
    Status s = LtMatmul(ctx, g, e, dt);
    if (s.code() != kNoLtAlgorithm) return s;  // done, or a real error
  }

  // Unfused: the GEMM into pre_gelu (GELU) or out (accumulating onto the residual copied there),
  // then bias and GELU in one elementwise pass.
  g.d = gelu ? pre_gelu : out;
  g.c = nullptr;
  if (residual != nullptr && residual != out) {
    TF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, residual, size_t(N) * OC * DTypeSize(dt), cudaMemcpyDeviceToDevice,
                                            ctx.stream()));
  }
  TF_RETURN_IF_ERROR(PlainGemm(ctx, g, dt));
  if (!gelu && bias == nullptr) return Status::OK();
  return LaunchBiasGelu(out, g.d, bias, N, OC, gelu, dt, ctx.stream());
}

Status matmul_backward(CublasContext& ctx, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int C, int OC, DType dt, float* dbias_scratch,
                       const MatmulBackwardOptions& options) {
  TF_RETURN_IF_ERROR(CheckDims("matmul_backward", N, C, OC));
  const void* dgelu_pre = options.dgelu_pre;
  if (dgelu_pre != nullptr && (options.accumulate_dinp || dinp == nullptr || dinp == dgelu_pre)) {
    return InvalidArgument("matmul_backward: dgelu_pre needs a separate dinp that is overwritten (accumulate_dinp "
                           "false)");
  }
  if (dweight == nullptr || dout == nullptr || inp == nullptr) {
    return InvalidArgument("matmul_backward: dweight, dout and inp must not be null");
  }
  if (dinp != nullptr && weight == nullptr) return InvalidArgument("matmul_backward: dinp needs weight");
  if (dbias != nullptr && dbias_scratch == nullptr) {
    return InvalidArgument("matmul_backward: dbias needs dbias_scratch (matmul_dbias_scratch_floats(N, OC) floats)");
  }
  if (N == 0) return Status::OK();

  if (dinp != nullptr) {
    // dinp^T (C,N) += W^T (C,OC) . dout^T (OC,N): A = weight stored column-major (C,OC), B = dout
    // stored column-major (OC,N).
    Gemm g;
    g.m = C;
    g.n = N;
    g.k = OC;
    g.a = weight;
    g.lda = C;
    g.b = dout;
    g.ldb = OC;
    g.d = dinp;
    g.ldd = C;
    g.alpha = 1.0f;
    g.beta = options.accumulate_dinp ? 1.0f : 0.0f;
    if (dgelu_pre == nullptr) {
      TF_RETURN_IF_ERROR(PlainGemm(ctx, g, dt));
    } else {
      bool fused = false;
      // The aux matrix (dgelu_pre, (N,C) row-major = (C,N) column-major, ld C) has the same shape as
      // dinp; cuBLASLt needs its leading dimension divisible by 8.
      if (ctx.options().use_lt_epilogues && C % 8 == 0 && reinterpret_cast<uintptr_t>(dgelu_pre) % 16 == 0) {
        Epilogue e;
        e.kind = CUBLASLT_EPILOGUE_DGELU;
        e.aux = const_cast<void*>(dgelu_pre);  // read-only for DGELU
        e.aux_ld = C;
        Status s = LtMatmul(ctx, g, e, dt);
        if (s.code() != kNoLtAlgorithm) TF_RETURN_IF_ERROR(s);
        fused = s.ok();
      }
      if (!fused) {
        TF_RETURN_IF_ERROR(PlainGemm(ctx, g, dt));
        TF_RETURN_IF_ERROR(gelu_backward(dinp, dgelu_pre, dinp, long(N) * C, dt, ctx.stream()));
      }
    }
  }
  {
    // dweight^T (C,OC) += inp^T (C,N) . dout (N,OC): A = inp stored column-major (C,N), B = dout
    // stored column-major (OC,N), transposed.
    Gemm g;
    g.trans_b = true;
    g.m = C;
    g.n = OC;
    g.k = N;
    g.a = inp;
    g.lda = C;
    g.b = dout;
    g.ldb = OC;
    g.d = dweight;
    g.ldd = C;
    g.alpha = 1.0f;
    g.beta = 1.0f;
    TF_RETURN_IF_ERROR(PlainGemm(ctx, g, dt));
  }
  if (dbias != nullptr) TF_RETURN_IF_ERROR(LaunchBiasBackward(dbias, dbias_scratch, dout, N, OC, dt, ctx.stream()));
  return Status::OK();
}

}  // namespace tf::cuda
