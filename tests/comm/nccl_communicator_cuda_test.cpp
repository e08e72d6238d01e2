// The NCCL communicator on one GPU (the GPU check machine has one): loading NCCL at run time,
// bootstrap of a 1-rank communicator, and every collective's semantics at world size 1 on device
// buffers (multi-GPU collectives need a multi-GPU machine: run comm_mpi_test's cases there).
// Skips without a GPU; skips with the reason when libnccl.so.2 cannot be found.
#include <cuda_runtime_api.h>

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "comm/nccl_communicator.h"
#include "tests/kernels/cuda_test_util.h"

namespace tf::comm {
namespace {

TEST(NcclCommunicator, OneRankCollectivesOnDeviceBuffers) {
  TF_SKIP_WITHOUT_GPU();
  std::string why;
  if (!NcclAvailable(&why)) GTEST_SKIP() << why;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Topology t;  // world 1
  auto c = NcclCommunicator::Create(t, stream);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const int n = 1000;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.5f);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(a, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE((*c)->AllReduceSum(a, n, DataType::kF32).ok());
  const int64_t counts[] = {n};
  ASSERT_TRUE((*c)->ReduceScatterSum(a, b, counts, DataType::kF32).ok());
  ASSERT_TRUE((*c)->Synchronize().ok());
  std::vector<float> out(n);
  ASSERT_EQ(cudaMemcpy(out.data(), b, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out, host);
  ASSERT_EQ(cudaMemset(b, 0, n * 4), cudaSuccess);
  ASSERT_TRUE((*c)->AllToAll(a, b, n * 4).ok());
  ASSERT_TRUE((*c)->Synchronize().ok());
  ASSERT_EQ(cudaMemcpy(out.data(), b, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out, host);
  ASSERT_TRUE((*c)->AllGatherV(a, b, counts, DataType::kF32).ok());
  ASSERT_TRUE((*c)->Broadcast(b, n * 4, 0).ok());
  ASSERT_TRUE((*c)->Barrier().ok());
  ASSERT_EQ(cudaMemcpy(out.data(), b, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out, host);
  cudaFree(a);
  cudaFree(b);
  c->reset();
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tf::comm
