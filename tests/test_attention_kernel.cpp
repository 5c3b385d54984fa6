// The fused attention kernel (scaled_dot_product_attention on local tensors) against
// a naive double-precision reference that materialises the scores: forward output,
// log-sum-exp and the three gradients, causal and not, F32 and BF16, on contiguous
// inputs and on the strided head views a transformer makes ([B, S, H, D] transposed
// to [B, H, S, D]), with sequence lengths that are not multiples of the tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention_reference.h"
#include "backend/attention_plan.h"
#include "kernel_test_util.h"

namespace dtensor::test {
namespace {

struct Case {
  int64_t batch, heads, sq, sk, d, dv;
  bool causal;
  DType dtype;
  bool head_views;  // q, k, v as transposed [B, S, H, D] views, like SelfAttention's
};

// [B, H, S, width] values, laid out as asked.
Tensor operand(const Case& c, int64_t seq, int64_t width, uint64_t seed) {
  if (!c.head_views) return uniform_f64({c.batch, c.heads, seq, width}, seed, -1.5, 1.5).to(c.dtype);
  return uniform_f64({c.batch, seq, c.heads, width}, seed, -1.5, 1.5).to(c.dtype).transpose(1, 2);
}

void check(const Case& c) {
  SCOPED_TRACE(testing::Message() << "B" << c.batch << " H" << c.heads << " Sq" << c.sq << " Sk" << c.sk << " D" << c.d
                                  << " Dv" << c.dv << (c.causal ? " causal" : "") << " " << dtype_name(c.dtype)
                                  << (c.head_views ? " head views" : ""));
  const Tensor q = operand(c, c.sq, c.d, 1), k = operand(c, c.sk, c.d, 2), v = operand(c, c.sk, c.dv, 3);
  const Tensor g = operand(c, c.sq, c.dv, 4);
  if (c.head_views && c.heads > 1) EXPECT_FALSE(q.is_contiguous());
  const int64_t entries = c.batch * c.heads;
  const Reference want =
      naive_attention(values(q), values(k), values(v), values(g), entries, c.sq, c.sk, c.d, c.dv, c.causal);
  const AttentionResult got = scaled_dot_product_attention(q, k, v, c.causal);
  ASSERT_EQ(got.out.shape(), (Shape{c.batch, c.heads, c.sq, c.dv}));
  ASSERT_EQ(got.lse.shape(), (Shape{c.batch, c.heads, c.sq}));
  const double scale = c.dtype == DType::BF16 ? 3.0 : 5.0;
  expect_close(got.out, want.out, "out", scale, c.dtype == DType::BF16 ? 2e-2 : 2e-5);
  expect_close(got.lse, want.lse, "lse", 5.0, c.dtype == DType::BF16 ? 3e-2 : 2e-5);
  if (c.head_views && c.heads > 1) {
    // The output follows q's memory order: transposing it back is contiguous.
    EXPECT_TRUE(got.out.transpose(1, 2).is_contiguous());
  }
  const AttentionGrads grads = scaled_dot_product_attention_backward(g, q, k, v, got, c.causal);
  const double gatol = c.dtype == DType::BF16 ? 4e-2 : 5e-5;
  expect_close(grads.grad_q, want.dq, "grad_q", 10.0, gatol);
  expect_close(grads.grad_k, want.dk, "grad_k", 10.0, gatol);
  expect_close(grads.grad_v, want.dv, "grad_v", 10.0, gatol);
}

TEST(AttentionKernel, MatchesNaiveReferenceF32) {
  for (bool causal : {false, true}) {
    for (bool views : {false, true}) {
      check({2, 3, 37, 37, 16, 16, causal, DType::F32, views});
      check({1, 2, 130, 130, 32, 24, causal, DType::F32, views});  // crosses the 64-row tiles
      check({1, 1, 300, 300, 8, 8, causal, DType::F32, views});    // crosses the 256-key tiles
    }
  }
  // Different query and key lengths (top-left aligned causal mask).
  check({2, 2, 20, 45, 16, 16, false, DType::F32, false});
  check({2, 2, 45, 20, 16, 16, true, DType::F32, false});
  check({1, 1, 1, 1, 4, 4, true, DType::F32, false});
}

TEST(AttentionKernel, MatchesNaiveReferenceBf16AndF64) {
  check({2, 2, 70, 70, 32, 32, true, DType::BF16, true});
  check({1, 2, 33, 33, 16, 16, false, DType::BF16, false});
  // F64 takes the naive formulas in F64: F64 accuracy, forward and backward.
  const Tensor q = uniform_f64({1, 2, 9, 4}, 1, -1, 1), k = uniform_f64({1, 2, 9, 4}, 2, -1, 1);
  const Tensor v = uniform_f64({1, 2, 9, 4}, 3, -1, 1), g = uniform_f64({1, 2, 9, 4}, 4, -1, 1);
  const AttentionResult r = scaled_dot_product_attention(q, k, v, true);
  EXPECT_EQ(r.out.dtype(), DType::F64);
  const Reference want = naive_attention(values(q), values(k), values(v), values(g), 2, 9, 9, 4, 4, true);
  expect_close(r.out, want.out, "f64 out", 100.0, 1e-12);
  expect_close(r.lse, want.lse, "f64 lse", 10.0, 1e-5);  // lse is kept in F32
  const AttentionGrads grads = scaled_dot_product_attention_backward(g, q, k, v, r, true);
  expect_close(grads.grad_q, want.dq, "f64 grad_q", 100.0, 1e-12);
  expect_close(grads.grad_k, want.dk, "f64 grad_k", 100.0, 1e-12);
  expect_close(grads.grad_v, want.dv, "f64 grad_v", 100.0, 1e-12);
}

TEST(AttentionKernel, MatchesTheCompositeOps) {
  // softmax(q k^T / sqrt(D) masked) v from the local ops, on the same F32 inputs.
  const Tensor q = uniform_f64({2, 2, 50, 8}, 5, -1, 1).to(DType::F32);
  const Tensor k = uniform_f64({2, 2, 50, 8}, 6, -1, 1).to(DType::F32);
  const Tensor v = uniform_f64({2, 2, 50, 8}, 7, -1, 1).to(DType::F32);
  Tensor scores = mul(matmul(q, k.transpose(-1, -2)), 1.0 / std::sqrt(8.0));
  const Tensor allowed = le(Tensor::arange(50).unsqueeze(0), Tensor::arange(50).unsqueeze(1));
  scores = where(allowed, scores, Tensor::full({}, -std::numeric_limits<double>::infinity()));
  const Tensor composite = matmul(softmax(scores, -1), v);
  expect_close(scaled_dot_product_attention(q, k, v, true).out, values(composite), "fused vs composite", 5.0, 1e-5);
}

TEST(AttentionKernel, ZeroHeadOrValueDimsAreDefined) {
  // Head dim 0 with a given scale: every score is 0, so query i averages the values
  // it may see (causal: rows 0..i), and grad_v[j] = sum over i >= j of 1 / (i + 1).
  const Tensor q = Tensor::zeros({2, 3, 0}), k = Tensor::zeros({2, 3, 0});
  const Tensor v = uniform_f64({2, 3, 4}, 8, -1, 1).to(DType::F32);
  const AttentionResult r = scaled_dot_product_attention(q, k, v, true, 1.0);
  const std::vector<double> vv = values(v);
  std::vector<double> mean(vv.size(), 0.0);
  for (int64_t e = 0; e < 2; ++e) {
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t c = 0; c < 4; ++c) {
        for (int64_t j = 0; j <= i; ++j) mean[(e * 3 + i) * 4 + c] += vv[(e * 3 + j) * 4 + c] / (i + 1);
      }
    }
  }
  expect_close(r.out, mean, "head dim 0: causal means", 5.0, 1e-6);
  const AttentionGrads g = scaled_dot_product_attention_backward(Tensor::ones({2, 3, 4}), q, k, v, r, true, 1.0);
  const double w[3] = {1.0 + 1.0 / 2 + 1.0 / 3, 1.0 / 2 + 1.0 / 3, 1.0 / 3};
  std::vector<double> dv;
  for (int64_t e = 0; e < 2; ++e) {
    for (int64_t j = 0; j < 3; ++j) dv.insert(dv.end(), 4, w[j]);
  }
  expect_close(g.grad_v, dv, "head dim 0: grad_v", 5.0, 1e-6);
  EXPECT_EQ(g.grad_q.shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(g.grad_k.shape(), (Shape{2, 3, 0}));

  // Value dim 0: an empty output, but lse and the gradients of q and k (zero) are defined.
  const Tensor q2 = uniform_f64({2, 3, 4}, 9, -1, 1).to(DType::F32),
               k2 = uniform_f64({2, 3, 4}, 10, -1, 1).to(DType::F32);
  const Tensor v2 = Tensor::zeros({2, 3, 0});
  const AttentionResult r2 = scaled_dot_product_attention(q2, k2, v2, false);
  EXPECT_EQ(r2.out.shape(), (Shape{2, 3, 0}));
  for (double x : values(r2.lse)) EXPECT_TRUE(std::isfinite(x)) << x;
  const AttentionGrads g2 = scaled_dot_product_attention_backward(Tensor::zeros({2, 3, 0}), q2, k2, v2, r2, false);
  for (const Tensor* t : {&g2.grad_q, &g2.grad_k}) {
    for (double x : values(*t)) EXPECT_EQ(x, 0.0);
  }
}

TEST(AttentionKernel, RejectsMismatchedOperands) {
  const Tensor q = Tensor::zeros({2, 3, 4}), k = Tensor::zeros({2, 5, 4}), v = Tensor::zeros({2, 5, 6});
  expect_invalid([&] { scaled_dot_product_attention(q, Tensor::zeros({2, 5, 3}), v, false); }, "one head dim");
  expect_invalid([&] { scaled_dot_product_attention(q, k, Tensor::zeros({2, 4, 6}), false); }, "one sequence length");
  expect_invalid([&] { scaled_dot_product_attention(q, Tensor::zeros({3, 5, 4}), v, false); }, "same leading dims");
  expect_invalid([&] { scaled_dot_product_attention(q, k.to(DType::F64), v, false); }, "one floating dtype");
}

// The batch plan of the CUDA kernels (backend/attention_plan.h): entry e, row-major
// over the leading dims, starts where the CPU's element [e's index..., 0, 0] is, for
// contiguous, permuted (a [B, S, H, D] view as [B, H, S, D]) and sliced operands.
TEST(AttentionPlan, EntryOffsetsAreTheFirstElementOfEachBatchEntry) {
  const Tensor base = Tensor::arange(0, 2 * 3 * 5 * 4 * 7, 1, DType::F64).reshape({2, 5, 3, 4 * 7});
  const std::vector<Tensor> views = {
      Tensor::arange(0, 2 * 3 * 5 * 4, 1, DType::F64).reshape({2, 3, 5, 4}),
      base.slice(3, 0, 4).transpose(1, 2),                      // [2, 3, 5, 4]: heads and sequence swapped
      base.slice(3, 8, 12).transpose(1, 2),                     // an offset inside each row
      base.slice(3, 0, 4).permute({2, 0, 1, 3}),                // [3, 2, 5, 4]
      Tensor::arange(0, 6 * 4, 1, DType::F64).reshape({6, 4}),  // no batch dims: one entry
  };
  for (size_t view = 0; view < views.size(); ++view) {
    const Tensor& t = views[view];
    backend::AttentionBatch batch;
    ASSERT_TRUE(backend::make_attention_batch(t, batch));
    const backend::AttentionRows rows = backend::attention_rows(t);
    const Shape lead(t.shape().begin(), t.shape().end() - 2);
    ASSERT_EQ(batch.entries, shape_numel(lead));
    EXPECT_EQ(rows.row_stride, t.stride(-2));
    const double* data = static_cast<const double*>(t.data_ptr());
    const Tensor rows_first = t.contiguous().reshape({batch.entries, t.size(-2) * t.size(-1)});
    for (int64_t e = 0; e < batch.entries; ++e) {
      // Element [e, 0, 0] of the contiguous copy and element [e, 1, 1] through the plan.
      const std::vector<double> row = rows_first.slice(0, e, e + 1).to_vector<double>();
      const int64_t at = backend::entry_offset(batch, rows, e);
      EXPECT_EQ(data[at], row[0]) << "entry " << e << " of view " << view;
      EXPECT_EQ(data[at + rows.row_stride + 1], row[static_cast<size_t>(t.size(-1)) + 1])
          << "entry " << e << " of view " << view;
    }
  }
  backend::AttentionBatch batch;
  EXPECT_FALSE(backend::make_attention_batch(Tensor::zeros({1, 1, 1, 1, 1, 1, 1, 2, 2}), batch));
}

}  // namespace
}  // namespace dtensor::test
