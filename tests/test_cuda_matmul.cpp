// Matmul on CUDA through cuBLASLt against the CPU (label cuda): every dtype it
// takes, batched, transposed and batch-broadcast operands, TF32 on and off, the
// bias epilogue. Skips
// with a message where no GPU is visible; the layout mapping is tested on the CPU
// in test_gemm_layout.cpp.
#include "test_helpers.h"

using namespace dtensor;

namespace {
const Device kGpu = Device::cuda(0);
using View = Tensor (*)(const Tensor&);
Tensor same(const Tensor& t) { return t; }

// `view_a(a) @ view_b(b)` on the GPU against the CPU. The views are taken after the
// upload (Tensor::to makes its source contiguous), so transposed, strided and offset
// operands reach the GPU kernels as they are.
void expect_matmul_matches(const Tensor& a, const Tensor& b, double tol, const std::string& what, View view_a = same,
                           View view_b = same) {
  Tensor cpu = matmul(view_a(a), view_b(b));
  Tensor gpu = matmul(view_a(a.to(kGpu)), view_b(b.to(kGpu))).to(Device::cpu());
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  EXPECT_TRUE(allclose(gpu.to(DType::F64), cpu.to(DType::F64), tol, tol)) << what;
}

Tensor transposed(const Tensor& t) { return t.transpose(-1, -2); }
Tensor every_other_column(const Tensor& t) { return t.slice(-1, 0, t.size(-1), 2); }
// Starts one row in: a pointer 4-140 bytes past an allocation's 512-byte boundary.
Tensor from_second_row(const Tensor& t) { return t.narrow(-2, 1, t.size(-2) - 1); }
Tensor first_of_batch(const Tensor& t) { return t.select(0, 0); }
Tensor second_of_batch(const Tensor& t) { return t.select(0, 1); }
}  // namespace

TEST(CudaMatmul, EveryFloatDtypeAndLayoutMatchesTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const double tol = t == DType::F64 ? 1e-10 : t == DType::F32 ? 1e-4 : 3e-2;
    const std::string dt(dtype_name(t));
    Tensor a = Tensor::randn({3, 33, 70}, 1, t), b = Tensor::randn({3, 70, 17}, 2, t);
    expect_matmul_matches(a, b, tol, dt + " batched");
    expect_matmul_matches(a, b, tol, dt + " 2-D", first_of_batch, first_of_batch);
    expect_matmul_matches(a, b, tol, dt + " 2-D at an offset", second_of_batch, second_of_batch);
    expect_matmul_matches(Tensor::randn({3, 70, 33}, 3, t), b, tol, dt + " a transposed", transposed);
    expect_matmul_matches(a, Tensor::randn({3, 17, 70}, 4, t), tol, dt + " b transposed", same, transposed);
    expect_matmul_matches(a, Tensor::randn({70, 17}, 5, t), tol, dt + " b broadcast over the batch");
    expect_matmul_matches(a, Tensor::randn({3, 71, 17}, 6, t), tol, dt + " b from its second row", same,
                          from_second_row);
    expect_matmul_matches(Tensor::randn({1, 6, 16}, 6, t), Tensor::randn({8, 5}, 7, t), tol,
                          dt + " a strided (copied first)", every_other_column);
  }
}

// linear() with a bias: cuBLASLt's BIAS epilogue (F32, BF16, F16) or the GEMM and an
// add (F64), against the CPU's epilogue; batched input rows, a transposed input, a
// bias at an unaligned offset (its own plan), an empty contraction.
TEST(CudaMatmul, LinearBiasEpilogueMatchesTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const double tol = t == DType::F64 ? 1e-10 : t == DType::F32 ? 1e-4 : 3e-2;
    const std::string dt(dtype_name(t));
    const Tensor x = Tensor::randn({4, 33, 70}, 1, t), w = Tensor::randn({48, 70}, 2, t);
    const Tensor b = Tensor::randn({49}, 3, t);
    for (int64_t offset : {0, 1}) {  // narrowed after the upload: an unaligned vector
      const Tensor cpu = linear(x, w, b.narrow(0, offset, 48).contiguous());
      const Tensor gpu = linear(x.to(kGpu), w.to(kGpu), b.to(kGpu).narrow(0, offset, 48)).to(Device::cpu());
      ASSERT_EQ(gpu.shape(), cpu.shape()) << dt;
      EXPECT_TRUE(allclose(gpu.to(DType::F64), cpu.to(DType::F64), tol, tol)) << dt;
    }
    const Tensor xt = Tensor::randn({70, 33}, 4, t);
    EXPECT_TRUE(
        allclose(linear(xt.to(kGpu).t(), w.to(kGpu), b.narrow(0, 0, 48).to(kGpu)).to(Device::cpu()).to(DType::F64),
                 linear(xt.t(), w, b.narrow(0, 0, 48).contiguous()).to(DType::F64), tol, tol))
        << dt << " x transposed";
    const Tensor empty =
        linear(Tensor::zeros({3, 0}, t, kGpu), Tensor::zeros({48, 0}, t, kGpu), b.narrow(0, 0, 48).to(kGpu));
    EXPECT_TRUE(allclose(empty.to(Device::cpu()), b.narrow(0, 0, 48).expand({3, 48}).contiguous(), 0, 0)) << dt;
  }
}

// linear_gelu: cuBLASLt's GELU_AUX_BIAS (tanh form; GELU_AUX without a bias) writes
// the GELU and linear's output; the erf form, F64 and output features that break
// cuBLASLt's aux rule (not a multiple of 8) run the two ops. All against the CPU.
TEST(CudaMatmul, LinearGeluEpilogueMatchesTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const double tol = t == DType::F64 ? 1e-10 : t == DType::F32 ? 1e-4 : 3e-2;
    for (int64_t n : {48, 45}) {
      for (GeluApprox approx : {GeluApprox::Tanh, GeluApprox::None}) {
        const Tensor x = Tensor::randn({4, 33, 70}, 1, t), w = Tensor::randn({n, 70}, 2, t),
                     b = Tensor::randn({n}, 3, t);
        for (const std::optional<Tensor>& bias : {std::optional<Tensor>(b), std::optional<Tensor>()}) {
          const LinearGeluResult cpu = linear_gelu(x, w, bias, approx);
          const LinearGeluResult gpu =
              linear_gelu(x.to(kGpu), w.to(kGpu), bias ? std::optional<Tensor>(bias->to(kGpu)) : std::nullopt, approx);
          const std::string what = std::string(dtype_name(t)) + " n " + std::to_string(n) +
                                   (approx == GeluApprox::Tanh ? " tanh" : " erf") + (bias ? " bias" : "");
          EXPECT_TRUE(allclose(gpu.out.to(Device::cpu()).to(DType::F64), cpu.out.to(DType::F64), tol, tol)) << what;
          EXPECT_TRUE(allclose(gpu.pre.to(Device::cpu()).to(DType::F64), cpu.pre.to(DType::F64), tol, tol)) << what;
        }
      }
    }
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
