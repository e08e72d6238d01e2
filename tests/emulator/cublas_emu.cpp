// cublas_emu: a CPU implementation of the part of the cuBLAS and cuBLASLt C APIs that TrainFlow
// calls, for the CUDA emulator (tests/emulator/cuemu.h): emulator binaries link this file instead
// of libcublas / libcublasLt; the functions carry the real headers' exported names.
//
// Semantics are cuBLAS's (column-major, D = epilogue(alpha op(A) op(B) + beta C)); every call runs
// to completion on the calling host thread (the stream is only recorded). fp32 accumulation in k
// order and one rounding to D's type, bit-identical for any thread count; GELU is the documented
// tanh form; the FAST_TF32 / _16BF / _16F compute types round A and B first. Unsupported types and
// epilogues return CUBLAS_STATUS_NOT_SUPPORTED, undefined functions fail to link; bad arguments get
// the real library's status, and what would fault on a GPU (null, misaligned, out-of-allocation
// operands) an error explained on stderr. Full lists: docs/cuda.md, "tests/emulator/cublas_emu.cpp".
//
// Thread safety: as cuBLAS's: handles and descriptors may be used from several threads as long as
// one is not changed while another thread uses it. GEMMs parallelise over columns of D with OpenMP
// when it is enabled.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "base/float16.h"

// The opaque handle types the headers declare (cublasHandle_t = cublasContext*, cublasLtHandle_t =
// cublasLtContext*). cuBLAS documents that a cublasHandle_t may be cast to a cublasLtHandle_t, so
// both begin with the magic word that identifies a live handle.
struct cublasContext {
  uint64_t magic;
  cudaStream_t stream;
  void* workspace;  // nullptr: the library's default pool
  size_t workspace_bytes;
  cublasMath_t math_mode;
  cublasPointerMode_t pointer_mode;
  cublasAtomicsMode_t atomics_mode;
};
struct cublasLtContext {
  uint64_t magic;
};

// Optional hooks into the emulator runtime (tests/emulator/cuemu_runtime.cpp). Weak: null when not
// defined, and the corresponding checks are skipped.
namespace cuemu {
// true when [p, p + bytes) lies inside one live device allocation.
bool InAllocation(const void* p, size_t bytes) __attribute__((weak));
// true when s is the default stream or a live stream.
bool ValidStream(cudaStream_t s) __attribute__((weak));
}  // namespace cuemu

namespace {

constexpr uint64_t kBlasMagic = 0x62616c6273756d65;  // live cublasHandle_t
constexpr uint64_t kLtMagic = 0x746c6273756d6531;    // live cublasLtHandle_t
constexpr uint64_t kDescMagic = 0x63736564756d6531;  // live matmul descriptor
constexpr uint64_t kLayoutMagic = 0x74756f6c756d6531;
constexpr uint64_t kPrefMagic = 0x66657270756d6531;
constexpr uint64_t kAlgoMagic = 0x6f676c61756d6531;  // an algorithm this file's heuristic returned
constexpr uint64_t kDead = 0xdeaddeaddeaddeadULL;   // written into destroyed objects

// ---- Diagnostics ----------------------------------------------------------------------------------

bool LogEnabled() {
  static const bool on = [] {
    const char* lt = std::getenv("CUBLASLT_LOG_LEVEL");
    const char* blas = std::getenv("CUBLAS_LOGINFO_DBG");
    return (lt != nullptr && std::atoi(lt) >= 1) || (blas != nullptr && std::atoi(blas) == 1);
  }();
  return on;
}

void Print(const char* fn, const char* fmt, va_list args) {
  char msg[512];
  std::vsnprintf(msg, sizeof(msg), fmt, args);
  std::fprintf(stderr, "cublas_emu: %s: %s\n", fn, msg);
}

// The reason for an error status the real library also returns; printed only when logging is on.
cublasStatus_t Fail(cublasStatus_t status, const char* fn, const char* fmt, ...) {
  if (LogEnabled()) {
    va_list args;
    va_start(args, fmt);
    Print(fn, fmt, args);
    va_end(args);
  }
  return status;
}

// A call that would fault or corrupt memory on a GPU: always printed.
cublasStatus_t Misuse(cublasStatus_t status, const char* fn, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  Print(fn, fmt, args);
  va_end(args);
  return status;
}

// ---- Element types --------------------------------------------------------------------------------

bool IsFloatType(int t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }

size_t ElementBytes(int t) { return t == CUDA_R_32F ? 4 : 2; }  // of the types IsFloatType accepts

// The cudaDataType_t values the headers define (anything else is not a type at all).
bool IsKnownType(int t) { return t >= CUDA_R_32F && t <= CUDA_R_4F_E2M1; }

using ::tf::Bf16ToFloat;  // base/float16.h: the same bits as cvt.rn.bf16.f32 / __float2half_rn
using ::tf::FloatToBf16;
using ::tf::FloatToHalf;
using ::tf::HalfToFloat;

// TF32 keeps 10 mantissa bits; "input conversion rounds to nearest even" (cublasMath_t).
float RoundToTf32(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;  // inf, NaN
  return std::bit_cast<float>((u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu);
}

// How A and B are rounded before the products (the FAST compute types, the TF32 math mode).
enum class InputRounding { kNone, kTf32, kBf16, kFp16 };

float RoundInput(float x, InputRounding r) {
  switch (r) {
    case InputRounding::kNone: return x;
    case InputRounding::kTf32: return RoundToTf32(x);
    case InputRounding::kBf16: return Bf16ToFloat(FloatToBf16(x));
    case InputRounding::kFp16: return HalfToFloat(FloatToHalf(x));
  }
  return x;
}

// out[i] = element start + i * stride of base, as float.
void LoadVector(const void* base, int type, int64_t start, int64_t stride, int64_t count, float* out) {
  if (type == CUDA_R_32F) {
    const float* p = static_cast<const float*>(base) + start;
    for (int64_t i = 0; i < count; ++i) out[i] = p[i * stride];
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + start;
    if (type == CUDA_R_16BF) {
      for (int64_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(p[i * stride]);
    } else {
      for (int64_t i = 0; i < count; ++i) out[i] = HalfToFloat(p[i * stride]);
    }
  }
}

// Element start + i * stride of base = in[i], rounded to the element type.
void StoreVector(void* base, int type, int64_t start, int64_t stride, int64_t count, const float* in) {
  if (type == CUDA_R_32F) {
    float* p = static_cast<float*>(base) + start;
    for (int64_t i = 0; i < count; ++i) p[i * stride] = in[i];
  } else {
    uint16_t* p = static_cast<uint16_t*>(base) + start;
    if (type == CUDA_R_16BF) {
      for (int64_t i = 0; i < count; ++i) p[i * stride] = FloatToBf16(in[i]);
    } else {
      for (int64_t i = 0; i < count; ++i) p[i * stride] = FloatToHalf(in[i]);
    }
  }
}

// ---- GELU (the tanh approximation cuBLASLt documents for its epilogues) ---------------------------

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

float Gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x))); }

// d/dx of Gelu.
float GeluGrad(float x) {
  const float t = std::tanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// ---- The GEMM engine ------------------------------------------------------------------------------

// A strided view of a matrix: element (r, c) is element r * rs + c * cs of p.
struct View {
  const void* p = nullptr;
  int type = CUDA_R_32F;
  int64_t rs = 1;
  int64_t cs = 0;
};

// The epilogue, decoded: what happens to x = alpha op(A) op(B) + beta C, in this order.
struct Epilogue {
  bool bias = false;      // x += bias[i] (bias_in, m elements)
  bool aux_out = false;   // aux(i, j) = x (GELU input, stored)
  bool gelu = false;      // x = gelu(x)
  bool relu = false;      // x = max(x, 0)
  bool dgelu = false;     // x *= gelu'(aux(i, j)) (aux read)
  enum class Grad { kNone, kD, kA, kB } bgrad = Grad::kNone;  // bias gradient into bias_out
  const void* bias_in = nullptr;
  void* bias_out = nullptr;
  int bias_type = CUDA_R_32F;
  void* aux = nullptr;  // column-major, leading dimension aux_ld
  int aux_type = CUDA_R_32F;
  int64_t aux_ld = 0;
};

struct Gemm {
  int64_t m = 0, n = 0, k = 0;
  View a;  // op(A), m x k
  View b;  // op(B), k x n
  View c;  // m x n (read when beta != 0)
  void* d = nullptr;  // m x n, same element type as c
  int d_type = CUDA_R_32F;
  int64_t d_rs = 1, d_cs = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* alpha_vec = nullptr;  // per-row alpha (m), replaces alpha when set
  const float* beta_vec = nullptr;   // per-row beta (m), replaces beta when set
  InputRounding rounding = InputRounding::kNone;
  Epilogue epi;
};

constexpr int64_t kRowBlock = 256;  // rows of D per accumulator block (4 columns of it stay in L1)
constexpr int64_t kColBlock = 4;    // columns of D per block: each loaded element of A feeds 4 sums

// af (m x k, column-major, leading dimension m) = op(A) as float; likewise bf (k x n) = op(B).
std::vector<float> Pack(const View& v, int64_t rows, int64_t cols, InputRounding rounding) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < cols; ++c) {
    float* col = out.data() + c * rows;
    LoadVector(v.p, v.type, c * v.cs, v.rs, rows, col);
    if (rounding != InputRounding::kNone) {
      for (int64_t r = 0; r < rows; ++r) col[r] = RoundInput(col[r], rounding);
    }
  }
  return out;
}

// acc[c * kRowBlock + i] = sum over kk (in order) of af(i0 + i, kk) * bf(kk, j0 + c), for i < rows,
// c < cols.
void DotBlock(const float* __restrict af, int64_t m, const float* __restrict bf, int64_t k, int64_t i0, int64_t rows,
              int64_t j0, int64_t cols, float* __restrict acc) {
  std::fill(acc, acc + kColBlock * kRowBlock, 0.0f);
  if (cols == kColBlock) {
    float* __restrict c0 = acc;
    float* __restrict c1 = acc + kRowBlock;
    float* __restrict c2 = acc + 2 * kRowBlock;
    float* __restrict c3 = acc + 3 * kRowBlock;
    const float* b = bf + j0 * k;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* __restrict a = af + kk * m + i0;
      const float b0 = b[kk], b1 = b[k + kk], b2 = b[2 * k + kk], b3 = b[3 * k + kk];
#pragma omp simd
      for (int64_t i = 0; i < rows; ++i) {
        const float x = a[i];
        c0[i] += x * b0;
        c1[i] += x * b1;
        c2[i] += x * b2;
        c3[i] += x * b3;
      }
    }
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    float* __restrict out = acc + c * kRowBlock;
    const float* b = bf + (j0 + c) * k;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* __restrict a = af + kk * m + i0;
      const float bv = b[kk];
#pragma omp simd
      for (int64_t i = 0; i < rows; ++i) out[i] += a[i] * bv;
    }
  }
}

// Applies scaling, C and the epilogue to x = rows i0.. i0+len of column j of the product, and
// stores D (and aux). dres (m x n floats) receives the final values for the DGELU_BGRAD reduction.
void Finish(const Gemm& g, const float* bias, int64_t i0, int64_t len, int64_t j, float* x, float* tmp, float* dres) {
  const Epilogue& e = g.epi;
  if (g.alpha_vec != nullptr) {
    for (int64_t i = 0; i < len; ++i) x[i] *= g.alpha_vec[i0 + i];
  } else {
    for (int64_t i = 0; i < len; ++i) x[i] *= g.alpha;
  }
  if (g.beta_vec != nullptr || g.beta != 0.0f) {  // beta == 0: C is not read
    LoadVector(g.c.p, g.c.type, i0 * g.c.rs + j * g.c.cs, g.c.rs, len, tmp);
    for (int64_t i = 0; i < len; ++i) {
      const float beta = g.beta_vec != nullptr ? g.beta_vec[i0 + i] : g.beta;
      if (beta != 0.0f) x[i] += beta * tmp[i];
    }
  }
  if (e.bias) {
    for (int64_t i = 0; i < len; ++i) x[i] += bias[i0 + i];
  }
  if (e.aux_out) StoreVector(e.aux, e.aux_type, i0 + j * e.aux_ld, 1, len, x);
  if (e.gelu) {
    for (int64_t i = 0; i < len; ++i) x[i] = Gelu(x[i]);
  }
  if (e.relu) {
    for (int64_t i = 0; i < len; ++i) x[i] = std::fmax(x[i], 0.0f);
  }
  if (e.dgelu) {
    LoadVector(e.aux, e.aux_type, i0 + j * e.aux_ld, 1, len, tmp);
    for (int64_t i = 0; i < len; ++i) x[i] *= GeluGrad(tmp[i]);
  }
  StoreVector(g.d, g.d_type, i0 * g.d_rs + j * g.d_cs, g.d_rs, len, x);
  if (dres != nullptr) std::copy(x, x + len, dres + j * g.m + i0);
}

// Runs one (non-batched) GEMM. Preconditions: arguments validated, m, n > 0.
void RunGemm(const Gemm& g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  const Epilogue& e = g.epi;
  // alpha == 0 (a scalar) or k == 0: the product is not computed (A and B are not read).
  const bool product = k > 0 && (g.alpha_vec != nullptr || g.alpha != 0.0f);
  std::vector<float> af, bf;
  if (product) {
    af = Pack(g.a, m, k, g.rounding);
    bf = Pack(g.b, k, n, g.rounding);
  }
  std::vector<float> bias;
  if (e.bias) {
    bias.resize(static_cast<size_t>(m));
    LoadVector(e.bias_in, e.bias_type, 0, 1, m, bias.data());
  }
  std::vector<float> dres;
  if (e.bgrad == Epilogue::Grad::kD) dres.resize(static_cast<size_t>(m * n));

  const int64_t col_blocks = (n + kColBlock - 1) / kColBlock;
#pragma omp parallel
  {
    std::vector<float> acc(kColBlock * kRowBlock), tmp(kRowBlock);
#pragma omp for schedule(static)
    for (int64_t jb = 0; jb < col_blocks; ++jb) {
      const int64_t j0 = jb * kColBlock;
      const int64_t cols = std::min(kColBlock, n - j0);
      for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, m - i0);
        if (product) {
          DotBlock(af.data(), m, bf.data(), k, i0, rows, j0, cols, acc.data());
        } else {
          std::fill(acc.begin(), acc.end(), 0.0f);
        }
        for (int64_t c = 0; c < cols; ++c) {
          Finish(g, bias.data(), i0, rows, j0 + c, acc.data() + c * kRowBlock, tmp.data(),
                 dres.empty() ? nullptr : dres.data());
        }
      }
    }
  }

  // Bias gradients: one float sum per element, in index order.
  if (e.bgrad == Epilogue::Grad::kNone) return;
  const int64_t len = e.bgrad == Epilogue::Grad::kB ? n : m;
  std::vector<float> grad(static_cast<size_t>(len), 0.0f);
  std::vector<float> col(static_cast<size_t>(std::max(m, k)));
  switch (e.bgrad) {
    case Epilogue::Grad::kD:  // DGELU_BGRAD: rows of D summed over its columns
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < m; ++i) grad[i] += dres[j * m + i];
      }
      break;
    case Epilogue::Grad::kA:  // BGRADA: rows of op(A) summed over k
      for (int64_t kk = 0; kk < k; ++kk) {
        LoadVector(g.a.p, g.a.type, kk * g.a.cs, g.a.rs, m, col.data());
        for (int64_t i = 0; i < m; ++i) grad[i] += col[i];
      }
      break;
    case Epilogue::Grad::kB:  // BGRADB: columns of op(B) summed over k
      for (int64_t j = 0; j < n; ++j) {
        LoadVector(g.b.p, g.b.type, j * g.b.cs, g.b.rs, k, col.data());
        for (int64_t kk = 0; kk < k; ++kk) grad[j] += col[kk];
      }
      break;
    case Epilogue::Grad::kNone: break;
  }
  StoreVector(e.bias_out, e.bias_type, 0, 1, len, grad.data());
}

// ---- Operand checks (the emulator's, where a GPU would fault) -----------------------------------

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether the elements (r, c), r < rows, c < cols, of every batch b < batch, at offset
// r * rs + c * cs + b * bs elements of p, lie inside one live device allocation (true without the
// cuemu::InAllocation hook or without elements).
bool InDeviceMemory(const void* p, int type, int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t batch = 1,
                    int64_t bs = 0) {
  if (cuemu::InAllocation == nullptr || rows <= 0 || cols <= 0 || batch <= 0) return true;
  int64_t lo = 0, hi = 0;
  for (int64_t step : {(rows - 1) * rs, (cols - 1) * cs, (batch - 1) * bs}) (step < 0 ? lo : hi) += step;
  const int64_t size = static_cast<int64_t>(ElementBytes(type));
  return cuemu::InAllocation(static_cast<const char*>(p) + lo * size, static_cast<size_t>((hi - lo + 1) * size));
}

// Checks a matrix operand: not null, aligned to its element, inside device memory.
cublasStatus_t CheckOperand(const char* fn, const char* name, const void* p, int type, int64_t rows, int64_t cols,
                            int64_t rs, int64_t cs, int64_t batch = 1, int64_t bs = 0) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return CUBLAS_STATUS_SUCCESS;
  if (p == nullptr) return Misuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s is null", name);
  if (!Aligned(p, ElementBytes(type))) {
    return Misuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s (%p) is not aligned to its element size", name, p);
  }
  if (!InDeviceMemory(p, type, rows, cols, rs, cs, batch, bs)) {
    return Misuse(CUBLAS_STATUS_EXECUTION_FAILED, fn,
                  "%s (%p, %lld x %lld, strides %lld/%lld, batch %lld stride %lld) is not inside a live device "
                  "allocation",
                  name, p, static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(rs),
                  static_cast<long long>(cs), static_cast<long long>(batch), static_cast<long long>(bs));
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CheckStream(const char* fn, cudaStream_t s) {
  if (cuemu::ValidStream != nullptr && !cuemu::ValidStream(s)) {
    return Misuse(CUBLAS_STATUS_EXECUTION_FAILED, fn, "stream %p is not a live stream", static_cast<void*>(s));
  }
  return CUBLAS_STATUS_SUCCESS;
}

#define EMU_RETURN_IF_ERROR(expr)                        \
  do {                                                   \
    const cublasStatus_t emu_st_ = (expr);               \
    if (emu_st_ != CUBLAS_STATUS_SUCCESS) return emu_st_; \
  } while (0)

// ---- Classic cuBLAS -------------------------------------------------------------------------------

bool LiveBlas(cublasHandle_t h) { return h != nullptr && h->magic == kBlasMagic; }

bool IsOp(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

bool IsGemmAlgo(int algo) {
  return algo == CUBLAS_GEMM_DEFAULT || (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
         (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP) ||
         algo == CUBLAS_GEMM_AUTOTUNE;
}

bool IsComputeType(int c) {
  switch (c) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT:
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: return true;
  }
  return false;
}

// The input rounding a compute type implies, or false when this file does not implement it with
// the given storage types (Atype = Btype = ab, Ctype = Dtype = cd): the CUBLAS_COMPUTE_32F rows of
// the cublasGemmEx / cublasLtMatmul type tables.
bool ComputeRounding(int compute, int ab, int cd, InputRounding* rounding) {
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      *rounding = InputRounding::kNone;
      return (ab == CUDA_R_32F && cd == CUDA_R_32F) || (ab == CUDA_R_16BF && (cd == CUDA_R_16BF || cd == CUDA_R_32F)) ||
             (ab == CUDA_R_16F && (cd == CUDA_R_16F || cd == CUDA_R_32F));
    case CUBLAS_COMPUTE_32F_FAST_16F: *rounding = InputRounding::kFp16; break;
    case CUBLAS_COMPUTE_32F_FAST_16BF: *rounding = InputRounding::kBf16; break;
    case CUBLAS_COMPUTE_32F_FAST_TF32: *rounding = InputRounding::kTf32; break;
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9: *rounding = InputRounding::kNone; break;
    default: return false;
  }
  return ab == CUDA_R_32F && cd == CUDA_R_32F;
}

// cublasGemmEx / cublasGemmStridedBatchedEx (batch = 1 for the former).
cublasStatus_t ClassicGemm(const char* fn, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                           int64_t m, int64_t n, int64_t k, const void* alpha, const void* A, cudaDataType Atype,
                           int64_t lda, long long stride_a, const void* B, cudaDataType Btype, int64_t ldb,
                           long long stride_b, const void* beta, void* C, cudaDataType Ctype, int64_t ldc,
                           long long stride_c, int64_t batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (!LiveBlas(handle)) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle is not a live cuBLAS handle");
  if (m < 0 || n < 0 || k < 0 || batch < 0) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "negative size (m %lld, n %lld, k %lld, batch %lld)",
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(batch));
  }
  if (!IsOp(transa) || !IsOp(transb)) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "transa/transb not N, T or C");
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (lda < std::max<int64_t>(1, ta ? k : m) || ldb < std::max<int64_t>(1, tb ? n : k) ||
      ldc < std::max<int64_t>(1, m)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "leading dimension too small (lda %lld, ldb %lld, ldc %lld)",
                static_cast<long long>(lda), static_cast<long long>(ldb), static_cast<long long>(ldc));
  }
  if (alpha == nullptr || beta == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha or beta is null");
  if (!IsKnownType(Atype) || !IsKnownType(Btype) || !IsKnownType(Ctype) || !IsComputeType(compute) ||
      !IsGemmAlgo(algo)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a data type, compute type or algorithm");
  }
  InputRounding rounding = InputRounding::kNone;
  if (Atype != Btype || !ComputeRounding(compute, Atype, Ctype, &rounding)) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "types A %d, B %d, C %d with compute type %d are not supported",
                Atype, Btype, Ctype, compute);
  }
  // The handle's math mode accelerates CUBLAS_COMPUTE_32F (not _PEDANTIC) fp32 GEMMs: TF32, or
  // (the deprecated CUBLAS_TENSOR_OP_MATH) as CUBLAS_COMPUTE_32F_FAST_16F.
  if (compute == CUBLAS_COMPUTE_32F && Atype == CUDA_R_32F && Ctype == CUDA_R_32F) {
    const int math = handle->math_mode & 0xf;
    if (math == CUBLAS_TF32_TENSOR_OP_MATH) rounding = InputRounding::kTf32;
    if (math == CUBLAS_TENSOR_OP_MATH) rounding = InputRounding::kFp16;
  }
  // Both pointer modes name memory the host can read here.
  const float a = *static_cast<const float*>(alpha);
  const float b = *static_cast<const float*>(beta);
  if (b != 0.0f && C == nullptr && m > 0 && n > 0) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C is null, beta != 0");
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;

  const bool product = k > 0 && a != 0.0f;
  if (product) {
    EMU_RETURN_IF_ERROR(CheckOperand(fn, "A", A, Atype, ta ? k : m, ta ? m : k, 1, lda, batch, stride_a));
    EMU_RETURN_IF_ERROR(CheckOperand(fn, "B", B, Btype, tb ? n : k, tb ? k : n, 1, ldb, batch, stride_b));
  }
  EMU_RETURN_IF_ERROR(CheckOperand(fn, "C", C, Ctype, m, n, 1, ldc, batch, stride_c));
  EMU_RETURN_IF_ERROR(CheckStream(fn, handle->stream));

  for (int64_t i = 0; i < batch; ++i) {
    Gemm g;
    g.m = m;
    g.n = n;
    g.k = k;
    const size_t ea = ElementBytes(Atype), eb = ElementBytes(Btype), ec = ElementBytes(Ctype);
    g.a = {static_cast<const char*>(A) + i * stride_a * static_cast<int64_t>(ea), Atype, ta ? lda : 1, ta ? 1 : lda};
    g.b = {static_cast<const char*>(B) + i * stride_b * static_cast<int64_t>(eb), Btype, tb ? ldb : 1, tb ? 1 : ldb};
    char* c = static_cast<char*>(C) + i * stride_c * static_cast<int64_t>(ec);
    g.c = {c, Ctype, 1, ldc};
    g.d = c;
    g.d_type = Ctype;
    g.d_rs = 1;
    g.d_cs = ldc;
    g.alpha = a;
    g.beta = b;
    g.rounding = rounding;
    RunGemm(g);
  }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt descriptors -------------------------------------------------------------------------

struct LayoutDesc {
  uint64_t magic;
  uint32_t type;
  int32_t order;
  uint64_t rows;
  uint64_t cols;
  int64_t ld;
  int32_t batch_count;
  uint32_t batch_mode;
  int64_t batch_stride;
  int64_t plane_offset;
};
static_assert(sizeof(LayoutDesc) <= sizeof(cublasLtMatrixLayoutOpaque_t));

struct MatmulDesc {
  uint64_t magic;
  int32_t compute_type;
  int32_t scale_type;
  int32_t pointer_mode;
  int32_t transa;
  int32_t transb;
  int32_t transc;
  int32_t fill_mode;
  uint32_t epilogue;
  const void* bias;
  int64_t bias_batch_stride;
  void* aux;
  int64_t aux_ld;
  int64_t aux_batch_stride;
  int64_t alpha_vector_batch_stride;
  int32_t sm_count_target;
  int32_t aux_type;
  const void* a_scale;
  const void* b_scale;
  const void* c_scale;
  const void* d_scale;
  void* amax_d;
  void* aux_scale;
  void* aux_amax;
  int8_t fast_accum;
  int32_t bias_type;
  int32_t a_scale_mode;
  int32_t b_scale_mode;
  int32_t c_scale_mode;
  int32_t d_scale_mode;
  int32_t aux_scale_mode;
  int32_t d_out_scale_mode;
  void* d_out_scale;
  void* emulation;
};
static_assert(sizeof(MatmulDesc) <= sizeof(cublasLtMatmulDescOpaque_t));

struct PreferenceDesc {
  uint64_t magic;
  uint32_t search_mode;
  uint32_t reduction_mask;
  uint64_t max_workspace;
  uint32_t align[4];  // minimum alignment of A, B, C, D in bytes
  float max_waves;
  uint64_t impl_mask;
};
static_assert(sizeof(PreferenceDesc) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

// The descriptor types' storage is the headers' opaque structs; these objects live in it.
template <typename T, typename Opaque>
T* Get(Opaque* o, uint64_t magic) {
  if (o == nullptr) return nullptr;
  T* t = std::launder(reinterpret_cast<T*>(o));
  return t->magic == magic ? t : nullptr;
}

template <typename Opaque, typename T>
Opaque* Construct(void* storage, const T& value) {
  new (storage) T(value);
  return static_cast<Opaque*>(storage);
}

template <typename Opaque, typename T>
cublasStatus_t Create(Opaque** out, const T& value) {
  if (out == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  void* storage = ::operator new(sizeof(Opaque), std::align_val_t{alignof(Opaque)}, std::nothrow);
  if (storage == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  *out = Construct<Opaque>(storage, value);
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T, typename Opaque>
cublasStatus_t Destroy(Opaque* o, uint64_t magic) {
  if (o == nullptr) return CUBLAS_STATUS_SUCCESS;
  T* t = Get<T>(o, magic);
  if (t == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  t->magic = kDead;
  ::operator delete(static_cast<void*>(o), std::align_val_t{alignof(Opaque)});
  return CUBLAS_STATUS_SUCCESS;
}

LayoutDesc MakeLayout(cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
  return {kLayoutMagic, static_cast<uint32_t>(type), CUBLASLT_ORDER_COL, rows, cols, ld, 1, 0, 0, 0};
}

MatmulDesc MakeMatmulDesc(cublasComputeType_t compute, cudaDataType_t scale) {
  MatmulDesc d{};
  d.magic = kDescMagic;
  d.compute_type = compute;
  d.scale_type = scale;
  d.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  d.transa = d.transb = d.transc = CUBLAS_OP_N;
  d.fill_mode = CUBLAS_FILL_MODE_FULL;
  d.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d.aux_type = -1;
  d.bias_type = -1;
  return d;
}

PreferenceDesc MakePreference() {
  return {kPrefMagic, CUBLASLT_SEARCH_BEST_FIT, CUBLASLT_REDUCTION_SCHEME_MASK, 0, {256, 256, 256, 256}, 0.0f,
          ~uint64_t{0}};
}

// An attribute's storage: address and exact size (Set/Get require sizeInBytes to match).
struct Field {
  void* p = nullptr;
  size_t size = 0;
};

Field LayoutField(LayoutDesc& l, cublasLtMatrixLayoutAttribute_t attr) {
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return {&l.type, sizeof(l.type)};
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return {&l.order, sizeof(l.order)};
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return {&l.rows, sizeof(l.rows)};
    case CUBLASLT_MATRIX_LAYOUT_COLS: return {&l.cols, sizeof(l.cols)};
    case CUBLASLT_MATRIX_LAYOUT_LD: return {&l.ld, sizeof(l.ld)};
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return {&l.batch_count, sizeof(l.batch_count)};
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return {&l.batch_stride, sizeof(l.batch_stride)};
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return {&l.plane_offset, sizeof(l.plane_offset)};
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: return {&l.batch_mode, sizeof(l.batch_mode)};
  }
  return {};
}

Field DescField(MatmulDesc& d, cublasLtMatmulDescAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return {&d.compute_type, sizeof(d.compute_type)};
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return {&d.scale_type, sizeof(d.scale_type)};
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return {&d.pointer_mode, sizeof(d.pointer_mode)};
    case CUBLASLT_MATMUL_DESC_TRANSA: return {&d.transa, sizeof(d.transa)};
    case CUBLASLT_MATMUL_DESC_TRANSB: return {&d.transb, sizeof(d.transb)};
    case CUBLASLT_MATMUL_DESC_TRANSC: return {&d.transc, sizeof(d.transc)};
    case CUBLASLT_MATMUL_DESC_FILL_MODE: return {&d.fill_mode, sizeof(d.fill_mode)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return {&d.epilogue, sizeof(d.epilogue)};
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return {&d.bias, sizeof(d.bias)};
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return {&d.bias_batch_stride, sizeof(d.bias_batch_stride)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return {&d.aux, sizeof(d.aux)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return {&d.aux_ld, sizeof(d.aux_ld)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return {&d.aux_batch_stride, sizeof(d.aux_batch_stride)};
    case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE:
      return {&d.alpha_vector_batch_stride, sizeof(d.alpha_vector_batch_stride)};
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: return {&d.sm_count_target, sizeof(d.sm_count_target)};
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return {&d.a_scale, sizeof(d.a_scale)};
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return {&d.b_scale, sizeof(d.b_scale)};
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return {&d.c_scale, sizeof(d.c_scale)};
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return {&d.d_scale, sizeof(d.d_scale)};
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return {&d.amax_d, sizeof(d.amax_d)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return {&d.aux_type, sizeof(d.aux_type)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER: return {&d.aux_scale, sizeof(d.aux_scale)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER: return {&d.aux_amax, sizeof(d.aux_amax)};
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return {&d.fast_accum, sizeof(d.fast_accum)};
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return {&d.bias_type, sizeof(d.bias_type)};
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return {&d.a_scale_mode, sizeof(d.a_scale_mode)};
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return {&d.b_scale_mode, sizeof(d.b_scale_mode)};
    case CUBLASLT_MATMUL_DESC_C_SCALE_MODE: return {&d.c_scale_mode, sizeof(d.c_scale_mode)};
    case CUBLASLT_MATMUL_DESC_D_SCALE_MODE: return {&d.d_scale_mode, sizeof(d.d_scale_mode)};
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE: return {&d.aux_scale_mode, sizeof(d.aux_scale_mode)};
    case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER: return {&d.d_out_scale, sizeof(d.d_out_scale)};
    case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE: return {&d.d_out_scale_mode, sizeof(d.d_out_scale_mode)};
    case CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR: return {&d.emulation, sizeof(d.emulation)};
  }
  return {};
}

Field PreferenceField(PreferenceDesc& p, cublasLtMatmulPreferenceAttributes_t attr) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return {&p.search_mode, sizeof(p.search_mode)};
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return {&p.max_workspace, sizeof(p.max_workspace)};
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return {&p.reduction_mask, sizeof(p.reduction_mask)};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return {&p.align[0], sizeof(p.align[0])};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return {&p.align[1], sizeof(p.align[1])};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return {&p.align[2], sizeof(p.align[2])};
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return {&p.align[3], sizeof(p.align[3])};
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return {&p.max_waves, sizeof(p.max_waves)};
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: return {&p.impl_mask, sizeof(p.impl_mask)};
  }
  return {};
}

cublasStatus_t SetField(const char* fn, Field f, const void* buf, size_t size) {
  if (f.p == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "unknown attribute");
  if (buf == nullptr || size != f.size) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "buffer null or size %zu != %zu", size, f.size);
  }
  std::memcpy(f.p, buf, f.size);
  return CUBLAS_STATUS_SUCCESS;
}

// Get semantics: sizeInBytes == 0 asks for the size (sizeWritten must then be non-null).
cublasStatus_t GetField(const char* fn, Field f, void* buf, size_t size, size_t* written) {
  if (f.p == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "unknown attribute");
  if (size == 0) {
    if (written == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "sizeInBytes 0 and sizeWritten null");
    *written = f.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != f.size) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "buffer null or size %zu != %zu", size, f.size);
  }
  std::memcpy(buf, f.p, f.size);
  if (written != nullptr) *written = f.size;
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt matmul: validation shared by the heuristic and the matmul ---------------------------

bool LiveLt(cublasLtHandle_t h) {
  if (h == nullptr) return false;
  const uint64_t magic = *reinterpret_cast<const uint64_t*>(h);
  return magic == kLtMagic || magic == kBlasMagic;
}

// A layout as element strides, with the matrix it describes after the descriptor's op.
struct Operand {
  const LayoutDesc* l = nullptr;
  int64_t rs = 1, cs = 0;  // stored element (r, c) at r * rs + c * cs
  int64_t rows = 0, cols = 0;
};

Operand MakeOperand(const LayoutDesc& l, bool transposed) {
  Operand o;
  o.l = &l;
  const bool col = l.order == CUBLASLT_ORDER_COL;
  o.rs = col ? 1 : l.ld;
  o.cs = col ? l.ld : 1;
  o.rows = static_cast<int64_t>(l.rows);
  o.cols = static_cast<int64_t>(l.cols);
  if (transposed) {
    std::swap(o.rs, o.cs);
    std::swap(o.rows, o.cols);
  }
  return o;
}

// Everything a matmul is, decoded from its descriptors (validated, pointers aside).
struct LtPlan {
  Operand a, b, c, d;  // op(A), op(B), C, D
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int ab_type = CUDA_R_32F, cd_type = CUDA_R_32F;
  InputRounding rounding = InputRounding::kNone;
  Epilogue epi;
  bool bias_in = false;   // the epilogue reads the bias vector
  bool bias_out = false;  // the epilogue writes a bias gradient
  bool aux = false;       // the epilogue reads or writes the aux matrix
};

const char* const kHeuristic = "cublasLtMatmulAlgoGetHeuristic";
const char* const kMatmul = "cublasLtMatmul";

// Decodes and validates a matmul configuration with the statuses cuBLASLt documents:
// INVALID_VALUE for conflicting or impossible parameters, NOT_SUPPORTED for valid configurations
// without an implementation.
cublasStatus_t Plan(const char* fn, cublasLtMatmulDesc_t desc_h, cublasLtMatrixLayout_t a_h, cublasLtMatrixLayout_t b_h,
                    cublasLtMatrixLayout_t c_h, cublasLtMatrixLayout_t d_h, LtPlan* plan) {
  const MatmulDesc* desc = Get<MatmulDesc>(desc_h, kDescMagic);
  const LayoutDesc* la = Get<LayoutDesc>(a_h, kLayoutMagic);
  const LayoutDesc* lb = Get<LayoutDesc>(b_h, kLayoutMagic);
  const LayoutDesc* ld = Get<LayoutDesc>(d_h, kLayoutMagic);
  const LayoutDesc* lc = c_h == nullptr ? ld : Get<LayoutDesc>(c_h, kLayoutMagic);  // omitted: Cdesc = Ddesc
  if (desc == nullptr || la == nullptr || lb == nullptr || lc == nullptr || ld == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "a descriptor is null or not live");
  }
  const LayoutDesc* const layouts[4] = {la, lb, lc, ld};
  for (int i = 0; i < 4; ++i) {
    const LayoutDesc* l = layouts[i];
    if (l->order != CUBLASLT_ORDER_COL && l->order != CUBLASLT_ORDER_ROW) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "memory order %d is not implemented", l->order);
    }
    if (l->batch_mode != CUBLASLT_BATCH_MODE_STRIDED || l->plane_offset != 0) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "pointer-array batches and planar complex are not implemented");
    }
    if (l->rows > uint64_t{std::numeric_limits<int32_t>::max()} ||
        l->cols > uint64_t{std::numeric_limits<int32_t>::max()}) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "rows/cols beyond int32");
    }
    if (l->batch_count < 1) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch count %d < 1", l->batch_count);
    // Columns (COL) or rows (ROW) must not overlap: ld >= rows (cols). An out-of-place C may use
    // ld 0 ("to achieve row or column broadcast").
    const uint64_t min_ld = l->order == CUBLASLT_ORDER_COL ? l->rows : l->cols;
    const bool empty = l->rows == 0 || l->cols == 0;
    const bool broadcast_c = i == 2 && lc != ld && l->ld == 0;
    if (l->ld < 0 || (!empty && static_cast<uint64_t>(l->ld) < min_ld && !broadcast_c)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "leading dimension %lld < %llu", static_cast<long long>(l->ld),
                  static_cast<unsigned long long>(min_ld));
    }
  }
  if (!IsOp(desc->transa) || !IsOp(desc->transb) || !IsOp(desc->transc)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "TRANSA/TRANSB/TRANSC not N, T or C");
  }
  if (desc->transc != CUBLAS_OP_N) return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "only TRANSC = N is supported");
  if (desc->fill_mode != CUBLAS_FILL_MODE_FULL) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "only CUBLAS_FILL_MODE_FULL is implemented");
  }

  LtPlan& p = *plan;
  p.a = MakeOperand(*la, desc->transa != CUBLAS_OP_N);
  p.b = MakeOperand(*lb, desc->transb != CUBLAS_OP_N);
  p.c = MakeOperand(*lc, false);
  p.d = MakeOperand(*ld, false);
  p.m = p.d.rows;
  p.n = p.d.cols;
  p.k = p.a.cols;
  if (p.a.rows != p.m || p.b.rows != p.k || p.b.cols != p.n || p.c.rows != p.m || p.c.cols != p.n) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                "shapes conflict: op(A) %lldx%lld, op(B) %lldx%lld, C %lldx%lld, D %lldx%lld",
                static_cast<long long>(p.a.rows), static_cast<long long>(p.a.cols), static_cast<long long>(p.b.rows),
                static_cast<long long>(p.b.cols), static_cast<long long>(p.c.rows), static_cast<long long>(p.c.cols),
                static_cast<long long>(p.m), static_cast<long long>(p.n));
  }
  if (lc->type != ld->type || lc->order != ld->order || lc->batch_count != ld->batch_count) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C and D differ in type, order or batch count");
  }
  if (la->batch_count != ld->batch_count || lb->batch_count != ld->batch_count) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch counts of A (%d), B (%d), D (%d) differ", la->batch_count,
                lb->batch_count, ld->batch_count);
  }
  p.batch = ld->batch_count;

  // Types: the CUBLAS_COMPUTE_32F rows of the cublasLtMatmul table (scale type CUDA_R_32F).
  const int at = static_cast<int>(la->type), bt = static_cast<int>(lb->type), dt = static_cast<int>(ld->type);
  if (!IsKnownType(at) || !IsKnownType(bt) || !IsKnownType(dt) || !IsComputeType(desc->compute_type)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a data type or compute type");
  }
  if (at != bt || desc->scale_type != CUDA_R_32F || !ComputeRounding(desc->compute_type, at, dt, &p.rounding)) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "types A %d, B %d, C/D %d, compute %d, scale %d not supported", at,
                bt, dt, desc->compute_type, desc->scale_type);
  }
  p.ab_type = at;
  p.cd_type = dt;

  switch (desc->pointer_mode) {
    case CUBLASLT_POINTER_MODE_HOST:
    case CUBLASLT_POINTER_MODE_DEVICE:
    case CUBLASLT_POINTER_MODE_DEVICE_VECTOR:
    case CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO:
    case CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST: break;
    default: return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "pointer mode %d", desc->pointer_mode);
  }
  // Scaling factors, amax and scale modes exist for FP8/FP4 types only.
  if (desc->a_scale != nullptr || desc->b_scale != nullptr || desc->c_scale != nullptr || desc->d_scale != nullptr ||
      desc->amax_d != nullptr || desc->aux_scale != nullptr || desc->aux_amax != nullptr ||
      desc->d_out_scale != nullptr || desc->a_scale_mode != 0 || desc->b_scale_mode != 0 || desc->c_scale_mode != 0 ||
      desc->d_scale_mode != 0 || desc->aux_scale_mode != 0 || desc->d_out_scale_mode != 0) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "scale/amax pointers or scale modes set for non-FP8 types");
  }

  // The epilogue.
  Epilogue& e = p.epi;
  switch (desc->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_RELU: e.relu = true; break;
    case CUBLASLT_EPILOGUE_BIAS: e.bias = true; break;
    case CUBLASLT_EPILOGUE_RELU_BIAS: e.bias = e.relu = true; break;
    case CUBLASLT_EPILOGUE_GELU: e.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: e.gelu = e.aux_out = true; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: e.bias = e.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: e.bias = e.gelu = e.aux_out = true; break;
    case CUBLASLT_EPILOGUE_DGELU: e.dgelu = true; break;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      e.dgelu = true;
      e.bgrad = Epilogue::Grad::kD;
      break;
    case CUBLASLT_EPILOGUE_BGRADA: e.bgrad = Epilogue::Grad::kA; break;
    case CUBLASLT_EPILOGUE_BGRADB: e.bgrad = Epilogue::Grad::kB; break;
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "ReLU bit-mask epilogues are not implemented");
    default: return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "epilogue %u", desc->epilogue);
  }
  p.bias_in = e.bias;
  p.bias_out = e.bgrad != Epilogue::Grad::kNone;
  p.aux = e.aux_out || e.dgelu;
  // "Epilogue modes that combine ReLU, dReLu, GELU, or dGELU with Bias are not supported when D
  // matrix memory order is defined as CUBLASLT_ORDER_ROW"; the aux matrix is column-major.
  const bool combined = (e.bias && (e.relu || e.gelu)) || e.bgrad == Epilogue::Grad::kD;
  if (ld->order == CUBLASLT_ORDER_ROW && (combined || p.aux)) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u with D in row order", desc->epilogue);
  }
  // Bias (gradient) type: D's type (the table's "Bias Type" for these rows).
  if (p.bias_in || p.bias_out) {
    if (desc->bias_type != -1 && desc->bias_type != dt) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias type %d with D type %d", desc->bias_type, dt);
    }
    e.bias_type = dt;
  }
  if (p.aux) {
    // Aux type: D's, unless set (for FP8 outputs only; otherwise the default or D's type itself).
    if (desc->aux_type != -1 && desc->aux_type != dt) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "aux data type %d with D type %d", desc->aux_type, dt);
    }
    e.aux_type = dt;
    if (desc->aux == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "epilogue needs EPILOGUE_AUX_POINTER");
    // "Must be divisible by 8 and be no less than the number of rows in the output matrix."
    if (desc->aux_ld < p.m || desc->aux_ld % 8 != 0) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "EPILOGUE_AUX_LD %lld (m %lld; must be >= m and divisible by 8)",
                  static_cast<long long>(desc->aux_ld), static_cast<long long>(p.m));
    }
    if (p.batch > 1 && desc->aux_batch_stride % 8 != 0) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "EPILOGUE_AUX_BATCH_STRIDE not divisible by 8");
    }
    if (!Aligned(desc->aux, ElementBytes(dt))) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "aux pointer not aligned to its element");
    }
    e.aux_ld = desc->aux_ld;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The alignment (bytes) the heuristic's algorithm assumes for each of A, B, C, D: what the
// preference promises, capped at 16 (the widest vector access a kernel makes).
struct AlgoRecord {
  uint32_t align[4];
};

void EncodeAlgo(const AlgoRecord& r, cublasLtMatmulAlgo_t* algo) {
  std::memset(algo, 0, sizeof(*algo));
  algo->data[0] = kAlgoMagic;
  for (int i = 0; i < 4; ++i) algo->data[1 + i] = r.align[i];
}

bool DecodeAlgo(const cublasLtMatmulAlgo_t* algo, AlgoRecord* r) {
  if (algo->data[0] != kAlgoMagic) return false;
  for (int i = 0; i < 4; ++i) r->align[i] = static_cast<uint32_t>(algo->data[1 + i]);
  return true;
}

// The alignment of a pointer, in bytes, up to 256. (Only the base pointer: the heuristic sees the
// leading dimensions in the layouts and picks kernels that suit them; the MIN_ALIGNMENT
// preferences promise the alignment of the buffers.)
uint32_t PointerAlignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a >>= 1;
  return a;
}

}  // namespace

// ---- The API ------------------------------------------------------------------------------------

extern "C" {

// -- Status strings --

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the functionality requested requires some license";
  }
  return "unknown error";
}

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) { return cublasGetStatusName(status); }
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }

// -- Versions --

size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }
size_t CUBLASWINAPI cublasLtGetCudartVersion(void) { return CUDART_VERSION; }
size_t CUBLASWINAPI cublasGetCudartVersion(void) { return CUDART_VERSION; }

cublasStatus_t CUBLASWINAPI cublasLtGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t CUBLASWINAPI cublasGetProperty(libraryPropertyType type, int* value) {
  return cublasLtGetProperty(type, value);
}

cublasStatus_t CUBLASWINAPI cublasGetVersion_v2(cublasHandle_t handle, int* version) {
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  (void)handle;  // the version does not depend on the handle
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

// -- Classic handle --

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new (std::nothrow) cublasContext{kBlasMagic,          nullptr,
                                             nullptr,             0,
                                             CUBLAS_DEFAULT_MATH, CUBLAS_POINTER_MODE_HOST,
                                             CUBLAS_ATOMICS_NOT_ALLOWED};
  return *handle == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->magic = kDead;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

// Also resets the workspace to the default pool, as cuBLAS documents.
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  handle->workspace = nullptr;
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (streamId == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

// "The workspace pointer has to be aligned to at least 256 bytes, otherwise
// CUBLAS_STATUS_INVALID_VALUE error is returned." (The GEMMs here need no workspace.)
cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t workspaceSizeInBytes) {
  constexpr const char* fn = "cublasSetWorkspace";
  if (!LiveBlas(handle)) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle is not live");
  if (workspace == nullptr && workspaceSizeInBytes != 0) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "null workspace of %zu bytes", workspaceSizeInBytes);
  }
  if (!Aligned(workspace, 256)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace %p not 256-byte aligned", workspace);
  }
  handle->workspace = workspace;
  handle->workspace_bytes = workspaceSizeInBytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const unsigned base = static_cast<unsigned>(mode) & ~unsigned{CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION};
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
      base != CUBLAS_TF32_TENSOR_OP_MATH && base != CUBLAS_FP32_EMULATED_BF16X9_MATH &&
      base != CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode", "math mode %d", static_cast<int>(mode));
  }
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_ATOMICS_NOT_ALLOWED && mode != CUBLAS_ATOMICS_ALLOWED) return CUBLAS_STATUS_INVALID_VALUE;
  handle->atomics_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t* mode) {
  if (!LiveBlas(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->atomics_mode;
  return CUBLAS_STATUS_SUCCESS;
}

// -- Classic GEMMs --

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                                         cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  return ClassicGemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta,
                     C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx_64(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                            int64_t m, int64_t n, int64_t k, const void* alpha, const void* A,
                                            cudaDataType Atype, int64_t lda, const void* B, cudaDataType Btype,
                                            int64_t ldb, const void* beta, void* C, cudaDataType Ctype, int64_t ldc,
                                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return ClassicGemm("cublasGemmEx_64", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
                     beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                       cublasOperation_t transb, int m, int n, int k,
                                                       const void* alpha, const void* A, cudaDataType Atype, int lda,
                                                       long long int strideA, const void* B, cudaDataType Btype,
                                                       int ldb, long long int strideB, const void* beta, void* C,
                                                       cudaDataType Ctype, int ldc, long long int strideC,
                                                       int batchCount, cublasComputeType_t computeType,
                                                       cublasGemmAlgo_t algo) {
  return ClassicGemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                     Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx_64(cublasHandle_t handle, cublasOperation_t transa,
                                                          cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                                                          const void* alpha, const void* A, cudaDataType Atype,
                                                          int64_t lda, long long int strideA, const void* B,
                                                          cudaDataType Btype, int64_t ldb, long long int strideB,
                                                          const void* beta, void* C, cudaDataType Ctype, int64_t ldc,
                                                          long long int strideC, int64_t batchCount,
                                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return ClassicGemm("cublasGemmStridedBatchedEx_64", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA,
                     B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

// -- cuBLASLt handle --

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = new (std::nothrow) cublasLtContext{kLtMagic};
  return *lightHandle == nullptr ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (lightHandle == nullptr || lightHandle->magic != kLtMagic) return CUBLAS_STATUS_NOT_INITIALIZED;
  lightHandle->magic = kDead;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

// -- Matrix layouts --

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t matLayout, size_t size,
                                                              cudaDataType type, uint64_t rows, uint64_t cols,
                                                              int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (size < sizeof(LayoutDesc)) return CUBLAS_STATUS_ALLOC_FAILED;
  Construct<cublasLtMatrixLayoutOpaque_t>(matLayout, MakeLayout(type, rows, cols, ld));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  return Create(matLayout, MakeLayout(type, rows, cols, ld));
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return Destroy<LayoutDesc>(matLayout, kLayoutMagic);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t sizeInBytes) {
  LayoutDesc* l = Get<LayoutDesc>(matLayout, kLayoutMagic);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return SetField("cublasLtMatrixLayoutSetAttribute", LayoutField(*l, attr), buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                             size_t sizeInBytes, size_t* sizeWritten) {
  LayoutDesc* l = Get<LayoutDesc>(matLayout, kLayoutMagic);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return GetField("cublasLtMatrixLayoutGetAttribute", LayoutField(*l, attr), buf, sizeInBytes, sizeWritten);
}

// -- Matmul descriptors --

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t matmulDesc, size_t size,
                                                            cublasComputeType_t computeType,
                                                            cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (size < sizeof(MatmulDesc)) return CUBLAS_STATUS_ALLOC_FAILED;
  Construct<cublasLtMatmulDescOpaque_t>(matmulDesc, MakeMatmulDesc(computeType, scaleType));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType, cudaDataType_t scaleType) {
  return Create(matmulDesc, MakeMatmulDesc(computeType, scaleType));
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return Destroy<MatmulDesc>(matmulDesc, kDescMagic);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t sizeInBytes) {
  MatmulDesc* d = Get<MatmulDesc>(matmulDesc, kDescMagic);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return SetField("cublasLtMatmulDescSetAttribute", DescField(*d, attr), buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, void* buf,
                                                           size_t sizeInBytes, size_t* sizeWritten) {
  MatmulDesc* d = Get<MatmulDesc>(matmulDesc, kDescMagic);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return GetField("cublasLtMatmulDescGetAttribute", DescField(*d, attr), buf, sizeInBytes, sizeWritten);
}

// -- Preferences --

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (size < sizeof(PreferenceDesc)) return CUBLAS_STATUS_ALLOC_FAILED;
  Construct<cublasLtMatmulPreferenceOpaque_t>(pref, MakePreference());
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return Create(pref, MakePreference());
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return Destroy<PreferenceDesc>(pref, kPrefMagic);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                  cublasLtMatmulPreferenceAttributes_t attr,
                                                                  const void* buf, size_t sizeInBytes) {
  PreferenceDesc* p = Get<PreferenceDesc>(pref, kPrefMagic);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return SetField("cublasLtMatmulPreferenceSetAttribute", PreferenceField(*p, attr), buf, sizeInBytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                                  cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                                  size_t sizeInBytes, size_t* sizeWritten) {
  PreferenceDesc* p = Get<PreferenceDesc>(pref, kPrefMagic);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return GetField("cublasLtMatmulPreferenceGetAttribute", PreferenceField(*p, attr), buf, sizeInBytes, sizeWritten);
}

// -- Heuristic: one algorithm (no workspace) for every configuration this file implements --

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int* returnAlgoCount) {
  const char* fn = kHeuristic;
  if (!LiveLt(lightHandle)) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle is not live");
  if (requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "requestedAlgoCount %d or null output", requestedAlgoCount);
  }
  *returnAlgoCount = 0;
  const PreferenceDesc* pref = Get<PreferenceDesc>(preference, kPrefMagic);
  if (pref == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "preference is null or not live");
  LtPlan plan;
  EMU_RETURN_IF_ERROR(Plan(fn, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &plan));
  // No kernel reads a matrix less aligned than its element; the bias needs its element alignment.
  const size_t sizes[4] = {ElementBytes(plan.ab_type), ElementBytes(plan.ab_type), ElementBytes(plan.cd_type),
                           ElementBytes(plan.cd_type)};
  AlgoRecord record;
  for (int i = 0; i < 4; ++i) {
    if (pref->align[i] < sizes[i]) {
      return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "minimum alignment %u of %c below its element size", pref->align[i],
                  "ABCD"[i]);
    }
    record.align[i] = std::min<uint32_t>(pref->align[i], 16);
  }
  const MatmulDesc* desc = Get<MatmulDesc>(operationDesc, kDescMagic);
  if ((plan.bias_in || plan.bias_out) && !Aligned(desc->bias, ElementBytes(plan.cd_type))) {
    return Fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias pointer not aligned to its element");
  }
  cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[0];
  std::memset(&r, 0, sizeof(r));
  EncodeAlgo(record, &r.algo);
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// -- The matmul --

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                                           const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                                           void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  const char* fn = kMatmul;
  if (!LiveLt(lightHandle)) return Fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle is not live");
  LtPlan p;
  EMU_RETURN_IF_ERROR(Plan(fn, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p));
  const MatmulDesc& desc = *Get<MatmulDesc>(computeDesc, kDescMagic);
  if (workspaceSizeInBytes > 0 && workspace == nullptr) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "null workspace of %zu bytes", workspaceSizeInBytes);
  }
  if (!Aligned(workspace, 256)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace %p not 256-byte aligned", workspace);
  }

  // alpha and beta (host and device pointers alike are host memory here).
  const int mode = desc.pointer_mode;
  const bool alpha_vector = mode != CUBLASLT_POINTER_MODE_HOST && mode != CUBLASLT_POINTER_MODE_DEVICE;
  const bool beta_vector = mode == CUBLASLT_POINTER_MODE_DEVICE_VECTOR;
  const bool beta_zero = mode == CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
  if (alpha == nullptr || (beta == nullptr && !beta_zero)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "null alpha or beta");
  }
  const float alpha_s = alpha_vector ? 1.0f : *static_cast<const float*>(alpha);
  const float beta_s = beta_zero || beta_vector ? 0.0f : *static_cast<const float*>(beta);
  const bool reads_c = beta_vector || beta_s != 0.0f;

  // In place: "C == D and Cdesc == Ddesc".
  const LayoutDesc& lc = *p.c.l;
  const LayoutDesc& ld = *p.d.l;
  if (C == D && C != nullptr && (lc.ld != ld.ld || lc.batch_stride != ld.batch_stride)) {
    return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C == D with different layouts");
  }

  const int64_t m = p.m, n = p.n, k = p.k, batch = p.batch;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Operands: present, element-aligned, inside device memory, and as aligned as the algorithm assumed.
  const bool product = k > 0 && (alpha_vector || alpha_s != 0.0f);
  const LayoutDesc& la = *p.a.l;
  const LayoutDesc& lb = *p.b.l;
  const bool reads_a = product || p.epi.bgrad == Epilogue::Grad::kA;
  const bool reads_b = product || p.epi.bgrad == Epilogue::Grad::kB;
  if (reads_a) EMU_RETURN_IF_ERROR(CheckOperand(fn, "A", A, p.ab_type, m, k, p.a.rs, p.a.cs, batch, la.batch_stride));
  if (reads_b) EMU_RETURN_IF_ERROR(CheckOperand(fn, "B", B, p.ab_type, k, n, p.b.rs, p.b.cs, batch, lb.batch_stride));
  if (reads_c) EMU_RETURN_IF_ERROR(CheckOperand(fn, "C", C, p.cd_type, m, n, p.c.rs, p.c.cs, batch, lc.batch_stride));
  EMU_RETURN_IF_ERROR(CheckOperand(fn, "D", D, p.cd_type, m, n, p.d.rs, p.d.cs, batch, ld.batch_stride));
  if (p.bias_in || p.bias_out) {
    if (desc.bias == nullptr) return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "epilogue needs BIAS_POINTER");
    const int64_t len = p.epi.bgrad == Epilogue::Grad::kB ? n : m;
    EMU_RETURN_IF_ERROR(CheckOperand(fn, "bias", desc.bias, p.cd_type, len, 1, 1, len, batch, desc.bias_batch_stride));
  }
  if (p.aux) {
    EMU_RETURN_IF_ERROR(
        CheckOperand(fn, "aux", desc.aux, p.cd_type, m, n, 1, desc.aux_ld, batch, desc.aux_batch_stride));
  }
  if (alpha_vector) {
    EMU_RETURN_IF_ERROR(CheckOperand(fn, "alpha vector", alpha, CUDA_R_32F, m, 1, 1, m, batch,
                                     desc.alpha_vector_batch_stride));
  }
  if (beta_vector) EMU_RETURN_IF_ERROR(CheckOperand(fn, "beta vector", beta, CUDA_R_32F, m, 1, 1, m));
  if (algo != nullptr) {
    AlgoRecord record;
    if (!DecodeAlgo(algo, &record)) {
      return Fail(CUBLAS_STATUS_INVALID_VALUE, fn, "algo did not come from cublasLtMatmulAlgoGetHeuristic");
    }
    const void* ptrs[4] = {A, B, reads_c ? C : D, D};
    for (int i = 0; i < 4; ++i) {
      if ((i == 0 && !reads_a) || (i == 1 && !reads_b)) continue;
      const uint32_t have = PointerAlignment(ptrs[i]);
      if (have < record.align[i]) {
        return Misuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "%c (%p) is %u-byte aligned, but the algorithm was chosen for %u-byte alignment "
                      "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)",
                      "ABCD"[i], ptrs[i], have, record.align[i], "ABCD"[i]);
      }
    }
  }
  EMU_RETURN_IF_ERROR(CheckStream(fn, stream));

  for (int64_t i = 0; i < batch; ++i) {
    auto at = [i](const void* base, int64_t stride, int type) {
      return static_cast<const char*>(base) + i * stride * static_cast<int64_t>(ElementBytes(type));
    };
    Gemm g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = {at(A, la.batch_stride, p.ab_type), p.ab_type, p.a.rs, p.a.cs};
    g.b = {at(B, lb.batch_stride, p.ab_type), p.ab_type, p.b.rs, p.b.cs};
    g.c = {reads_c ? at(C, lc.batch_stride, p.cd_type) : nullptr, p.cd_type, p.c.rs, p.c.cs};
    g.d = const_cast<char*>(at(D, ld.batch_stride, p.cd_type));
    g.d_type = p.cd_type;
    g.d_rs = p.d.rs;
    g.d_cs = p.d.cs;
    g.alpha = alpha_s;
    g.beta = beta_s;
    if (alpha_vector) {
      g.alpha_vec = reinterpret_cast<const float*>(at(alpha, desc.alpha_vector_batch_stride, CUDA_R_32F));
    }
    if (beta_vector) g.beta_vec = static_cast<const float*>(beta);
    g.rounding = p.rounding;
    g.epi = p.epi;
    if (p.bias_in) g.epi.bias_in = at(desc.bias, desc.bias_batch_stride, p.cd_type);
    if (p.bias_out) g.epi.bias_out = const_cast<char*>(at(desc.bias, desc.bias_batch_stride, p.cd_type));
    if (p.aux) g.epi.aux = const_cast<char*>(at(desc.aux, desc.aux_batch_stride, p.cd_type));
    RunGemm(g);
  }
  (void)workspace;
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
