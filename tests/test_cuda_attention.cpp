// Fused attention on CUDA against the CPU kernel (label cuda): out, lse and the three
// gradients for F32, BF16 and F16 (cuDNN's fused attention where it takes the call,
// else the own kernels, F16 through F32 there and on the CPU), causal or not, a
// custom scale, more keys than queries and the reverse, key counts across the row
// kernels' 128-wide tiles and the tiled kernels' 64-row ones (BF16, head dims 16 to
// 128), and a transposed [B, S, H, D] view; the F64 forward (the composite formulas
// on the GPU's ops). Skips with a message where no GPU is visible; the batch plan and
// the tiled kernels' code are tested on the CPU (test_attention_kernel,
// test_attention_tiles).
#include "backend/cudnn_attention.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

Tensor values(const Shape& shape, DType dtype, uint64_t seed) { return (Tensor::rand(shape, seed) * 2 - 1).to(dtype); }

void expect_same(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  EXPECT_TRUE(allclose(gpu.to(Device::cpu()).to(DType::F64), cpu.to(DType::F64), tol, tol)) << what;
}

double tolerance(DType t) { return t == DType::BF16 ? 3e-2 : t == DType::F16 ? 3e-3 : 2e-5; }

}  // namespace

TEST(CudaAttention, ForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t queries, keys, head_dim, value_dim;
  };
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    // BF16 with head dims in 16s takes the tiled tensor-core kernels, the rest the row ones.
    for (const Case& c : {Case{70, 150, 40, 24}, Case{200, 90, 16, 16}, Case{1, 300, 8, 33}, Case{130, 200, 64, 128},
                          Case{256, 256, 128, 128}}) {
      for (bool causal : {false, true}) {
        const std::string what = std::string(dtype_name(t)) + " Sq " + std::to_string(c.queries) + " Sk " +
                                 std::to_string(c.keys) + (causal ? " causal" : "");
        const Tensor q = values({2, 3, c.queries, c.head_dim}, t, 1);
        const Tensor k = values({2, 3, c.keys, c.head_dim}, t, 2);
        const Tensor v = values({2, 3, c.keys, c.value_dim}, t, 3);
        const Tensor g = values({2, 3, c.queries, c.value_dim}, t, 4);
        const AttentionResult cpu = scaled_dot_product_attention(q, k, v, causal);
        const AttentionResult gpu = scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), causal);
        expect_same(gpu.out, cpu.out, tolerance(t), what + " out");
        expect_same(gpu.lse, cpu.lse, 1e-4, what + " lse");
        const AttentionGrads cg = scaled_dot_product_attention_backward(g, q, k, v, cpu, causal);
        const AttentionGrads gg =
            scaled_dot_product_attention_backward(g.to(kGpu), q.to(kGpu), k.to(kGpu), v.to(kGpu), gpu, causal);
        expect_same(gg.grad_q, cg.grad_q, tolerance(t) * 2, what + " grad_q");
        expect_same(gg.grad_k, cg.grad_k, tolerance(t) * 2, what + " grad_k");
        expect_same(gg.grad_v, cg.grad_v, tolerance(t) * 2, what + " grad_v");
      }
    }
  }
}

TEST(CudaAttention, StridedViewsAndCustomScaleMatchTheCpu) {
  REQUIRE_GPU();
  // [B, S, H, D] memory seen as [B, H, S, D]: batch entries with their own strides.
  const Tensor q = values({2, 130, 4, 32}, DType::F32, 5).transpose(1, 2);
  const Tensor k = values({2, 140, 4, 32}, DType::F32, 6).transpose(1, 2);
  const Tensor v = values({2, 140, 4, 32}, DType::F32, 7).transpose(1, 2);
  const Tensor g = values({2, 130, 4, 32}, DType::F32, 8).transpose(1, 2);
  for (bool causal : {false, true}) {
    const AttentionResult cpu = scaled_dot_product_attention(q, k, v, causal, 0.3);
    const AttentionResult gpu = scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), causal, 0.3);
    expect_same(gpu.out, cpu.out, 2e-5, "transposed out");
    expect_same(gpu.lse, cpu.lse, 1e-4, "transposed lse");
    const AttentionGrads cg = scaled_dot_product_attention_backward(g, q, k, v, cpu, causal, 0.3);
    const AttentionGrads gg =
        scaled_dot_product_attention_backward(g.to(kGpu), q.to(kGpu), k.to(kGpu), v.to(kGpu), gpu, causal, 0.3);
    expect_same(gg.grad_q, cg.grad_q, 4e-5, "transposed grad_q");
    expect_same(gg.grad_k, cg.grad_k, 4e-5, "transposed grad_k");
    expect_same(gg.grad_v, cg.grad_v, 4e-5, "transposed grad_v");
  }
  // The scale is applied (a kernel ignoring it differs from the default 1/sqrt(32)).
  const Tensor a = scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), false, 2.0).out;
  const Tensor b = scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), false).out;
  EXPECT_FALSE(allclose(a.to(Device::cpu()), b.to(Device::cpu()), 1e-3, 1e-3));
}

TEST(CudaAttention, F64ForwardRunsTheCompositeFormulasOnTheGpu) {
  REQUIRE_GPU();
  const Tensor q = values({2, 20, 8}, DType::F64, 9), k = values({2, 30, 8}, DType::F64, 10);
  const Tensor v = values({2, 30, 6}, DType::F64, 11);
  for (bool causal : {false, true}) {
    const AttentionResult cpu = scaled_dot_product_attention(q, k, v, causal);
    const AttentionResult gpu = scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), causal);
    expect_same(gpu.out, cpu.out, 1e-12, causal ? "f64 causal out" : "f64 out");
    expect_same(gpu.lse, cpu.lse, 1e-6, causal ? "f64 causal lse" : "f64 lse");
  }
}

// cuDNN's fused attention (DTENSOR_ATTENTION=cudnn) and the own kernels (=own) on the
// same BF16 and F16 calls, each against the CPU: the model's [B, S, H, D] layout seen
// as [B, H, S, D], causal or not, Sq != Sk, head dims 64 and 128; every call of the
// cudnn pass ran through cuDNN (cudnn::runs), the own pass through none.
TEST(CudaAttention, CudnnAndTheOwnKernelsBothMatchTheCpu) {
  REQUIRE_GPU();
  namespace cudnn = backend::cudnn;
  if (!cudnn::compiled()) GTEST_SKIP() << "this build has no cuDNN (the configure summary says why)";
  if (cudnn::target(0).sm < 80) GTEST_SKIP() << "cuDNN's fused attention needs compute capability 8.0";
  const cudnn::AttentionEngine before = cudnn::attention_engine();
  struct Case {
    int64_t queries, keys, head_dim;
  };
  for (const cudnn::AttentionEngine engine : {cudnn::AttentionEngine::Cudnn, cudnn::AttentionEngine::Own}) {
    cudnn::set_attention_engine(engine);
    for (DType t : {DType::BF16, DType::F16}) {
      for (const Case& c : {Case{128, 128, 64}, Case{96, 160, 128}, Case{200, 72, 64}}) {
        for (bool causal : {false, true}) {
          const std::string what = std::string(cudnn::attention_engine_name(engine)) + " " +
                                   std::string(dtype_name(t)) + " Sq " + std::to_string(c.queries) + " Sk " +
                                   std::to_string(c.keys) + " D " + std::to_string(c.head_dim) +
                                   (causal ? " causal" : "");
          auto bshd = [&](int64_t s, uint64_t seed) { return values({2, s, 4, c.head_dim}, t, seed).transpose(1, 2); };
          const Tensor q = bshd(c.queries, 1), k = bshd(c.keys, 2), v = bshd(c.keys, 3), g = bshd(c.queries, 4);
          auto on_gpu = [](const Tensor& x) { return x.to(kGpu); };
          const int64_t runs = cudnn::runs();
          const AttentionResult cpu = scaled_dot_product_attention(q, k, v, causal);
          const AttentionResult gpu = scaled_dot_product_attention(on_gpu(q), on_gpu(k), on_gpu(v), causal);
          expect_same(gpu.out, cpu.out, tolerance(t), what + " out");
          expect_same(gpu.lse, cpu.lse, 1e-3, what + " lse");
          const AttentionGrads cg = scaled_dot_product_attention_backward(g, q, k, v, cpu, causal);
          const AttentionGrads gg =
              scaled_dot_product_attention_backward(on_gpu(g), on_gpu(q), on_gpu(k), on_gpu(v), gpu, causal);
          expect_same(gg.grad_q, cg.grad_q, tolerance(t) * 2, what + " grad_q");
          expect_same(gg.grad_k, cg.grad_k, tolerance(t) * 2, what + " grad_k");
          expect_same(gg.grad_v, cg.grad_v, tolerance(t) * 2, what + " grad_v");
          EXPECT_EQ(cudnn::runs() - runs, engine == cudnn::AttentionEngine::Cudnn ? 2 : 0) << what;
        }
      }
    }
  }
  // Pinned to cuDNN, a call it refuses is an error naming the reason.
  cudnn::set_attention_engine(cudnn::AttentionEngine::Cudnn);
  const Tensor odd = values({1, 2, 16, 12}, DType::BF16, 5).to(kGpu);
  EXPECT_THROW_MSG(scaled_dot_product_attention(odd, odd, odd, true), std::runtime_error,
                   "DTENSOR_ATTENTION=cudnn, and cuDNN does not take");
  cudnn::set_attention_engine(before);
}
