// The fused AdamW step on CUDA against the CPU's fused kernel (label cuda): F32
// parameters and state, F32 and BF16 gradients, several steps, sizes from one element
// to more than the grid covers in one pass. Skips with a message where no GPU is
// visible; the per-element math (backend/optim_math.h) is checked on the CPU against
// the CPU kernel by test_optim.
#include "backend/kernels.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

backend::AdamWStep step_of(int64_t t) {
  backend::AdamWStep s;
  s.lr = 3e-3;
  s.beta1 = 0.9;
  s.beta2 = 0.999;
  s.eps = 1e-8;
  s.weight_decay = 0.1;
  s.step = t;
  return s;
}

}  // namespace

TEST(CudaOptim, FusedAdamWMatchesTheCpuKernel) {
  REQUIRE_GPU();
  backend::Kernels& cpu = backend::kernels_for(Device::cpu());
  backend::Kernels& gpu = backend::kernels_for(kGpu);
  // 1 element; odd; beyond 65536 blocks of 256 threads (the grid-stride loop's second pass).
  for (int64_t n : {int64_t{1}, int64_t{4099}, (int64_t{1} << 24) + 7}) {
    for (DType grad_dtype : {DType::F32, DType::BF16}) {
      const std::string what = std::string(dtype_name(grad_dtype)) + " n " + std::to_string(n);
      Tensor p = Tensor::randn({n}, 1), m = Tensor::zeros({n}), v = Tensor::zeros({n});
      for (int64_t t = 1; t <= 4; ++t) {
        const std::string at = what + " step " + std::to_string(t);
        // Each step from the same state on both devices: only this step's rounding counts.
        Tensor gp = p.to(kGpu), gm = m.to(kGpu), gv = v.to(kGpu);
        const Tensor before = p.clone();
        const Tensor g = Tensor::randn({n}, 100 + static_cast<uint64_t>(t)).to(grad_dtype);
        ASSERT_TRUE(cpu.adamw_step(step_of(t), p, g, m, v)) << at;
        ASSERT_TRUE(gpu.adamw_step(step_of(t), gp, g.to(kGpu), gm, gv)) << at;
        // The same float operations; only FMA contraction may differ (a few ulp of the
        // terms: beta1 m + (1 - beta1) g may cancel, so exp_avg's bound is absolute).
        EXPECT_TRUE(allclose(gp.to(Device::cpu()), p, 1e-6, 1e-7)) << at << " param";
        EXPECT_TRUE(allclose(gm.to(Device::cpu()), m, 1e-6, 1e-7)) << at << " exp_avg";
        EXPECT_TRUE(allclose(gv.to(Device::cpu()), v, 1e-6, 1e-12)) << at << " exp_avg_sq";
        // The update moved the parameters (a kernel that does nothing fails above).
        EXPECT_FALSE(allclose(p, before, 1e-5, 1e-5)) << at;
      }
    }
  }
}

TEST(CudaOptim, FusedAdamWDeclinesWhatTheCpuDeclines) {
  REQUIRE_GPU();
  backend::Kernels& gpu = backend::kernels_for(kGpu);
  Tensor p = Tensor::zeros({4, 3}, DType::F32, kGpu), m = Tensor::zeros({4, 3}, DType::F32, kGpu);
  Tensor v = Tensor::zeros({4, 3}, DType::F32, kGpu);
  Tensor f64 = Tensor::zeros({4, 3}, DType::F64, kGpu);
  EXPECT_FALSE(gpu.adamw_step(step_of(1), f64, p, m, v));                                      // F64 param
  EXPECT_FALSE(gpu.adamw_step(step_of(1), p, Tensor::zeros({4, 3}, DType::F16, kGpu), m, v));  // F16 grad
  Tensor strided = Tensor::zeros({3, 4}, DType::F32, kGpu).transpose(0, 1);
  EXPECT_FALSE(gpu.adamw_step(step_of(1), p, strided, m, v));                                // a strided grad
  EXPECT_FALSE(gpu.adamw_step(step_of(1), p, Tensor::zeros({12}, DType::F32, kGpu), m, v));  // another shape
}
