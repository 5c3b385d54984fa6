// randn, rand and arange made on the GPU against the CPU (label cuda): the same
// counter-based numbers for a seed (dtensor/random.h, one definition for both), the
// kernels' index_offset, and arange's values in every dtype. Skips with a message
// where no GPU is visible; the generator itself is checked on the CPU against
// recorded numbers by test_random_shared.
#include <cstring>

#include "backend/kernels.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

std::vector<uint32_t> f32_bits(const Tensor& t) {
  const std::vector<float> v = t.to(Device::cpu()).to_vector<float>();
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * 4);
  return bits;
}

void expect_identical(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  EXPECT_TRUE(allclose(gpu.to(Device::cpu()).to(DType::F64), cpu.to(DType::F64), 0, 0)) << what;
}

}  // namespace

TEST(CudaFactories, RandGivesTheCpuBitsForASeed) {
  REQUIRE_GPU();
  // uniform is integer arithmetic and one exact float product: identical everywhere.
  const Shape shape{1025, 1027};
  const std::vector<uint32_t> gpu = f32_bits(Tensor::rand(shape, 42, DType::F32, kGpu));
  EXPECT_EQ(gpu, f32_bits(Tensor::rand(shape, 42)));
  for (DType t : {DType::F64, DType::BF16, DType::F16}) {
    expect_identical(Tensor::rand({33, 65}, 7, t, kGpu), Tensor::rand({33, 65}, 7, t), std::string(dtype_name(t)));
  }
}

TEST(CudaFactories, RandnGivesTheCpuBitsForASeed) {
  REQUIRE_GPU();
  // Box-Muller in double, rounded to float once: the double log/cos of glibc and CUDA
  // differ by an ulp at most, which changes the float only within a few double ulps
  // of a rounding boundary (about 1 element in 10^8): all must be within one float
  // ulp and all but a handful bit-identical.
  const Shape shape{1025, 1027};
  const std::vector<uint32_t> gpu = f32_bits(Tensor::randn(shape, 42, DType::F32, kGpu));
  const std::vector<uint32_t> cpu = f32_bits(Tensor::randn(shape, 42));
  ASSERT_EQ(gpu.size(), cpu.size());
  int64_t differ = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (gpu[i] == cpu[i]) continue;
    ++differ;
    EXPECT_EQ(gpu[i] > cpu[i] ? gpu[i] - cpu[i] : cpu[i] - gpu[i], 1u) << "element " << i;
  }
  EXPECT_LE(differ, 2) << differ << " of " << cpu.size() << " elements differ in the last bit";
  for (DType t : {DType::F64, DType::BF16, DType::F16}) {
    expect_identical(Tensor::randn({33, 65}, 9, t, kGpu), Tensor::randn({33, 65}, 9, t), std::string(dtype_name(t)));
  }
  EXPECT_THROW(Tensor::randn({2}, 1, DType::I64, kGpu), std::invalid_argument);
}

TEST(CudaFactories, KernelFillsStartAtTheIndexOffset) {
  REQUIRE_GPU();
  backend::Kernels& cpu = backend::kernels_for(Device::cpu());
  backend::Kernels& gpu = backend::kernels_for(kGpu);
  // Shard-like offsets: one past 32 bits, so the counter's high word counts too.
  for (uint64_t offset : {uint64_t{0}, uint64_t{12345}, (uint64_t{1} << 32) - 100}) {
    Tensor c = Tensor::empty({500}), g = Tensor::empty({500}, DType::F32, kGpu);
    cpu.fill_rand(c, 3, offset);
    gpu.fill_rand(g, 3, offset);
    EXPECT_EQ(f32_bits(g), f32_bits(c)) << "rand at offset " << offset;
    cpu.fill_randn(c, 3, offset);
    gpu.fill_randn(g, 3, offset);
    EXPECT_TRUE(allclose(g.to(Device::cpu()), c, 1e-6, 0)) << "randn at offset " << offset;
  }
  // A different offset gives different numbers (the offset is not ignored).
  Tensor a = Tensor::empty({64}, DType::F32, kGpu), b = Tensor::empty({64}, DType::F32, kGpu);
  gpu.fill_rand(a, 3, 0);
  gpu.fill_rand(b, 3, 1);
  EXPECT_NE(f32_bits(a), f32_bits(b));
  EXPECT_EQ(std::vector<uint32_t>(f32_bits(a).begin() + 1, f32_bits(a).end()),
            std::vector<uint32_t>(f32_bits(b).begin(), f32_bits(b).end() - 1));
}

TEST(CudaFactories, ArangeMatchesTheCpuInEveryDtype) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32}) {
    const std::string dt(dtype_name(t));
    expect_identical(Tensor::arange(1000, t, kGpu), Tensor::arange(1000, t), "arange(n) " + dt);
    expect_identical(Tensor::arange(-3.5, 40.0, 0.7, t, kGpu), Tensor::arange(-3.5, 40.0, 0.7, t),
                     "arange(start, end, step) " + dt);
    expect_identical(Tensor::arange(5.0, -5.0, -0.25, t, kGpu), Tensor::arange(5.0, -5.0, -0.25, t),
                     "descending " + dt);
  }
  // Ten million F64 steps of 0.1: a fused multiply-add would round differently in
  // some elements, so every bit equal means the product and the sum round apart.
  expect_identical(Tensor::arange(0.3, 1e6, 0.1, DType::F64, kGpu), Tensor::arange(0.3, 1e6, 0.1, DType::F64),
                   "long F64 range");
  EXPECT_EQ(Tensor::arange(0, DType::I64, kGpu).numel(), 0);
}
