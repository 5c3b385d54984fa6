// Tensor handles: factories, access, copies across dtypes, printing, comparison and
// the memory counters.
#include <thread>

#include "test_helpers.h"

using namespace dtensor;

TEST(Tensor, FactoriesFillEveryDtype) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32}) {
    Tensor z = Tensor::zeros({2, 3}, t);
    Tensor o = Tensor::ones({2, 3}, t);
    Tensor f = Tensor::full({4}, 3.0, t);
    EXPECT_EQ(z.dtype(), t);
    EXPECT_EQ(z.shape(), (Shape{2, 3}));
    EXPECT_EQ(z.to(DType::F64).to_vector<double>(), std::vector<double>(6, 0.0));
    EXPECT_EQ(o.to(DType::F64).to_vector<double>(), std::vector<double>(6, 1.0));
    EXPECT_EQ(f.to(DType::F64).to_vector<double>(), std::vector<double>(4, 3.0));
  }
  EXPECT_EQ(Tensor::full({2}, 1.0, DType::Bool).to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ(Tensor::arange(4).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(Tensor::arange(1, 2, 0.25).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(Tensor::arange(3, 0, -1, DType::I32).to_vector<int32_t>(), (std::vector<int32_t>{3, 2, 1}));
  Tensor s = Tensor::scalar(2.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item<double>(), 2.5);
  EXPECT_EQ(Tensor::empty({0, 3}).numel(), 0);
}

TEST(Tensor, FromVectorAndAccess) {
  Tensor t = Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), DType::I64);
  EXPECT_EQ(t.data<int64_t>()[4], 5);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.stride(0), 3);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(Tensor::from_vector<int64_t>({1LL << 60}).item<int64_t>(), 1LL << 60);  // exact
  EXPECT_EQ(t.select(1, 2).select(0, 1).item<int>(), 6);
}

TEST(Tensor, HandlesShareStorage) {
  Tensor a = Tensor::zeros({4});
  Tensor b = a;  // a handle copy, not a data copy
  b.fill_(7);
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(4, 7.0f));
  Tensor c = a.clone();
  c.fill_(1);
  EXPECT_EQ(a.to_vector<float>()[0], 7.0f);
  EXPECT_TRUE(a.shares_storage(b));
  EXPECT_FALSE(a.shares_storage(c));
}

TEST(Tensor, ConversionsRoundTrip) {
  Tensor x = Tensor::from_vector<float>({1.5f, -2.25f, 3.0f, 1e-3f}, {4});
  for (DType t : {DType::F64, DType::BF16, DType::F16}) {
    Tensor back = x.to(t).to(DType::F32);
    EXPECT_TRUE(allclose(back, x, t == DType::BF16 ? 8e-3 : 1e-3, 0)) << dtype_name(t);
  }
  EXPECT_EQ(x.to(DType::I32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 0}));
  EXPECT_EQ(x.to(DType::Bool).to_vector<bool>(), (std::vector<bool>{true, true, true, true}));
  // bf16 storage holds the rounded value.
  EXPECT_EQ(Tensor::full({1}, 1.00390625, DType::BF16).to(DType::F32).item<float>(), 1.0f);
}

TEST(Tensor, CopyBroadcastsAndConverts) {
  Tensor dst = Tensor::zeros({2, 3}, DType::F64);
  dst.copy_(Tensor::from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  // Into a strided view: only the viewed elements change.
  Tensor m = Tensor::zeros({3, 3});
  m.transpose(0, 1).select(0, 1).copy_(Tensor::ones({3}));
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{0, 1, 0, 0, 1, 0, 0, 1, 0}));
  EXPECT_THROW_MSG(dst.copy_(Tensor::zeros({4})), std::invalid_argument, "[expand]");
}

TEST(Tensor, ToStringShowsShapeDtypeAndElidedValues) {
  Tensor t = Tensor::arange(4).reshape({2, 2});
  EXPECT_EQ(t.to_string(), "Tensor(shape=[2, 2], dtype=i64, [[0, 1], [2, 3]])");
  const std::string long_text = Tensor::arange(100).to_string(6);
  EXPECT_NE(long_text.find("[0, 1, 2, ..., 97, 98, 99]"), std::string::npos) << long_text;
  EXPECT_EQ(Tensor::full({2}, 1, DType::Bool).to_string(), "Tensor(shape=[2], dtype=bool, [true, true])");
  EXPECT_EQ(Tensor().to_string(), "Tensor(undefined)");
}

TEST(Tensor, CompareReportsWhere) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  Tensor b = Tensor::from_vector<float>({1, 2, 3.5f, 4}, {4});
  CompareReport r = compare(a, b, 1e-5, 1e-8);
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_EQ(r.max_abs_index, 2);
  EXPECT_DOUBLE_EQ(r.max_abs_error, 0.5);
  EXPECT_NEAR(r.max_rel_error, 0.5 / 3.5, 1e-12);
  EXPECT_FALSE(allclose(a, b));
  EXPECT_TRUE(allclose(a, b, 0.2));
  EXPECT_FALSE(allclose(a, Tensor::zeros({2, 2})));
  Tensor nan = Tensor::full({1}, std::nan(""));
  EXPECT_FALSE(allclose(nan, nan));
}

TEST(Tensor, AccessErrorsNameTheOp) {
  Tensor t = Tensor::zeros({2, 2});
  EXPECT_THROW_MSG(t.to_vector<double>(), std::invalid_argument, "[to_vector] element type mismatch: the tensor is f32, the request is for f64");
  EXPECT_THROW_MSG(t.data<int64_t>(), std::invalid_argument, "[data]");
  EXPECT_THROW_MSG(t.item<float>(), std::invalid_argument, "[item] expected a tensor with one element, got shape [2, 2]");
  EXPECT_THROW_MSG(Tensor::from_vector<float>({1, 2, 3}, {2, 2}), std::invalid_argument, "[from_vector] shape [2, 2] needs 4 values, got 3");
  EXPECT_THROW_MSG(Tensor::zeros({-1}), std::invalid_argument, "[full] sizes must be >= 0");
  EXPECT_THROW_MSG(t.size(2), std::invalid_argument, "[size] dim 2 out of range");
  EXPECT_THROW_MSG(Tensor().shape(), std::invalid_argument, "undefined");
  EXPECT_THROW_MSG(Tensor::arange(0, 1, 0), std::invalid_argument, "[arange] step must be nonzero");
}

TEST(Tensor, MemoryCountersTrackLiveAndPeakPerThread) {
  const MemoryStats before = memory_stats();
  {
    Tensor a = Tensor::empty({1024});  // 4 KiB
    Tensor b = Tensor::empty({2048});  // 8 KiB
    EXPECT_EQ(memory_stats().live_bytes - before.live_bytes, 12 * 1024);
    EXPECT_GE(memory_stats().peak_bytes, before.live_bytes + 12 * 1024);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64, 0u);
  }
  EXPECT_EQ(memory_stats().live_bytes, before.live_bytes);
  reset_peak_memory();
  EXPECT_EQ(memory_stats().peak_bytes, memory_stats().live_bytes);

  // A thread with its own counters sees only its own bytes, even when the tensor
  // is freed on another thread.
  auto counters = std::make_shared<RankMemoryCounters>();
  Tensor escaped;
  std::thread([&] {
    ScopedMemoryCounters guard(counters);
    escaped = Tensor::empty({256});  // 1 KiB
    EXPECT_EQ(memory_stats().live_bytes, 1024);
  }).join();
  EXPECT_EQ(counters->cpu->stats().live_bytes, 1024);
  EXPECT_EQ(memory_stats().live_bytes, before.live_bytes);
  escaped = Tensor();
  EXPECT_EQ(counters->cpu->stats().live_bytes, 0);
  EXPECT_EQ(counters->cpu->stats().peak_bytes, 1024);
}

// cpu:1 (the host side of offloading without a GPU): the same memory, its own counter,
// copies to and from cpu, and no op mixing the two.
TEST(Tensor, TheSecondCpuDeviceCountsApartAndCopiesExplicitly) {
  const MemoryStats before = memory_stats(), host_before = memory_stats(Device::cpu(1));
  {
    const Tensor a = Tensor::arange(256, DType::F32, Device::cpu(1));  // 1 KiB
    EXPECT_EQ(a.device().to_string(), "cpu:1");
    EXPECT_EQ(memory_stats(Device::cpu(1)).live_bytes - host_before.live_bytes, 1024);
    EXPECT_EQ(memory_stats().live_bytes, before.live_bytes);
    const Tensor b = a.to(Device::cpu());
    EXPECT_EQ(b.device(), Device::cpu());
    EXPECT_EQ(b.to_vector<float>(), Tensor::arange(256, DType::F32).to_vector<float>());
    EXPECT_EQ(add(a, a).device(), Device::cpu(1));
    EXPECT_THROW_MSG(add(a, b), std::invalid_argument, "devices differ");
    Tensor back = Tensor::zeros({256}, DType::BF16, Device::cpu(1));
    back.copy_(b);  // across the devices, with a cast
    EXPECT_EQ(back.to(DType::F32).to(Device::cpu()).to_vector<float>(), b.to_vector<float>());
  }
  EXPECT_EQ(memory_stats(Device::cpu(1)).live_bytes, host_before.live_bytes);
  EXPECT_THROW_MSG(Tensor::zeros({2}, DType::F32, Device::cpu(2)), std::invalid_argument,
                   "no device cpu:2: the CPU devices are cpu (cpu:0) and cpu:1");
}

TEST(Tensor, CudaDevicesFailClearlyOrWork) {
  if (!cuda_is_available()) {
    EXPECT_EQ(cuda_device_count(), 0);
    EXPECT_THROW(Tensor::zeros({2}, DType::F32, Device::cuda(0)), std::runtime_error);
    GTEST_SKIP() << "no GPU here: CUDA tensors are checked on a GPU machine";
  }
  Tensor x = Tensor::arange(0, 6, 1).reshape({2, 3});
  Tensor g = x.to(Device::cuda(0));
  EXPECT_EQ(g.device(), Device::cuda(0));
  EXPECT_EQ(g.to(Device::cpu()).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(memory_stats(Device::cuda()).live_bytes, 24);
}

TEST(Tensor, LargeFreedBlocksAreReusedNotCounted) {
  release_cached_memory();
  const int64_t live_before = memory_stats().live_bytes;
  void* first = nullptr;
  {
    Tensor big = Tensor::empty({1 << 20});  // 4 MiB
    first = big.data_ptr();
    EXPECT_EQ(memory_stats().live_bytes - live_before, 4 << 20);
  }
  EXPECT_EQ(memory_stats().live_bytes, live_before);  // cached blocks are not live
  EXPECT_EQ(cached_memory_bytes(), 4 << 20);
  Tensor again = Tensor::empty({1 << 20});
  EXPECT_EQ(again.data_ptr(), first);  // the same block, no fresh pages
  EXPECT_EQ(cached_memory_bytes(), 0);
  again = Tensor();
  release_cached_memory();
  EXPECT_EQ(cached_memory_bytes(), 0);
}
