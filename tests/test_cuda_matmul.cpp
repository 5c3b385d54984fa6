// Matmul on CUDA through cuBLASLt against the CPU (label cuda): every dtype it
// takes, batched, transposed and batch-broadcast operands, TF32 on and off. Skips
// with a message where no GPU is visible; the layout mapping is tested on the CPU
// in test_gemm_layout.cpp.
#include "test_helpers.h"

using namespace dtensor;

namespace {
const Device kGpu = Device::cuda(0);

void expect_matmul_matches(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  Tensor cpu = matmul(a, b);
  Tensor gpu = matmul(a.to(kGpu), b.to(kGpu)).to(Device::cpu());
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  EXPECT_TRUE(allclose(gpu.to(DType::F64), cpu.to(DType::F64), tol, tol)) << what;
}
}  // namespace

TEST(CudaMatmul, EveryFloatDtypeAndLayoutMatchesTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const double tol = t == DType::F64 ? 1e-10 : t == DType::F32 ? 1e-4 : 3e-2;
    const std::string dt(dtype_name(t));
    Tensor a = Tensor::randn({3, 33, 70}, 1, t), b = Tensor::randn({3, 70, 17}, 2, t);
    expect_matmul_matches(a, b, tol, dt + " batched");
    expect_matmul_matches(a.select(0, 0), b.select(0, 0), tol, dt + " 2-D");
    expect_matmul_matches(Tensor::randn({3, 70, 33}, 3, t).transpose(1, 2), b, tol, dt + " a transposed");
    expect_matmul_matches(a, Tensor::randn({3, 17, 70}, 4, t).transpose(1, 2), tol, dt + " b transposed");
    expect_matmul_matches(a, Tensor::randn({70, 17}, 5, t), tol, dt + " b broadcast over the batch");
    expect_matmul_matches(Tensor::randn({1, 6, 16}, 6, t).slice(2, 0, 16, 2), Tensor::randn({8, 5}, 7, t), tol,
                          dt + " a strided (copied first)");
  }
}

TEST(CudaMatmul, Tf32IsOptInAndCloseToFp32) {
  REQUIRE_GPU();
  Tensor a = Tensor::randn({256, 512}, 8), b = Tensor::randn({512, 128}, 9);
  EXPECT_FALSE(cuda::allow_tf32());
  cuda::set_allow_tf32(true);
  Tensor tf32 = matmul(a.to(kGpu), b.to(kGpu)).to(Device::cpu());
  cuda::set_allow_tf32(false);
  EXPECT_TRUE(allclose(tf32, matmul(a, b), 2e-2, 2e-2));
}

TEST(CudaMatmul, IntegerMatmulFailsClearly) {
  REQUIRE_GPU();
  Tensor a = Tensor::ones({2, 2}, DType::I64, kGpu);
  EXPECT_THROW_MSG(matmul(a, a), std::runtime_error, "no CUDA matmul for i64");
}
