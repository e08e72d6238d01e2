// Self-test of tests/emulator/cublas_emu.cpp against a naive float64 reference: every entry point,
// small odd shapes, all transpose combinations, padded leading dimensions, C != D and in place,
// beta != 0, every implemented epilogue, bf16 / fp16 / fp32, strided batches, row-order layouts,
// vector pointer modes, and the error statuses of invalid calls.
//
// Build by hand (no GPU, no libcublas):
//   g++ -std=c++20 -O2 -fopenmp -I$CUDA_HOME/include -I. tests/emulator/cublas_emu.cpp
//       tests/emulator/cublas_emu_selftest.cpp -lgtest -lgtest_main -pthread -o /tmp/cublas_emu_selftest
//
// Tolerances: fp32 results within 1e-5 of the sum of |terms| (float accumulation over k <= ~300
// is ~k * 6e-8 of it); bf16 / fp16 outputs add one rounding of the output (2^-8 / 2^-11
// relative). The bf16 rounding itself is checked bit-exactly against __float2bfloat16_rn.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// ---- The emulator hooks, implemented over this test's allocations --------------------------------

namespace {
std::mutex g_mu;
std::map<uintptr_t, size_t> g_live;  // start -> bytes
const cudaStream_t kGoodStream = reinterpret_cast<cudaStream_t>(0x5000);
}  // namespace

namespace cuemu {
bool InAllocation(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = g_live.upper_bound(u);
  if (it == g_live.begin()) return false;
  --it;
  return u >= it->first && u + bytes <= it->first + it->second;
}
bool ValidStream(cudaStream_t s) { return s == nullptr || s == kGoodStream; }
}  // namespace cuemu

namespace {

// "Device memory": 256-byte aligned, filled with 0xFF (NaN in every float type), registered for
// the InAllocation hook. Not copyable.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    p_ = std::aligned_alloc(256, (bytes_ + 255) / 256 * 256);
    std::memset(p_, 0xFF, bytes_);
    std::lock_guard<std::mutex> lock(g_mu);
    g_live[reinterpret_cast<uintptr_t>(p_)] = bytes_;
  }
  ~DeviceBuffer() {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_live.erase(reinterpret_cast<uintptr_t>(p_));
    }
    std::free(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  void* p_;
};

size_t TypeBytes(int t) { return t == CUDA_R_32F ? 4 : 2; }

// Element access with NVIDIA's own conversions (independent of the emulator's).
double Read(const void* base, int type, int64_t idx) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(base)[idx];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
    default: return __half2float(static_cast<const __half*>(base)[idx]);
  }
}

void Write(void* base, int type, int64_t idx, float v) {
  switch (type) {
    case CUDA_R_32F: static_cast<float*>(base)[idx] = v; break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[idx] = __float2bfloat16_rn(v); break;
    default: static_cast<__half*>(base)[idx] = __float2half_rn(v); break;
  }
}

// Relative rounding of one store to `type` (half an ulp).
double OutputUlp(int type) { return type == CUDA_R_16BF ? 1.0 / 256 : type == CUDA_R_16F ? 1.0 / 2048 : 1.2e-7; }

// A matrix in device memory: rows x cols, order COL (r + c * ld) or ROW (r * ld + c), `batch`
// matrices `stride` elements apart; padding and unused elements stay 0xFF.
struct Matrix {
  int type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0;
  int order = CUBLASLT_ORDER_COL;
  int64_t batch = 1, stride = 0;
  std::unique_ptr<DeviceBuffer> buf;

  Matrix(int type_, int64_t rows_, int64_t cols_, int64_t ld_, int order_ = CUBLASLT_ORDER_COL, int64_t batch_ = 1)
      : type(type_), rows(rows_), cols(cols_), ld(ld_), order(order_), batch(batch_) {
    // Elements one matrix spans (the last column / row is rows / cols long), plus a gap: batches
    // are not packed either.
    const int64_t one = order == CUBLASLT_ORDER_COL ? ld * std::max<int64_t>(cols - 1, 0) + rows
                                                    : ld * std::max<int64_t>(rows - 1, 0) + cols;
    stride = one + 3;
    buf = std::make_unique<DeviceBuffer>(static_cast<size_t>(stride * batch) * TypeBytes(type));
  }
  int64_t Index(int64_t r, int64_t c, int64_t b = 0) const {
    return b * stride + (order == CUBLASLT_ORDER_COL ? r + c * ld : r * ld + c);
  }
  double at(int64_t r, int64_t c, int64_t b = 0) const { return Read(buf->get(), type, Index(r, c, b)); }
  void set(int64_t r, int64_t c, float v, int64_t b = 0) { Write(buf->get(), type, Index(r, c, b), v); }
  void* data() const { return buf->get(); }
  void Fill(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < rows; ++r) set(r, c, dist(rng), b);
  }
  std::vector<unsigned char> Bytes() const {
    const auto* p = static_cast<const unsigned char*>(buf->get());
    return {p, p + buf->bytes()};
  }
};

// Bytes of `after` outside the matrix elements equal those of `before` (nothing written there).
bool PaddingUnchanged(const Matrix& m, const std::vector<unsigned char>& before) {
  std::vector<bool> inside(before.size() / TypeBytes(m.type), false);
  for (int64_t b = 0; b < m.batch; ++b)
    for (int64_t c = 0; c < m.cols; ++c)
      for (int64_t r = 0; r < m.rows; ++r) inside[m.Index(r, c, b)] = true;
  const auto after = m.Bytes();
  for (size_t e = 0; e < inside.size(); ++e) {
    if (!inside[e] && std::memcmp(&before[e * TypeBytes(m.type)], &after[e * TypeBytes(m.type)], TypeBytes(m.type))) {
      return false;
    }
  }
  return true;
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
double Gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }
double GeluGrad(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3 * 0.044715 * x * x);
}

// |got - want| <= tol, NaN never passes.
::testing::AssertionResult Near(double got, double want, double tol, const char* what, int64_t i, int64_t j) {
  if (std::isfinite(got) && std::fabs(got - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << "(" << i << "," << j << ") = " << got << ", expected " << want
                                       << " +- " << tol;
}

const char* OpName(cublasOperation_t op) { return op == CUBLAS_OP_N ? "N" : op == CUBLAS_OP_T ? "T" : "C"; }

// ---- Basics ---------------------------------------------------------------------------------------

TEST(CublasEmu, StatusStringsAndVersions) {
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_ALLOC_FAILED)), "");
  EXPECT_EQ(cublasLtGetVersion(), size_t{CUBLAS_VERSION});
  int v = 0;
  EXPECT_EQ(cublasGetProperty(MAJOR_VERSION, &v), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(v, CUBLAS_VER_MAJOR);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasGetVersion(h, &v), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(v, CUBLAS_VERSION);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

TEST(CublasEmu, ClassicHandle) {
  EXPECT_EQ(cublasCreate(nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasDestroy(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasSetStream(nullptr, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  DeviceBuffer ws(1024);
  EXPECT_EQ(cublasSetWorkspace(h, ws.get(), 1024), CUBLAS_STATUS_SUCCESS);
  // "The workspace pointer has to be aligned to at least 256 bytes."
  EXPECT_EQ(cublasSetWorkspace(h, static_cast<char*>(ws.get()) + 16, 512), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSetWorkspace(h, nullptr, 0), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasSetStream(h, kGoodStream), CUBLAS_STATUS_SUCCESS);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cublasGetStream(h, &s), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(s, kGoodStream);
  EXPECT_EQ(cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
            CUBLAS_STATUS_SUCCESS);
  cublasMath_t mode;
  EXPECT_EQ(cublasGetMathMode(h, &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(int(mode), int(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  EXPECT_EQ(cublasSetMathMode(h, static_cast<cublasMath_t>(7)), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

// The output rounding to bf16 / fp16 matches NVIDIA's round-to-nearest-even conversions bit for bit
// (D = alpha * 1 * 1 rounds alpha once).
TEST(CublasEmu, OutputRoundingIsExact) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng(7);
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.005859375f, 1.001953125f, 1.0029296875f,
                               65504.0f, 65520.0f, 3.0e38f, 3.4e38f, 1e-40f, -2.5f, INFINITY, -INFINITY, NAN};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000; ++i) {
    float f;
    const uint32_t u = bits(rng);
    std::memcpy(&f, &u, 4);
    values.push_back(f);
  }
  for (int type : {CUDA_R_16BF, CUDA_R_16F}) {
    Matrix a(type, 1, 1, 1), b(type, 1, 1, 1), d(type, 1, 1, 1);
    a.set(0, 0, 1.0f);
    b.set(0, 0, 1.0f);
    for (float alpha : values) {
      const float beta = 0.0f;
      ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, a.data(), cudaDataType(type), 1, b.data(),
                             cudaDataType(type), 1, &beta, d.data(), cudaDataType(type), 1, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_SUCCESS);
      uint16_t got, want;
      std::memcpy(&got, d.data(), 2);
      if (type == CUDA_R_16BF) {
        const __nv_bfloat16 w = __float2bfloat16_rn(alpha);
        std::memcpy(&want, &w, 2);
      } else {
        const __half w = __float2half_rn(alpha);
        std::memcpy(&want, &w, 2);
      }
      if (std::isnan(alpha)) {  // any NaN encoding
        EXPECT_TRUE(std::isnan(d.at(0, 0))) << alpha;
      } else {
        EXPECT_EQ(got, want) << "type " << type << " value " << alpha;
      }
    }
  }
  cublasDestroy(h);
}

// ---- cublasGemmEx / cublasGemmStridedBatchedEx ----------------------------------------------------

struct ClassicCase {
  int ab, c;
};

class ClassicGemmTest : public ::testing::TestWithParam<std::tuple<ClassicCase, cublasOperation_t, cublasOperation_t>> {
};

// C (m x n) = alpha op(A) op(B) + beta C against float64, with padded leading dimensions, batched.
void CheckClassic(int ab, int ct, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                  float alpha, float beta, int batch, uint32_t seed, cublasMath_t math = CUBLAS_DEFAULT_MATH,
                  cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetMathMode(h, math), CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng(seed);
  const bool tra = ta != CUBLAS_OP_N, trb = tb != CUBLAS_OP_N;
  Matrix a(ab, tra ? k : m, tra ? m : k, (tra ? k : m) + 2, CUBLASLT_ORDER_COL, batch);
  Matrix b(ab, trb ? n : k, trb ? k : n, (trb ? n : k) + 3, CUBLASLT_ORDER_COL, batch);
  Matrix c(ct, m, n, m + 1, CUBLASLT_ORDER_COL, batch);
  a.Fill(rng);
  b.Fill(rng);
  c.Fill(rng);
  std::vector<double> c0(static_cast<size_t>(m * n * batch));
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) c0[(bi * n + j) * m + i] = c.at(i, j, bi);
  const auto before = c.Bytes();
  cublasStatus_t st;
  if (batch == 1) {
    st = cublasGemmEx(h, ta, tb, int(m), int(n), int(k), &alpha, a.data(), cudaDataType(ab), int(a.ld), b.data(),
                      cudaDataType(ab), int(b.ld), &beta, c.data(), cudaDataType(ct), int(c.ld), compute,
                      CUBLAS_GEMM_DEFAULT);
  } else {
    st = cublasGemmStridedBatchedEx(h, ta, tb, int(m), int(n), int(k), &alpha, a.data(), cudaDataType(ab), int(a.ld),
                                    a.stride, b.data(), cudaDataType(ab), int(b.ld), b.stride, &beta, c.data(),
                                    cudaDataType(ct), int(c.ld), c.stride, batch, compute, CUBLAS_GEMM_DEFAULT);
  }
  ASSERT_EQ(st, CUBLAS_STATUS_SUCCESS);
  const bool tf32 = (compute == CUBLAS_COMPUTE_32F && (math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH) ||
                    compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  auto in = [&](double x) {
    if (!tf32) return x;
    uint32_t u;
    const float f = static_cast<float>(x);
    std::memcpy(&u, &f, 4);
    u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;  // to nearest even
    float r;
    std::memcpy(&r, &u, 4);
    return double(r);
  };
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0, abs = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double x = in(tra ? a.at(kk, i, bi) : a.at(i, kk, bi)) * in(trb ? b.at(j, kk, bi) : b.at(kk, j, bi));
          sum += x;
          abs += std::fabs(x);
        }
        const double cij = c0[(bi * n + j) * m + i];
        const double want = alpha * sum + (beta != 0 ? beta * cij : 0.0);
        const double tol =
            1e-5 * (std::fabs(alpha) * abs + std::fabs(beta * cij)) + OutputUlp(ct) * std::fabs(want) + 1e-7;
        ASSERT_TRUE(Near(c.at(i, j, bi), want, tol, "C", i, j)) << "batch " << bi;
      }
    }
  }
  EXPECT_TRUE(PaddingUnchanged(c, before));
  cublasDestroy(h);
}

TEST_P(ClassicGemmTest, MatchesReference) {
  const auto [types, ta, tb] = GetParam();
  SCOPED_TRACE(std::string("A/B type ") + std::to_string(types.ab) + " C type " + std::to_string(types.c) + " " +
               OpName(ta) + OpName(tb));
  CheckClassic(types.ab, types.c, ta, tb, 7, 5, 9, 1.25f, 0.0f, 1, 1);
  CheckClassic(types.ab, types.c, ta, tb, 13, 11, 3, -0.75f, 0.5f, 1, 2);
  CheckClassic(types.ab, types.c, ta, tb, 9, 6, 17, 1.0f, 1.0f, 3, 3);  // strided batched
}

INSTANTIATE_TEST_SUITE_P(All, ClassicGemmTest,
                         ::testing::Combine(::testing::Values(ClassicCase{CUDA_R_32F, CUDA_R_32F},
                                                              ClassicCase{CUDA_R_16BF, CUDA_R_16BF},
                                                              ClassicCase{CUDA_R_16BF, CUDA_R_32F},
                                                              ClassicCase{CUDA_R_16F, CUDA_R_16F},
                                                              ClassicCase{CUDA_R_16F, CUDA_R_32F}),
                                            ::testing::Values(CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C),
                                            ::testing::Values(CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C)));

TEST(CublasEmu, ClassicLargerShapesAndTf32) {
  // Several row blocks (m > 256), n not a multiple of the column block.
  CheckClassic(CUDA_R_32F, CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_N, 300, 70, 130, 0.5f, 0.25f, 1, 11);
  CheckClassic(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_T, 259, 9, 300, 1.0f, 1.0f, 2, 12);
  // TF32: the reference rounds the inputs the same way.
  CheckClassic(CUDA_R_32F, CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_N, 33, 17, 65, 1.0f, 0.0f, 1, 13,
               CUBLAS_TF32_TENSOR_OP_MATH);
  CheckClassic(CUDA_R_32F, CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_T, 33, 17, 65, 1.0f, 0.0f, 1, 14, CUBLAS_DEFAULT_MATH,
               CUBLAS_COMPUTE_32F_FAST_TF32);
}

// beta == 0 does not read C; alpha == 0 and k == 0 do not read A or B.
TEST(CublasEmu, ClassicDoesNotReadWhatItMustNot) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng(5);
  Matrix a(CUDA_R_32F, 4, 3, 4), b(CUDA_R_32F, 3, 2, 3), c(CUDA_R_32F, 4, 2, 4);  // c stays NaN
  a.Fill(rng);
  b.Fill(rng);
  float one = 1.0f, zero = 0.0f, half = 0.5f;
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, &one, a.data(), CUDA_R_32F, 4, b.data(), CUDA_R_32F, 3,
                         &zero, c.data(), CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(c.at(i, j)));
  const double c00 = c.at(0, 0);
  Matrix nan_a(CUDA_R_32F, 4, 3, 4);  // NaN everywhere
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, &zero, nan_a.data(), CUDA_R_32F, 4, b.data(),
                         CUDA_R_32F, 3, &half, c.data(), CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_FLOAT_EQ(c.at(0, 0), 0.5 * c00);
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 0, &one, nan_a.data(), CUDA_R_32F, 4, nullptr, CUDA_R_32F,
                         1, &half, c.data(), CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_FLOAT_EQ(c.at(0, 0), 0.25 * c00);
  cublasDestroy(h);
}

TEST(CublasEmu, ClassicErrors) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  Matrix a(CUDA_R_32F, 8, 8, 8), b(CUDA_R_32F, 8, 8, 8), c(CUDA_R_32F, 8, 8, 8), cb(CUDA_R_16BF, 8, 8, 8);
  float one = 1.0f, zero = 0.0f;
  auto gemm = [&](cublasHandle_t hh, cublasOperation_t ta, int m, int n, int k, const float* alpha, int lda, int ldb,
                  const float* beta, void* cp, int ldc, cudaDataType at = CUDA_R_32F, cudaDataType ct = CUDA_R_32F,
                  cublasComputeType_t compute = CUBLAS_COMPUTE_32F, cublasGemmAlgo_t algo = CUBLAS_GEMM_DEFAULT) {
    return cublasGemmEx(hh, ta, CUBLAS_OP_N, m, n, k, alpha, a.data(), at, lda, b.data(), CUDA_R_32F, ldb, beta, cp,
                        ct, ldc, compute, algo);
  };
  EXPECT_EQ(gemm(nullptr, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &zero, c.data(), 8), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, -1, 4, 4, &one, 8, 8, &zero, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, -1, &one, 8, 8, &zero, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(h, CUBLAS_OP_CONJG, 4, 4, 4, &one, 8, 8, &zero, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 8, 4, 4, &one, 7, 8, &zero, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(gemm(h, CUBLAS_OP_T, 8, 4, 6, &one, 5, 8, &zero, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);  // lda < k
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 8, &one, 8, 7, &zero, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);  // ldb < k
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 8, 4, 4, &one, 8, 8, &zero, c.data(), 7), CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 0, 4, 4, &one, 0, 8, &zero, c.data(), 1), CUBLAS_STATUS_INVALID_VALUE);  // lda < 1
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, nullptr, 8, 8, &zero, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, nullptr, c.data(), 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &one, nullptr, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &zero, cb.data(), 8, CUDA_R_32F, CUDA_R_16BF),
            CUBLAS_STATUS_NOT_SUPPORTED);  // fp32 inputs, bf16 output: not in the table
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &zero, c.data(), 8, CUDA_R_16BF),
            CUBLAS_STATUS_NOT_SUPPORTED);  // Atype != Btype
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &zero, c.data(), 8, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_64F),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &zero, c.data(), 8, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                 static_cast<cublasGemmAlgo_t>(50)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 0, 4, 4, &one, 8, 8, &one, c.data(), 8), CUBLAS_STATUS_SUCCESS);  // nothing to do
  // A 9 x 8 column-major A needs 8 * 9 + 1 elements: a buffer of 64 is too short (a GPU would fault).
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 8, 8, 8, &one, 9, 8, &zero, c.data(), 8), CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a.data(), CUDA_R_32F, 8, 0,
                                       b.data(), CUDA_R_32F, 8, 0, &zero, c.data(), CUDA_R_32F, 8, 0, -1,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a.data(), CUDA_R_32F, 8, 0,
                                       b.data(), CUDA_R_32F, 8, 0, &zero, c.data(), CUDA_R_32F, 8, 0, 0,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  // An unknown stream fails at execution.
  ASSERT_EQ(cublasSetStream(h, reinterpret_cast<cudaStream_t>(0x1234)), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &zero, c.data(), 8), CUBLAS_STATUS_EXECUTION_FAILED);
  ASSERT_EQ(cublasSetStream(h, kGoodStream), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(h, CUBLAS_OP_N, 4, 4, 4, &one, 8, 8, &zero, c.data(), 8), CUBLAS_STATUS_SUCCESS);
  cublasDestroy(h);
}

// ---- cuBLASLt -------------------------------------------------------------------------------------

// Owners of the Lt objects.
struct Lt {
  cublasLtHandle_t h = nullptr;
  Lt() { EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Lt() { cublasLtDestroy(h); }
};
struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  explicit Desc(cublasComputeType_t compute = CUBLAS_COMPUTE_32F, cudaDataType_t scale = CUDA_R_32F) {
    EXPECT_EQ(cublasLtMatmulDescCreate(&d, compute, scale), CUBLAS_STATUS_SUCCESS);
  }
  ~Desc() { cublasLtMatmulDescDestroy(d); }
  template <typename V>
  cublasStatus_t Set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    return cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v));
  }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  explicit Layout(const Matrix& m) {
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, cudaDataType(m.type), m.rows, m.cols, m.ld), CUBLAS_STATUS_SUCCESS);
    const int32_t order = m.order, batch = int32_t(m.batch);
    const int64_t stride = m.stride;
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)),
              CUBLAS_STATUS_SUCCESS);
    if (m.batch > 1) {
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)),
                CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof(stride)),
                CUBLAS_STATUS_SUCCESS);
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
};
struct Pref {
  cublasLtMatmulPreference_t p = nullptr;
  Pref() { EXPECT_EQ(cublasLtMatmulPreferenceCreate(&p), CUBLAS_STATUS_SUCCESS); }
  ~Pref() { cublasLtMatmulPreferenceDestroy(p); }
  template <typename V>
  cublasStatus_t Set(cublasLtMatmulPreferenceAttributes_t attr, const V& v) {
    return cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v));
  }
};

// One cublasLtMatmul configuration.
struct LtCase {
  int ab = CUDA_R_32F, cd = CUDA_R_32F;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 7, n = 5, k = 9;
  bool in_place = false;  // C == D, else C has its own (larger) leading dimension
  float alpha = 1.25f, beta = 0.5f;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  int order_a = CUBLASLT_ORDER_COL, order_b = CUBLASLT_ORDER_COL, order_cd = CUBLASLT_ORDER_COL;
  int64_t batch = 1;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  bool ldc_zero = false;   // C broadcast: every column is column 0
  bool use_algo = true;    // heuristic's algorithm, else nullptr
  uint32_t seed = 1;
};

std::string Describe(const LtCase& c) {
  char s[256];
  std::snprintf(s, sizeof(s), "ab %d cd %d %s%s m%lld n%lld k%lld %s beta %g epi %d orders %d%d%d batch %lld pm %d",
                c.ab, c.cd, OpName(c.ta), OpName(c.tb), (long long)c.m, (long long)c.n, (long long)c.k,
                c.in_place ? "in-place" : "C!=D", c.beta, int(c.epi), c.order_a, c.order_b, c.order_cd,
                (long long)c.batch, c.pointer_mode);
  return s;
}

bool HasBias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool HasAuxOut(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool HasAuxIn(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool HasGelu(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool HasRelu(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS; }

void CheckLt(const LtCase& t) {
  SCOPED_TRACE(Describe(t));
  Lt lt;
  std::mt19937 rng(t.seed);
  const bool tra = t.ta != CUBLAS_OP_N, trb = t.tb != CUBLAS_OP_N;
  const int64_t ar = tra ? t.k : t.m, ac = tra ? t.m : t.k, br = trb ? t.n : t.k, bc = trb ? t.k : t.n;
  auto ld_for = [](int order, int64_t rows, int64_t cols, int64_t pad) {
    return (order == CUBLASLT_ORDER_COL ? rows : cols) + pad;
  };
  Matrix a(t.ab, ar, ac, ld_for(t.order_a, ar, ac, 2), t.order_a, t.batch);
  Matrix b(t.ab, br, bc, ld_for(t.order_b, br, bc, 1), t.order_b, t.batch);
  Matrix d(t.cd, t.m, t.n, ld_for(t.order_cd, t.m, t.n, 3), t.order_cd, t.batch);
  Matrix cm(t.cd, t.m, t.n, t.ldc_zero ? 0 : ld_for(t.order_cd, t.m, t.n, 6), t.order_cd, t.batch);
  a.Fill(rng);
  b.Fill(rng);
  Matrix& c = t.in_place ? d : cm;
  if (t.ldc_zero) {
    for (int64_t bi = 0; bi < t.batch; ++bi)
      for (int64_t i = 0; i < t.m; ++i) cm.set(i, 0, std::uniform_real_distribution<float>(-1, 1)(rng), bi);
  } else {
    c.Fill(rng);
  }
  std::vector<double> c0(static_cast<size_t>(t.m * t.n * t.batch));
  for (int64_t bi = 0; bi < t.batch; ++bi)
    for (int64_t j = 0; j < t.n; ++j)
      for (int64_t i = 0; i < t.m; ++i) c0[(bi * t.n + j) * t.m + i] = c.at(i, j, bi);

  // Epilogue buffers: bias (input, m) or bias gradient (m or n), aux (m x n, ld a multiple of 8).
  const int64_t bias_len = t.epi == CUBLASLT_EPILOGUE_BGRADB ? t.n : t.m;
  const int64_t bias_stride = bias_len + 5;
  DeviceBuffer bias_buf(static_cast<size_t>(bias_stride * t.batch) * TypeBytes(t.cd));
  const int64_t aux_ld = (t.m + 7) / 8 * 8 + 8;
  const int64_t aux_stride = aux_ld * t.n + 8;
  DeviceBuffer aux_buf(static_cast<size_t>(aux_stride * t.batch) * TypeBytes(t.cd));
  std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
  for (int64_t i = 0; i < bias_stride * t.batch; ++i) Write(bias_buf.get(), t.cd, i, dist(rng));
  for (int64_t i = 0; i < aux_stride * t.batch; ++i) Write(aux_buf.get(), t.cd, i, dist(rng));
  std::vector<double> aux_in(static_cast<size_t>(aux_stride * t.batch));
  for (size_t i = 0; i < aux_in.size(); ++i) aux_in[i] = Read(aux_buf.get(), t.cd, int64_t(i));
  std::vector<double> bias_in(static_cast<size_t>(bias_stride * t.batch));
  for (size_t i = 0; i < bias_in.size(); ++i) bias_in[i] = Read(bias_buf.get(), t.cd, int64_t(i));

  // alpha / beta: scalars or per-row vectors.
  const bool alpha_vec = t.pointer_mode >= CUBLASLT_POINTER_MODE_DEVICE_VECTOR;
  const bool beta_vec = t.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE_VECTOR;
  const bool beta_zero = t.pointer_mode == CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
  DeviceBuffer alpha_buf(static_cast<size_t>(t.m * t.batch) * 4), beta_buf(static_cast<size_t>(t.m) * 4);
  float* av = static_cast<float*>(alpha_buf.get());
  float* bv = static_cast<float*>(beta_buf.get());
  for (int64_t i = 0; i < t.m * t.batch; ++i) av[i] = dist(rng);
  for (int64_t i = 0; i < t.m; ++i) bv[i] = (i % 3 == 0) ? 0.0f : dist(rng);
  auto alpha_at = [&](int64_t i, int64_t bi) { return alpha_vec ? double(av[bi * t.m + i]) : double(t.alpha); };
  auto beta_at = [&](int64_t i) { return beta_zero ? 0.0 : beta_vec ? double(bv[i]) : double(t.beta); };

  Desc desc;
  EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(t.ta)), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(t.tb)), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(t.epi)), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_POINTER_MODE, t.pointer_mode), CUBLAS_STATUS_SUCCESS);
  if (alpha_vec && t.batch > 1) {
    EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, t.m), CUBLAS_STATUS_SUCCESS);
  }
  const bool bias_used = HasBias(t.epi) || t.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD ||
                         t.epi == CUBLASLT_EPILOGUE_BGRADA || t.epi == CUBLASLT_EPILOGUE_BGRADB;
  if (bias_used) {
    EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_buf.get()), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(t.cd)), CUBLAS_STATUS_SUCCESS);
    if (t.batch > 1) {
      EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_stride), CUBLAS_STATUS_SUCCESS);
    }
  }
  const bool aux_used = HasAuxOut(t.epi) || HasAuxIn(t.epi);
  if (aux_used) {
    EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_buf.get()), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld), CUBLAS_STATUS_SUCCESS);
    if (t.batch > 1) {
      EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_stride), CUBLAS_STATUS_SUCCESS);
    }
  }
  Layout la(a), lb(b), lc(c), ld(d);
  Pref pref;
  EXPECT_EQ(pref.Set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{1} << 20), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, la.l, lb.l, lc.l, ld.l, pref.p, 1, &result, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  ASSERT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  DeviceBuffer ws(1 << 20);
  const auto d_before = d.Bytes();
  const void* alpha = alpha_vec ? static_cast<const void*>(av) : &t.alpha;
  const void* beta = beta_vec ? static_cast<const void*>(bv) : beta_zero ? nullptr : &t.beta;
  ASSERT_EQ(cublasLtMatmul(lt.h, desc.d, alpha, a.data(), la.l, b.data(), lb.l, beta, c.data(), lc.l, d.data(), ld.l,
                           t.use_algo ? &result.algo : nullptr, ws.get(), ws.bytes(), kGoodStream),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_TRUE(PaddingUnchanged(d, d_before));

  const double ulp = OutputUlp(t.cd);
  for (int64_t bi = 0; bi < t.batch; ++bi) {
    std::vector<double> rowsum(static_cast<size_t>(t.m), 0.0), rowtol(static_cast<size_t>(t.m), 0.0);
    for (int64_t j = 0; j < t.n; ++j) {
      for (int64_t i = 0; i < t.m; ++i) {
        double sum = 0, abs = 0;
        for (int64_t kk = 0; kk < t.k; ++kk) {
          const double x = (tra ? a.at(kk, i, bi) : a.at(i, kk, bi)) * (trb ? b.at(j, kk, bi) : b.at(kk, j, bi));
          sum += x;
          abs += std::fabs(x);
        }
        const double cij = c0[(bi * t.n + j) * t.m + i];
        double x = alpha_at(i, bi) * sum + (beta_at(i) != 0 ? beta_at(i) * cij : 0.0);
        double tol = 1e-5 * (std::fabs(alpha_at(i, bi)) * abs + std::fabs(beta_at(i) * cij)) + 1e-7;
        if (HasBias(t.epi)) {
          x += bias_in[bi * bias_stride + i];
          tol += 1e-6 * std::fabs(bias_in[bi * bias_stride + i]);
        }
        if (HasAuxOut(t.epi)) {
          const double got = Read(aux_buf.get(), t.cd, bi * aux_stride + i + j * aux_ld);
          ASSERT_TRUE(Near(got, x, tol + ulp * std::fabs(x), "aux", i, j));
        }
        if (HasGelu(t.epi)) {
          tol = tol * 1.2 + 1e-6 * std::fabs(x);
          x = Gelu(x);
        }
        if (HasRelu(t.epi)) x = std::max(x, 0.0);
        if (HasAuxIn(t.epi)) {
          const double g = GeluGrad(aux_in[bi * aux_stride + i + j * aux_ld]);
          x *= g;
          tol = tol * std::fabs(g) + 1e-6 * std::fabs(x);
        }
        rowsum[i] += x;
        rowtol[i] += tol;
        ASSERT_TRUE(Near(d.at(i, j, bi), x, tol + ulp * std::fabs(x), "D", i, j)) << "batch " << bi;
      }
    }
    // Bias gradients.
    auto grad = [&](int64_t i) { return Read(bias_buf.get(), t.cd, bi * bias_stride + i); };
    if (t.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
      for (int64_t i = 0; i < t.m; ++i) {
        ASSERT_TRUE(Near(grad(i), rowsum[i], rowtol[i] + ulp * std::fabs(rowsum[i]), "dbias", i, 0));
      }
    } else if (t.epi == CUBLASLT_EPILOGUE_BGRADA || t.epi == CUBLASLT_EPILOGUE_BGRADB) {
      const bool on_a = t.epi == CUBLASLT_EPILOGUE_BGRADA;
      for (int64_t i = 0; i < bias_len; ++i) {
        double s = 0, abs = 0;
        for (int64_t kk = 0; kk < t.k; ++kk) {
          const double v = on_a ? (tra ? a.at(kk, i, bi) : a.at(i, kk, bi)) : (trb ? b.at(i, kk, bi) : b.at(kk, i, bi));
          s += v;
          abs += std::fabs(v);
        }
        ASSERT_TRUE(Near(grad(i), s, 1e-5 * abs + ulp * std::fabs(s) + 1e-7, on_a ? "bgrada" : "bgradb", i, 0));
      }
    }
  }
}

class LtEpilogueTest
    : public ::testing::TestWithParam<std::tuple<int, cublasLtEpilogue_t, cublasOperation_t, cublasOperation_t>> {};

TEST_P(LtEpilogueTest, MatchesReference) {
  const auto [type, epi, ta, tb] = GetParam();
  LtCase t;
  t.ab = t.cd = type;
  t.epi = epi;
  t.ta = ta;
  t.tb = tb;
  const bool dgelu = HasAuxIn(epi);
  for (bool in_place : {false, true}) {
    for (float beta : {0.0f, 0.5f}) {
      t.in_place = in_place;
      t.beta = beta;
      t.seed = 1 + in_place + 2 * (beta != 0);
      CheckLt(t);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // Odd shapes, several row blocks, a batch of 2 with bias / aux batch strides.
  t.in_place = false;
  t.beta = dgelu ? 0.0f : 1.0f;
  t.m = 261;
  t.n = 6;
  t.k = 37;
  t.batch = 2;
  t.seed = 9;
  CheckLt(t);
}

INSTANTIATE_TEST_SUITE_P(
    All, LtEpilogueTest,
    ::testing::Combine(::testing::Values(CUDA_R_32F, CUDA_R_16BF),
                       ::testing::Values(CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU,
                                         CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_GELU,
                                         CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,
                                         CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU,
                                         CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,
                                         CUBLASLT_EPILOGUE_BGRADB),
                       ::testing::Values(CUBLAS_OP_N, CUBLAS_OP_T), ::testing::Values(CUBLAS_OP_N, CUBLAS_OP_T)));

TEST(CublasEmu, LtMixedTypesOrdersPointerModes) {
  LtCase t;
  // bf16 / fp16 inputs with fp32 C/D; fp16 end to end.
  for (auto [ab, cd] : {std::pair{CUDA_R_16BF, CUDA_R_32F}, std::pair{CUDA_R_16F, CUDA_R_32F},
                        std::pair{CUDA_R_16F, CUDA_R_16F}}) {
    t.ab = ab;
    t.cd = cd;
    t.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    CheckLt(t);
  }
  t = LtCase{};
  // Row-order A, B and C/D (DEFAULT, BIAS, GELU epilogues allow row-order D).
  for (auto epi : {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU}) {
    t.order_a = t.order_b = t.order_cd = CUBLASLT_ORDER_ROW;
    t.ta = CUBLAS_OP_T;
    t.epi = epi;
    CheckLt(t);
  }
  t = LtCase{};
  t.order_a = CUBLASLT_ORDER_ROW;  // mixed orders
  t.tb = CUBLAS_OP_T;
  CheckLt(t);
  // Vector pointer modes, batched.
  for (int32_t mode : {int32_t(CUBLASLT_POINTER_MODE_DEVICE), int32_t(CUBLASLT_POINTER_MODE_DEVICE_VECTOR),
                       int32_t(CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO),
                       int32_t(CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST)}) {
    t = LtCase{};
    t.pointer_mode = mode;
    t.batch = 2;
    t.epi = CUBLASLT_EPILOGUE_BIAS;
    CheckLt(t);
  }
  // C with leading dimension 0 (column broadcast); no algorithm (implicit heuristic).
  t = LtCase{};
  t.ldc_zero = true;
  t.use_algo = false;
  CheckLt(t);
}

// The linear-layer sequence of kernels/matmul.cu: out^T = W . inp^T + b with the GELU epilogue,
// the weight transposed, alignments told to the heuristic, then DGELU backward with that aux.
TEST(CublasEmu, LtMatmulCuSequence) {
  for (int type : {CUDA_R_32F, CUDA_R_16BF}) {
    LtCase fwd;
    fwd.ab = fwd.cd = type;
    fwd.ta = CUBLAS_OP_T;
    fwd.m = 24;  // OC
    fwd.n = 10;  // N
    fwd.k = 16;  // C
    fwd.beta = 0.0f;
    fwd.alpha = 1.0f;
    fwd.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    CheckLt(fwd);
    LtCase bwd = fwd;
    bwd.ta = CUBLAS_OP_N;
    bwd.epi = CUBLASLT_EPILOGUE_DGELU;
    CheckLt(bwd);
    LtCase res = fwd;  // residual: C != D, beta 1
    res.beta = 1.0f;
    res.epi = CUBLASLT_EPILOGUE_BIAS;
    CheckLt(res);
  }
}

TEST(CublasEmu, LtAttributes) {
  Desc desc;
  int32_t v = 0;
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &v, sizeof(v), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(v, CUBLAS_COMPUTE_32F);
  EXPECT_EQ(written, sizeof(v));
  uint32_t epi = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(epi, uint32_t{CUBLASLT_EPILOGUE_DEFAULT});
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(void*));
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_TRANSA, int64_t{1}), CUBLAS_STATUS_INVALID_VALUE);  // wrong size
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(desc.Set(static_cast<cublasLtMatmulDescAttributes_t>(9), int32_t{0}), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{64}), CUBLAS_STATUS_SUCCESS);
  int64_t ld = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(ld, 64);

  cublasLtMatrixLayout_t l;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 3, 4, 5), CUBLAS_STATUS_SUCCESS);
  uint64_t rows = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(rows, 3u);
  uint32_t type = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof(type), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(type, uint32_t{CUDA_R_16BF});
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);

  // Descriptors initialised in caller storage.
  cublasLtMatmulDescOpaque_t storage;
  EXPECT_EQ(cublasLtMatmulDescInit(&storage, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(&storage, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &v, sizeof(v), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(v, CUDA_R_32F);

  Pref pref;
  uint32_t align = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align,
                                                 sizeof(align), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(align, 256u);
  EXPECT_EQ(pref.Set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint32_t{5}), CUBLAS_STATUS_INVALID_VALUE);
}

// Error statuses of the heuristic and the matmul.
TEST(CublasEmu, LtErrors) {
  Lt lt;
  Matrix a(CUDA_R_16BF, 16, 8, 16), b(CUDA_R_16BF, 8, 12, 8), d(CUDA_R_16BF, 16, 12, 16);
  Matrix aux(CUDA_R_16BF, 16, 12, 16), bias(CUDA_R_16BF, 16, 1, 16);
  std::mt19937 rng(3);
  a.Fill(rng);
  b.Fill(rng);
  const float one = 1.0f, zero = 0.0f;
  auto heuristic = [&](Desc& desc, const Layout& la, const Layout& lb, const Layout& lc, const Layout& ld, Pref& pref,
                       cublasLtMatmulHeuristicResult_t* r = nullptr, int count = 1) {
    cublasLtMatmulHeuristicResult_t local;
    int found = -1;
    return cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, la.l, lb.l, lc.l, ld.l, pref.p, count, r ? r : &local, &found);
  };
  Layout la(a), lb(b), ld(d);
  Pref pref;
  {
    Desc desc;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, desc.d, la.l, lb.l, ld.l, ld.l, pref.p, 1, &r, &found),
              CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref, nullptr, 0), CUBLAS_STATUS_INVALID_VALUE);  // count 0
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmul(nullptr, desc.d, &one, a.data(), la.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(),
                             ld.l, nullptr, nullptr, 0, nullptr),
              CUBLAS_STATUS_NOT_INITIALIZED);
    // Shape conflict: op(A) is 16 x 8 but B is 8 x 12 transposed -> 12 x 8.
    desc.Set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t{CUBLAS_OP_T});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_INVALID_VALUE);
    desc.Set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t{CUBLAS_OP_N});
    // A null alpha; a misaligned workspace; an unknown stream.
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, nullptr, a.data(), la.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(),
                             ld.l, nullptr, nullptr, 0, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
    DeviceBuffer ws(1024);
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a.data(), la.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(),
                             ld.l, nullptr, static_cast<char*>(ws.get()) + 64, 512, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a.data(), la.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(),
                             ld.l, nullptr, nullptr, 0, reinterpret_cast<cudaStream_t>(0x77)),
              CUBLAS_STATUS_EXECUTION_FAILED);
    // C == D with a different C layout.
    Matrix c2(CUDA_R_16BF, 16, 12, 20);
    Layout lc2(c2);
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a.data(), la.l, b.data(), lb.l, &one, d.data(), lc2.l, d.data(),
                             ld.l, nullptr, nullptr, 0, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
    // Alignment: an algorithm chosen for 16-byte alignment refuses an A at +2 bytes; one chosen for
    // 2 bytes runs it.
    cublasLtMatmulHeuristicResult_t r16, r2;
    ASSERT_EQ(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{16}), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(heuristic(desc, la, lb, ld, ld, pref, &r16), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{2}), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(heuristic(desc, la, lb, ld, ld, pref, &r2), CUBLAS_STATUS_SUCCESS);
    Matrix a_big(CUDA_R_16BF, 17, 8, 17);  // A at element 1 of it: 2-byte aligned, ld 17
    a_big.Fill(rng);
    Matrix a17(CUDA_R_16BF, 16, 8, 17);
    Layout la17(a17);
    const void* a_off = static_cast<const char*>(a_big.data()) + 2;
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a_off, la17.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(), ld.l,
                             &r16.algo, nullptr, 0, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a_off, la17.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(), ld.l,
                             &r2.algo, nullptr, 0, nullptr),
              CUBLAS_STATUS_SUCCESS);
    // Below the element size: no algorithm.
    ASSERT_EQ(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{1}), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_NOT_SUPPORTED);
    ASSERT_EQ(pref.Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{256}), CUBLAS_STATUS_SUCCESS);
    // A garbage algorithm.
    cublasLtMatmulAlgo_t junk{};
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a.data(), la.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(),
                             ld.l, &junk, nullptr, 0, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
  }
  {
    // Leading dimension below rows.
    Matrix bad(CUDA_R_16BF, 16, 8, 15);
    Layout lbad(bad);
    Desc desc;
    EXPECT_EQ(heuristic(desc, lbad, lb, ld, ld, pref), CUBLAS_STATUS_INVALID_VALUE);
  }
  {
    // Types: fp32 inputs with bf16 output; A/B types differ; FAST_TF32 with bf16; a bf16 scale type.
    Matrix af(CUDA_R_32F, 16, 8, 16), df(CUDA_R_32F, 16, 12, 16);
    Layout laf(af), ldf(df);
    Desc desc;
    EXPECT_EQ(heuristic(desc, laf, lb, ld, ld, pref), CUBLAS_STATUS_NOT_SUPPORTED);
    Matrix bf(CUDA_R_32F, 8, 12, 8);
    Layout lbf(bf);
    EXPECT_EQ(heuristic(desc, laf, lbf, ld, ld, pref), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(heuristic(desc, laf, lbf, ldf, ldf, pref), CUBLAS_STATUS_SUCCESS);
    Desc tf32(CUBLAS_COMPUTE_32F_FAST_TF32);
    EXPECT_EQ(heuristic(tf32, la, lb, ld, ld, pref), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(heuristic(tf32, laf, lbf, ldf, ldf, pref), CUBLAS_STATUS_SUCCESS);
    Desc scale16(CUBLAS_COMPUTE_32F, CUDA_R_16BF);
    EXPECT_EQ(heuristic(scale16, la, lb, ld, ld, pref), CUBLAS_STATUS_NOT_SUPPORTED);
    // C and D of different types.
    EXPECT_EQ(heuristic(desc, laf, lbf, ld, ldf, pref), CUBLAS_STATUS_INVALID_VALUE);
  }
  {
    // Epilogues: aux missing, aux ld not a multiple of 8 or below m, aux type, bias type, ReLU
    // bit-mask epilogues, row-order D with a fused bias + GELU, unknown epilogue, missing bias.
    Desc desc;
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_GELU_AUX_BIAS});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_INVALID_VALUE);  // no aux pointer
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.data());
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{20});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_INVALID_VALUE);  // 20 % 8 != 0
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{8});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_INVALID_VALUE);  // 8 < m = 16
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{16});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_SUCCESS);
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, int32_t{CUDA_R_32F});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_INVALID_VALUE);
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, int32_t{CUDA_R_16BF});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_SUCCESS);
    // No bias pointer: the heuristic does not look, the matmul refuses.
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a.data(), la.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(),
                             ld.l, nullptr, nullptr, 0, nullptr),
              CUBLAS_STATUS_INVALID_VALUE);
    desc.Set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.data());
    desc.Set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t{CUDA_R_32F});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_NOT_SUPPORTED);  // fp32 bias, bf16 D
    desc.Set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t{-1});
    for (auto bits : {CUBLASLT_EPILOGUE_RELU_AUX, CUBLASLT_EPILOGUE_DRELU_BGRAD}) {
      desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(bits));
      EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_NOT_SUPPORTED);
    }
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{3});
    EXPECT_EQ(heuristic(desc, la, lb, ld, ld, pref), CUBLAS_STATUS_INVALID_VALUE);
    Matrix drow(CUDA_R_16BF, 16, 12, 12, CUBLASLT_ORDER_ROW);
    Layout ldrow(drow);
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_GELU_BIAS});
    EXPECT_EQ(heuristic(desc, la, lb, ldrow, ldrow, pref), CUBLAS_STATUS_NOT_SUPPORTED);
    desc.Set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_BIAS});
    EXPECT_EQ(heuristic(desc, la, lb, ldrow, ldrow, pref), CUBLAS_STATUS_SUCCESS);
    // A bias vector that runs past its allocation.
    desc.Set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(static_cast<const char*>(bias.data()) + 8));
    EXPECT_EQ(cublasLtMatmul(lt.h, desc.d, &one, a.data(), la.l, b.data(), lb.l, &zero, d.data(), ld.l, d.data(),
                             ld.l, nullptr, nullptr, 0, nullptr),
              CUBLAS_STATUS_EXECUTION_FAILED);
  }
}

// Bits do not depend on the number of threads.
TEST(CublasEmu, DeterministicAcrossThreadCounts) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng(21);
  const int m = 301, n = 77, k = 129;
  Matrix a(CUDA_R_32F, k, m, k), b(CUDA_R_32F, k, n, k), c1(CUDA_R_32F, m, n, m), c2(CUDA_R_32F, m, n, m);
  a.Fill(rng);
  b.Fill(rng);
  const float one = 1.0f, zero = 0.0f;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a.data(), CUDA_R_32F, k, b.data(), CUDA_R_32F, k,
                         &zero, c1.data(), CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  omp_set_num_threads(std::max(threads, 3));
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a.data(), CUDA_R_32F, k, b.data(), CUDA_R_32F, k,
                         &zero, c2.data(), CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), size_t(m) * n * 4), 0);
  cublasDestroy(h);
}

// Not a correctness test: how long the GEMM sizes of the emulator tests take (printed).
TEST(CublasEmu, Speed) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng(4);
  const int m = 2048, n = 512, k = 768;  // out^T (OC=2048, N=512) = W (2048 x 768) . inp^T
  for (int type : {CUDA_R_32F, CUDA_R_16BF}) {
    Matrix a(type, k, m, k), b(type, k, n, k), c(type, m, n, m);
    a.Fill(rng);
    b.Fill(rng);
    const float one = 1.0f, zero = 0.0f;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a.data(), cudaDataType(type), k, b.data(),
                           cudaDataType(type), k, &zero, c.data(), cudaDataType(type), m, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %s %dx%dx%d: %.3f s, %.2f GFLOP/s (%d threads)\n", type == CUDA_R_32F ? "fp32" : "bf16", m, n, k,
                s, 2.0 * m * n * k / s / 1e9, omp_get_max_threads());
  }
  cublasDestroy(h);
}

}  // namespace
