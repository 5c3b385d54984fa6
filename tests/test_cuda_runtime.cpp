// CUDA memory, streams, events and copies on a GPU (label cuda). Every test skips
// with a message where no GPU is visible; the allocator's policy itself is tested on
// the CPU in test_caching_allocator.cpp.
#include <thread>

#include "dtensor/cuda.h"
#include "test_helpers.h"

using namespace dtensor;

TEST(CudaRuntime, BadDevicesFailClearly) {
  if (!cuda_is_available()) {
    if (std::getenv("DTENSOR_REQUIRE_GPU")) FAIL() << "DTENSOR_REQUIRE_GPU is set but no GPU is visible";
    EXPECT_EQ(cuda_device_count(), 0);
    EXPECT_THROW(Tensor::zeros({2}, DType::F32, Device::cuda(0)), std::exception);
    EXPECT_EQ(cuda::memory_pool_stats(0).reserved_bytes, 0);
    GTEST_SKIP() << "no GPU here: run scripts/gpu-check.sh on a GPU machine";
  }
  EXPECT_THROW_MSG(Tensor::zeros({2}, DType::F32, Device::cuda(cuda_device_count())), std::invalid_argument,
                   "expected a GPU index in [0, ");
}

TEST(CudaRuntime, FreedMemoryIsReusedOnTheSameStream) {
  REQUIRE_GPU();
  const auto before = cuda::memory_pool_stats(0);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::F32, Device::cuda(0));  // 4 MiB
    first = t.data_ptr();
    EXPECT_EQ(memory_stats(Device::cuda()).live_bytes % 4, 0);
  }
  Tensor again = Tensor::empty({1 << 20}, DType::F32, Device::cuda(0));
  EXPECT_EQ(again.data_ptr(), first);
  const auto after = cuda::memory_pool_stats(0);
  EXPECT_LE(after.driver_allocations - before.driver_allocations, 1);
  EXPECT_GE(after.allocations - before.allocations, 2);
}

TEST(CudaRuntime, CopiesBothWaysSmallAndStaged) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t{7}, int64_t{5} << 20}) {  // direct, and through pinned buffers in pieces
    Tensor x = Tensor::arange(0, static_cast<double>(n), 1, DType::I64).to(DType::F32);
    Tensor g = x.to(Device::cuda(0));
    Tensor back = g.to(Device::cpu());
    EXPECT_TRUE(allclose(back, x, 0, 0)) << n;
  }
}

TEST(CudaRuntime, ThreadsGetTheirOwnStreamsAndEventsOrderThem) {
  REQUIRE_GPU();
  cuda::Stream mine = cuda::current_stream(0);
  cuda::Stream theirs;
  std::thread([&] { theirs = cuda::current_stream(0); }).join();
  EXPECT_TRUE(mine.valid());
  EXPECT_NE(mine, theirs);
  cuda::Stream other = cuda::Stream::from_pool(0);
  {
    cuda::StreamGuard guard(other);
    EXPECT_EQ(cuda::current_stream(0), other);
  }
  EXPECT_EQ(cuda::current_stream(0), mine);
  cuda::Event start(true), stop(true);
  start.record();
  Tensor g = Tensor::ones({1 << 20}, DType::F32).to(Device::cuda(0));
  stop.record();
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GE(start.elapsed_ms(stop), 0.0f);
  stop.wait(other);
  other.synchronize();
}

TEST(CudaRuntime, EmptyCacheReturnsFreeSegments) {
  REQUIRE_GPU();
  { Tensor t = Tensor::empty({64 << 20}, DType::F32, Device::cuda(0)); }
  EXPECT_GE(cuda::memory_pool_stats(0).reserved_bytes, int64_t{256} << 20);
  cuda::empty_cache();
  EXPECT_LT(cuda::memory_pool_stats(0).reserved_bytes, int64_t{256} << 20);
}
