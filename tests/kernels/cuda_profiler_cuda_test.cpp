// cuda::RangeProfiler (kernels/cuda_profiler.h): named ranges of stream work timed with events,
// totals per name in first-seen order, counts, dropping beyond capacity; and GPT2Cuda's use of it
// (every piece of a step named once per layer). Skipped without a GPU.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda_profiler.h"
#include "kernels/elementwise.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf {
namespace {

using test::DeviceArray;

TEST(RangeProfilerCuda, TotalsPerNameInOrder) {
  TF_SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto p = cuda::RangeProfiler::Create(stream, 8);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const long n = 1 << 22;
    DeviceArray in(std::vector<float>(n, 0.5f), cuda::DType::kF32), out = DeviceArray::Poisoned(n, cuda::DType::kF32);
    for (int rep = 0; rep < 2; ++rep) {
      (*p)->Begin("gelu");
      ASSERT_TRUE(cuda::gelu_forward(out.data(), in.data(), n, cuda::DType::kF32, stream).ok());
      (*p)->Begin("copy");  // closes "gelu"
      ASSERT_EQ(cudaMemcpyAsync(out.data(), in.data(), n * 4, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
      (*p)->End();
    }
    auto totals = (*p)->Collect();
    ASSERT_TRUE(totals.ok()) << totals.status().ToString();
    ASSERT_EQ(totals->size(), 2u);
    EXPECT_EQ((*totals)[0].name, "gelu");
    EXPECT_EQ((*totals)[1].name, "copy");
    for (const auto& t : *totals) {
      EXPECT_EQ(t.count, 2) << t.name;
      EXPECT_GT(t.ms, 0.0) << t.name;
    }
    auto again = (*p)->Collect();  // cleared by the previous collection
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->empty());
    for (int i = 0; i < 10; ++i) (*p)->Begin("x");  // capacity 8 ranges
    (*p)->End();
    EXPECT_EQ((*p)->dropped(), 2);
    auto capped = (*p)->Collect();
    ASSERT_TRUE(capped.ok());
    ASSERT_EQ(capped->size(), 1u);
    EXPECT_EQ((*capped)[0].count, 8);
  }
  cudaStreamDestroy(stream);
}

TEST(RangeProfilerCuda, RejectsNoCapacity) {
  TF_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::RangeProfiler::Create(nullptr, 0).ok());
}

}  // namespace
}  // namespace tf
