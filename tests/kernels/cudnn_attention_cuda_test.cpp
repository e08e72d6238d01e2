// cuDNN fused attention (kernels/cudnn_attention.h) against the CPU attention (kernels/attention.cpp),
// a float64 log-sum-exp and our flash kernels (kernels/flash_attention.h), plus loading, plan caching
// and argument checks.
//
// Tolerances: those of flash_attention_cuda_test.cpp for bf16 storage, for the same reasons. Inputs
// are rounded to bf16 on both sides; cuDNN's engines round the probabilities P and dS to bf16 before
// their second products (the graph says so: P, Pᵀ, dSᵀ are bf16 tensors) and round outputs to bf16, so
// the normwise relative error ||got - want|| / ||want|| must stay under 1e-2 and every element within
// 2e-2 (forward) / 5e-2 (backward) of the RMS-floored bound (test::ExpectClose). lse is computed from
// the same rounded inputs with fp32 products: 1e-3 relative. Layout, masking or statistics bugs give
// O(1) errors and fail both. Every output is NaN-poisoned first.
//
// Skips: without a GPU (TF_SKIP_WITHOUT_GPU) and, with a clear message, when libcudnn.so.9 cannot be
// loaded (CudnnLibraryStatus). The host-only tests run everywhere: a load failure is a Status, and
// when cuDNN is loadable (no GPU needed) every tensor and operation descriptor of both graphs
// finalizes in the real library.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/cudnn_attention.h"
#include "kernels/flash_attention.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::ReferenceLse;

using cuda::CudnnAttention;
using cuda::DType;
using test::DeviceArray;
using Dir = CudnnAttention::Direction;

#define TF_SKIP_WITHOUT_CUDNN()                                                                      \
  do {                                                                                               \
    TF_SKIP_WITHOUT_GPU();                                                                           \
    if (::tf::Status s_ = ::tf::cuda::CudnnLibraryStatus(); !s_.ok())                                \
      GTEST_SKIP() << "cuDNN cannot be loaded: " << s_.ToString();                                   \
  } while (0)

using Shape = test::AttentionShape;
using test::Name;

// T = 1, below / at / above a 64-row tile, not a multiple of 128 (the <= 9.15 padding workaround),
// long rows; hs 64 with 2, 4, 12 heads and hs 128.
const std::vector<Shape> kShapes = {
    {2, 1, 256, 4}, {2, 17, 256, 4}, {2, 64, 768, 12}, {2, 100, 256, 2}, {1, 1024, 256, 4}, {1, 1024, 256, 2},
};

std::vector<float> RandomBf16(size_t n, float scale, uint32_t seed) {
  return test::RoundBf16(test::RandomVector(n, scale, seed));
}

// Normwise under 1e-2 and per element under `elem` of the RMS-floored bound.
void ExpectMatchesBf16(const std::vector<float>& got, const std::vector<float>& want, double elem,
                       const std::string& what) {
  test::ExpectAttentionClose(got, want, /*bf16=*/true, 0.0, elem, what);
}


// A device workspace of at least `bytes` (never a null pointer).
cuda::DeviceBuffer Workspace(size_t bytes) {
  auto b = cuda::DeviceBuffer::Allocate(std::max<size_t>(bytes, 256));
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : cuda::DeviceBuffer();
}

std::unique_ptr<CudnnAttention> MakeAttention(cuda::CudnnAttentionOptions options) {
  auto a = CudnnAttention::Create(options);
  EXPECT_TRUE(a.ok()) << "cuDNN loads and a GPU is visible, yet Create failed: " << a.status().ToString();
  return a.ok() ? std::move(*a) : nullptr;
}

struct Outputs {
  std::vector<float> out, lse, dqkv;
};

// Forward then backward through `attn` on host inputs; outputs NaN-poisoned first.
Outputs RunBoth(CudnnAttention& attn, const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
  const size_t n_lse = size_t(s.B) * s.NH * s.T;
  DeviceArray d_qkv(qkv, DType::kBF16), d_dout(dout, DType::kBF16);
  auto out = DeviceArray::Poisoned(n_out, DType::kBF16);
  auto lse = DeviceArray::Poisoned(n_lse, DType::kF32);
  auto dqkv = DeviceArray::Poisoned(n_qkv, DType::kBF16);
  Outputs r;
  auto fwd_ws = attn.WorkspaceBytes(Dir::kForward, s.B, s.T, s.C, s.NH);
  EXPECT_TRUE(fwd_ws.ok()) << Name(s) << ": " << fwd_ws.status().ToString();
  if (!fwd_ws.ok()) return r;
  auto ws = Workspace(*fwd_ws);
  Status st = attn.Forward(out.data(), static_cast<float*>(lse.data()), d_qkv.data(), s.B, s.T, s.C, s.NH,
                           DType::kBF16, ws.data(), ws.bytes(), nullptr);
  EXPECT_TRUE(st.ok()) << Name(s) << ": " << st.ToString();
  if (!st.ok()) return r;
  r.out = out.Download();
  r.lse = lse.Download();
  auto bwd_ws = attn.WorkspaceBytes(Dir::kBackward, s.B, s.T, s.C, s.NH);
  EXPECT_TRUE(bwd_ws.ok()) << Name(s) << ": " << bwd_ws.status().ToString();
  if (!bwd_ws.ok()) return r;
  auto ws2 = Workspace(*bwd_ws);
  EXPECT_EQ(cudaMemset(ws2.data(), 0xff, ws2.bytes()), cudaSuccess);  // garbage in the workspace
  st = attn.Backward(dqkv.data(), d_dout.data(), d_qkv.data(), out.data(), static_cast<const float*>(lse.data()),
                     s.B, s.T, s.C, s.NH, DType::kBF16, ws2.data(), ws2.bytes(), nullptr);
  EXPECT_TRUE(st.ok()) << Name(s) << ": " << st.ToString();
  if (!st.ok()) return r;
  r.dqkv = dqkv.Download();
  return r;
}

class CudnnAttentionCuda : public ::testing::TestWithParam<bool> {};  // param: deterministic

TEST_P(CudnnAttentionCuda, MatchesCpu) {
  TF_SKIP_WITHOUT_CUDNN();
  auto attn = MakeAttention({.deterministic = GetParam()});
  ASSERT_NE(attn, nullptr);
  for (const Shape& s : kShapes) {
    const std::string what = Name(s) + (GetParam() ? " deterministic" : " non-deterministic");
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const auto qkv = RandomBf16(n_qkv, 1.0f, 11);  // scores q.k / sqrt(hs) ~ N(0, 1)
    const auto dout = RandomBf16(n_out, 1.0f, 12);
    std::vector<float> want_out(n_out), att(size_t(s.B) * s.NH * s.T * s.T), want_dqkv(n_qkv);
    cpu::attention_forward(want_out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    std::vector<float> scratch(static_cast<size_t>(cpu::attention_scratch_floats(s.T)));
    cpu::attention_backward(want_dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH,
                            scratch.data(), long(scratch.size()));

    const Outputs got = RunBoth(*attn, s, qkv, dout);
    ASSERT_FALSE(got.dqkv.empty()) << what << ": did not run (see above)";
    ExpectMatchesBf16(got.out, want_out, 2e-2, "cudnn forward out " + what);
    test::ExpectClose(got.lse, ReferenceLse(qkv, s.B, s.T, s.C, s.NH), 1e-3, "cudnn forward lse " + what);
    ExpectMatchesBf16(got.dqkv, want_dqkv, 5e-2, "cudnn backward dqkv " + what);
    if (HasFatalFailure()) return;
  }
  std::cout << "[ info ] " << attn->Describe() << "\n";
}

// GPT-2's head layout at full length against our flash kernels (a CPU reference would be slow here).
TEST_P(CudnnAttentionCuda, MatchesFlashAttentionAtGpt2Shape) {
  TF_SKIP_WITHOUT_CUDNN();
  auto attn = MakeAttention({.deterministic = GetParam()});
  ASSERT_NE(attn, nullptr);
  const Shape s{4, 1024, 768, 12};
  const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
  const size_t n_lse = size_t(s.B) * s.NH * s.T;
  const auto qkv = RandomBf16(n_qkv, 1.0f, 21);
  const auto dout = RandomBf16(n_out, 1.0f, 22);
  DeviceArray d_qkv(qkv, DType::kBF16), d_dout(dout, DType::kBF16);
  auto out = DeviceArray::Poisoned(n_out, DType::kBF16);
  auto lse = DeviceArray::Poisoned(n_lse, DType::kF32);
  auto dqkv = DeviceArray::Poisoned(n_qkv, DType::kBF16);
  ASSERT_TRUE(cuda::flash_attention_forward(out.data(), static_cast<float*>(lse.data()), d_qkv.data(), s.B, s.T, s.C,
                                            s.NH, DType::kBF16, nullptr)
                  .ok());
  auto scratch = Workspace(cuda::flash_attention_backward_scratch_bytes(s.B, s.T, s.NH));
  ASSERT_TRUE(cuda::flash_attention_backward(dqkv.data(), d_dout.data(), d_qkv.data(), out.data(),
                                             static_cast<const float*>(lse.data()), s.B, s.T, s.C, s.NH,
                                             DType::kBF16, scratch.data(), scratch.bytes(), nullptr)
                  .ok());
  const Outputs got = RunBoth(*attn, s, qkv, dout);
  ASSERT_FALSE(got.dqkv.empty());
  ExpectMatchesBf16(got.out, out.Download(), 2e-2, "cudnn vs flash out " + Name(s));
  test::ExpectClose(got.lse, lse.Download(), 1e-3, "cudnn vs flash lse " + Name(s));
  ExpectMatchesBf16(got.dqkv, dqkv.Download(), 5e-2, "cudnn vs flash dqkv " + Name(s));
}

// Deterministic mode: two forward and two backward runs are bit-identical. (Non-deterministic mode
// reports whether its runs happened to agree, without failing.)
TEST_P(CudnnAttentionCuda, Reproducibility) {
  TF_SKIP_WITHOUT_CUDNN();
  auto attn = MakeAttention({.deterministic = GetParam()});
  ASSERT_NE(attn, nullptr);
  for (const Shape& s : {Shape{2, 200, 768, 12}, Shape{1, 1024, 256, 2}}) {
    const size_t n_qkv = size_t(s.B) * s.T * 3 * s.C, n_out = size_t(s.B) * s.T * s.C;
    const auto qkv = RandomBf16(n_qkv, 1.0f, 31);
    const auto dout = RandomBf16(n_out, 1.0f, 32);
    const Outputs a = RunBoth(*attn, s, qkv, dout), b = RunBoth(*attn, s, qkv, dout);
    ASSERT_FALSE(a.dqkv.empty());
    ASSERT_FALSE(b.dqkv.empty());
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(a.out, b.out)) << "forward out differs between runs: " << Name(s);
    EXPECT_TRUE(same(a.lse, b.lse)) << "forward lse differs between runs: " << Name(s);
    if (GetParam()) {
      EXPECT_TRUE(same(a.dqkv, b.dqkv)) << "deterministic backward dqkv differs between runs: " << Name(s);
    } else {
      std::cout << "[ info ] non-deterministic backward, " << Name(s) << ": runs "
                << (same(a.dqkv, b.dqkv) ? "agreed" : "differed") << "\n";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CudnnAttentionCuda, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "deterministic" : "atomic_dq"); });

// A plan is built once per (shape, direction): the second call reuses it.
TEST(CudnnAttentionCudaPlans, AreCached) {
  TF_SKIP_WITHOUT_CUDNN();
  auto attn = MakeAttention({});
  ASSERT_NE(attn, nullptr);
  const Shape s{2, 64, 256, 4};
  EXPECT_EQ(attn->plans_built(), 0);
  auto ws = attn->WorkspaceBytes(Dir::kForward, s.B, s.T, s.C, s.NH);
  ASSERT_TRUE(ws.ok()) << ws.status().ToString();
  EXPECT_EQ(attn->plans_built(), 1);
  const auto qkv = RandomBf16(size_t(s.B) * s.T * 3 * s.C, 1.0f, 41);
  const auto dout = RandomBf16(size_t(s.B) * s.T * s.C, 1.0f, 42);
  ASSERT_FALSE(RunBoth(*attn, s, qkv, dout).dqkv.empty());
  EXPECT_EQ(attn->plans_built(), 2);  // + the backward
  ASSERT_FALSE(RunBoth(*attn, s, qkv, dout).dqkv.empty());
  EXPECT_EQ(attn->plans_built(), 2);  // nothing rebuilt
  auto other = attn->WorkspaceBytes(Dir::kForward, s.B, s.T + 1, s.C, s.NH);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(attn->plans_built(), 3);
  std::cout << "[ info ] " << attn->Describe() << "\n";
}

TEST(CudnnAttentionCudaArgs, RejectsBadArguments) {
  TF_SKIP_WITHOUT_CUDNN();
  auto attn = MakeAttention({});
  ASSERT_NE(attn, nullptr);
  DeviceArray buf(std::vector<float>(1 << 16, 0.0f), DType::kF32);
  void* p = buf.data();
  float* f = static_cast<float*>(p);
  auto fwd = [&](void* out, float* lse, const void* qkv, int B, int T, int C, int NH, DType dt, size_t ws_bytes) {
    return attn->Forward(out, lse, qkv, B, T, C, NH, dt, p, ws_bytes, nullptr).code();
  };
  const size_t big = buf.size() * 4;
  EXPECT_EQ(fwd(p, f, p, 1, 4, 128, 2, DType::kF32, big), StatusCode::kInvalidArgument);   // fp32: own kernels
  EXPECT_EQ(fwd(p, f, p, 1, 4, 129, 2, DType::kBF16, big), StatusCode::kInvalidArgument);  // C % NH != 0
  EXPECT_EQ(fwd(p, f, p, 1, 0, 128, 2, DType::kBF16, big), StatusCode::kInvalidArgument);  // T = 0
  EXPECT_EQ(fwd(p, f, p, 0, 4, 128, 2, DType::kBF16, big), StatusCode::kInvalidArgument);  // B = 0
  EXPECT_EQ(fwd(p, f, p, 1, 2, 256, 1, DType::kBF16, big), StatusCode::kInvalidArgument);  // hs = 256
  EXPECT_EQ(fwd(p, f, p, 1, 2, 24, 2, DType::kBF16, big), StatusCode::kInvalidArgument);   // hs = 12
  EXPECT_EQ(fwd(nullptr, f, p, 1, 4, 128, 2, DType::kBF16, big), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(p, nullptr, p, 1, 4, 128, 2, DType::kBF16, big), StatusCode::kInvalidArgument);
  EXPECT_EQ(fwd(p, f, nullptr, 1, 4, 128, 2, DType::kBF16, big), StatusCode::kInvalidArgument);
  void* misaligned = static_cast<char*>(p) + 2;
  EXPECT_EQ(fwd(p, f, misaligned, 1, 4, 128, 2, DType::kBF16, big), StatusCode::kInvalidArgument);
  EXPECT_EQ(attn->Backward(p, p, p, p, nullptr, 1, 4, 128, 2, DType::kBF16, p, big, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(attn->Backward(misaligned, p, p, p, f, 1, 4, 128, 2, DType::kBF16, p, big, nullptr).code(),
            StatusCode::kInvalidArgument);
  // A workspace smaller than the plan's (the backward always needs the row sums D).
  auto need = attn->WorkspaceBytes(Dir::kBackward, 1, 4, 128, 2);
  ASSERT_TRUE(need.ok()) << need.status().ToString();
  ASSERT_GT(*need, 0u);
  EXPECT_EQ(attn->Backward(p, p, p, p, f, 1, 4, 128, 2, DType::kBF16, p, *need - 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(attn->Backward(p, p, p, p, f, 1, 4, 128, 2, DType::kBF16, nullptr, *need, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(attn->WorkspaceBytes(Dir::kForward, 1, 4, 128, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing was launched with bad arguments
}

// ---- Host-only: these run without a GPU. ----

TEST(CudnnAttentionHost, LoadFailureIsStatus) {
  Status st = cuda::ProbeCudnnLibrary("/nonexistent/dir/libcudnn.so.9");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("/nonexistent/dir/libcudnn.so.9"), std::string::npos) << st.ToString();
  // A loadable library that is not cuDNN names the missing entry point.
  st = cuda::ProbeCudnnLibrary("libm.so.6");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("cudnnGetVersion"), std::string::npos) << st.ToString();
}

// The process-wide loader honours TRAINFLOW_CUDNN_LIBRARY (only that file) and reports a failure as a
// Status from CudnnLibraryStatus() and Create(). It caches its result, so this runs in a fresh process:
// the "threadsafe" death-test style re-executes the test binary for the child.
TEST(CudnnAttentionHost, EnvironmentOverrideFailureIsStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TRAINFLOW_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9", 1);
        Status st = cuda::CudnnLibraryStatus();
        auto created = CudnnAttention::Create();
        const bool ok = !st.ok() && st.message().find("TRAINFLOW_CUDNN_LIBRARY") != std::string::npos &&
                        !created.ok() && created.status().code() == StatusCode::kNotFound;
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "nonexistent");
}

// Every tensor and operation descriptor of both graphs (both backward variants, with and without the
// padding workaround of cuDNN <= 9.15) finalizes in the real library: attribute names, types and
// values are accepted. Needs cuDNN, not a GPU; the operation graph and plans need a GPU (tests above).
TEST(CudnnAttentionHost, GraphDescriptorsFinalize) {
  if (Status s = cuda::CudnnLibraryStatus(); !s.ok()) GTEST_SKIP() << "cuDNN cannot be loaded: " << s.ToString();
  for (bool deterministic : {true, false}) {
    for (int64_t version : {int64_t{0}, int64_t{91500}}) {
      for (const Shape& s : {Shape{2, 100, 768, 12}, Shape{1, 128, 256, 2}}) {
        for (Dir dir : {Dir::kForward, Dir::kBackward}) {
          Status st = CudnnAttention::CheckGraphOnHost(dir, s.B, s.T, s.C, s.NH, {.deterministic = deterministic},
                                                       version);
          EXPECT_TRUE(st.ok()) << Name(s) << (dir == Dir::kForward ? " forward" : " backward")
                               << (deterministic ? " deterministic" : " atomic dQ") << " version " << version
                               << ": " << st.ToString();
        }
      }
    }
  }
  EXPECT_EQ(CudnnAttention::CheckGraphOnHost(Dir::kForward, 1, 4, 256, 1).code(), StatusCode::kInvalidArgument);
}

// An H200 as cuDNN's device description (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION): what the fused
// engines are chosen and compiled for when there is no GPU.
constexpr const char* kH200Json =
    R"({"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],"regsPerBlock":65536,)"
    R"("multiProcessorCount":132,"warpSize":32,"maxSharedMemoryPerBlock":49152,)"
    R"("maxSharedMemoryPerBlockOptin":232448,"reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,)"
    R"("maxCtasPerSM":32,"maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,)"
    R"("supportCoopLaunch":1,"smClockRateKHz":1980000,"memClockRateKHz":3201000,"l2CacheSize":52428800,)"
    R"("deviceName":"NVIDIA H200","totalGlobalMem":150121971712,"cudaDeviceId":0,"deviceVer":900,)"
    R"("driverVer":13000})";

// The child process of EnginesAcceptTheGraphsForADescribedH200: loads the stub driver, plans every
// case, prints what cuDNN answered; exit code 0 when all compiled.
int PlanOnDescribedH200(const std::string& stub) {
    // The stub's SONAME is libcuda.so.1: cuDNN's dlopen("libcuda.so.1") then finds it loaded.
    if (dlopen(stub.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      std::fprintf(stderr, "cannot load %s\n", stub.c_str());
      return 2;
    }
    int failures = 0;
    struct Case {
      Shape s;
      Dir dir;
      bool deterministic;
    };
    const std::vector<Case> cases = {
        {{16, 1024, 768, 12}, Dir::kForward, true},   {{16, 1024, 768, 12}, Dir::kBackward, true},
        {{16, 1024, 768, 12}, Dir::kBackward, false}, {{24, 1024, 1600, 25}, Dir::kForward, true},
        {{24, 1024, 1600, 25}, Dir::kBackward, true}, {{2, 17, 256, 4}, Dir::kForward, true},
        {{2, 100, 256, 2}, Dir::kBackward, true},     {{1, 1, 256, 4}, Dir::kForward, true},
    };
    for (const Case& c : cases) {
      const std::string what = Name(c.s) + (c.dir == Dir::kForward ? " forward" : " backward") +
                               (c.deterministic ? "" : " atomic dQ");
      auto r = CudnnAttention::PlanOnDescribedDevice(c.dir, c.s.B, c.s.T, c.s.C, c.s.NH, kH200Json,
                                                     {.deterministic = c.deterministic});
      if (!r.ok()) {
        std::fprintf(stderr, "FAIL %s: %s\n", what.c_str(), r.status().ToString().c_str());
        ++failures;
        continue;
      }
      std::fprintf(stderr, "%s: %d engine configs, workspace %lld, plan: %s\n", what.c_str(), r->engine_configs,
                   static_cast<long long>(r->config_workspace), r->plan_status.c_str());
      if (r->engine_configs == 0 || !r->compiled) {
        std::fprintf(stderr, "FAIL %s: no engine compiled\n", what.c_str());
        ++failures;
      }
      // The deterministic backward's workspace: per batch and head (ceil(T/64)*64) x
      // (ceil(T/128)*128) bf16, plus a few hundred bytes (256 with cuDNN 9.19) — within the 1 MiB
      // slack of GPT2Cuda::EstimateCudnnWorkspace, which also adds the row sums.
      if (c.dir == Dir::kBackward && c.deterministic) {
        const int64_t t = c.s.T;
        const int64_t bound = int64_t{c.s.B} * c.s.NH * ((t + 63) / 64 * 64) * ((t + 127) / 128 * 128) * 2 + 65536;
        if (r->config_workspace > bound) {
          std::fprintf(stderr, "FAIL %s: workspace %lld above the estimate %lld\n", what.c_str(),
                       static_cast<long long>(r->config_workspace), static_cast<long long>(bound));
          ++failures;
        }
      }
    }
    std::fprintf(stderr, failures == 0 ? "ALL PLANNED\n" : "SOME FAILED\n");
    return failures == 0 ? 0 : 1;
}

// Without a GPU, cuDNN's fused flash-attention engines accept both graphs for a described H200 and
// compile them (planning stops only at loading the kernel into the absent driver): GPT-2 124M and
// 1558M training shapes, short and odd T, both backward variants. Runs in a child process that
// first loads the toolkit's stub libcuda (cuDNN's engines need one to load; the stub would poison a
// process that has a real driver, hence the child and the skip with a GPU). The deterministic
// backward's workspace is checked against the model's no-GPU estimate.
TEST(CudnnAttentionHost, EnginesAcceptTheGraphsForADescribedH200) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "a GPU is visible: the GPU tests plan on it directly";
  if (Status s = cuda::CudnnLibraryStatus(); !s.ok()) GTEST_SKIP() << "cuDNN cannot be loaded: " << s.ToString();
  std::string stub;
  for (const char* home : {static_cast<const char*>(std::getenv("CUDA_HOME")), "/usr/local/cuda"}) {
    if (home == nullptr) continue;
    for (const char* sub : {"/lib64/stubs/libcuda.so", "/lib/stubs/libcuda.so"}) {
      const std::string path = std::string(home) + sub;
      if (stub.empty() && access(path.c_str(), R_OK) == 0) stub = path;
    }
  }
  if (stub.empty()) GTEST_SKIP() << "no stub libcuda.so in the CUDA toolkit";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(PlanOnDescribedH200(stub)), ::testing::ExitedWithCode(0), "ALL PLANNED");
}

}  // namespace
}  // namespace tf
