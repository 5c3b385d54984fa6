// cuDNN's fused attention, the part that needs no GPU (label unit): how the kernel
// table's operands fold into cuDNN's [B, H, S, D] tensors, which calls cuDNN takes
// and why it refuses the others (the own kernels' fallback), the graph cache's key and
// DTENSOR_ATTENTION. The GPU half (graphs against the CPU) is in test_cuda_attention.
#include <gtest/gtest.h>

#include <unordered_set>

#include "backend/cudnn_attention_plan.h"
#include "dtensor/dtensor.h"
#include "test_helpers.h"

namespace dtensor::backend::cudnn {
namespace {

const AttentionTarget kH100{.sm = 90, .cudnn_version = 91900};

// The kernel table's view of q, k, v, out (and the gradients) of these shapes.
struct Call {
  AttentionShape shape;
  std::vector<AttentionRows> rows;
};

Call call_of(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, bool backward) {
  Call c;
  EXPECT_TRUE(make_attention_shape(q, k, v, causal, 0.125, c.shape));
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  const Tensor out = Tensor::empty(out_shape, q.dtype());
  c.rows = {attention_rows(q), attention_rows(k), attention_rows(v), attention_rows(out)};
  if (backward) {
    c.rows.insert(c.rows.end(), {attention_rows(out), attention_rows(Tensor::empty(q.shape(), q.dtype())),
                                 attention_rows(Tensor::empty(k.shape(), q.dtype())),
                                 attention_rows(Tensor::empty(v.shape(), q.dtype()))});
  }
  return c;
}

AttentionDecision decide_for(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                             bool backward = false, AttentionTarget target = kH100) {
  const Call c = call_of(q, k, v, causal, backward);
  return decide(c.shape, q.dtype(), c.rows, backward, target, 0);
}

TEST(CudnnAttention, TheEngineComesFromDtensorAttention) {
  EXPECT_EQ(parse_attention_engine(""), AttentionEngine::Auto);
  EXPECT_EQ(parse_attention_engine("auto"), AttentionEngine::Auto);
  EXPECT_EQ(parse_attention_engine("cudnn"), AttentionEngine::Cudnn);
  EXPECT_EQ(parse_attention_engine("own"), AttentionEngine::Own);
  EXPECT_THROW_MSG(parse_attention_engine("flash"), std::invalid_argument,
                   "DTENSOR_ATTENTION: expected auto, cudnn or own, got 'flash'");
  EXPECT_STREQ(attention_engine_name(AttentionEngine::Cudnn), "cudnn");
}

TEST(CudnnAttention, BatchDimsFoldIntoBatchAndHeads) {
  const Shape bhsd{2, 3, 16, 64};
  // [B, H, S, D] contiguous: B and H nest (H's stride times its size is B's), so they
  // merge into one dim of 6 entries: cuDNN gets B = 1, H = 6.
  {
    const Call c = call_of(Tensor::empty(bhsd, DType::BF16), Tensor::empty(bhsd, DType::BF16),
                           Tensor::empty(bhsd, DType::BF16), true, false);
    const std::optional<FoldedBatch> f = fold_batch(c.shape.batch, c.rows);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->b, 1);
    EXPECT_EQ(f->h, 6);
    EXPECT_EQ(f->strides[0], (std::array<int64_t, 2>{6 * 16 * 64, 16 * 64}));
  }
  // The model's layout: q a transposed [B, S, H, D] view. H steps by D inside a row of
  // H * D; B by S * H * D: they do not merge, cuDNN gets B = 2, H = 3 with those strides.
  {
    const Tensor q = Tensor::empty({2, 16, 3, 64}, DType::BF16).transpose(1, 2);
    const Call c = call_of(q, q, q, true, false);
    const std::optional<FoldedBatch> f = fold_batch(c.shape.batch, c.rows);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->b, 2);
    EXPECT_EQ(f->h, 3);
    EXPECT_EQ(f->strides[0], (std::array<int64_t, 2>{16 * 3 * 64, 64}));
    const AttentionDecision d = decide(c.shape, DType::BF16, c.rows, false, kH100, 0);
    ASSERT_TRUE(d.key) << d.refusal;
    EXPECT_EQ(d.key->tensors.q.dims, (std::array<int64_t, 4>{2, 3, 16, 64}));
    EXPECT_EQ(d.key->tensors.q.strides, (std::array<int64_t, 4>{16 * 3 * 64, 64, 3 * 64, 1}));
    // The output is laid out in q's order by the op (empty_in_order_of); here contiguous.
    EXPECT_EQ(d.key->tensors.o.strides, (std::array<int64_t, 4>{3 * 16 * 64, 16 * 64, 64, 1}));
    // The log-sum-exp is the kernel table's contiguous [entries, queries] F32.
    EXPECT_EQ(d.key->tensors.stats.dims, (std::array<int64_t, 4>{2, 3, 16, 1}));
    EXPECT_EQ(d.key->tensors.stats.strides, (std::array<int64_t, 4>{3 * 16, 16, 1, 1}));
  }
  // Three batch dims, size-1 dims dropped, and dims that cannot be expressed.
  {
    const Tensor q = Tensor::empty({2, 1, 4, 8, 32}, DType::F16).permute({2, 1, 0, 3, 4});  // [4, 1, 2, 8, 32]
    const Call c = call_of(q, q, q, false, false);
    const std::optional<FoldedBatch> f = fold_batch(c.shape.batch, c.rows);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->b, 4);
    EXPECT_EQ(f->h, 2);
    EXPECT_EQ(f->strides[0], (std::array<int64_t, 2>{8 * 32, 4 * 8 * 32}));
    const Tensor r = Tensor::empty({2, 3, 4, 8, 32}, DType::F16).permute({1, 0, 2, 3, 4});  // [3, 2, 4, ...]
    const Call bad = call_of(r, r, r, false, false);
    EXPECT_FALSE(fold_batch(bad.shape.batch, bad.rows));
    const AttentionDecision d = decide(bad.shape, DType::F16, bad.rows, false, kH100, 0);
    EXPECT_FALSE(d.key);
    EXPECT_NE(d.refusal.find("do not fold into cuDNN's [B, H]"), std::string::npos) << d.refusal;
  }
  // No batch dims: B = H = 1.
  {
    const Tensor q = Tensor::empty({16, 64}, DType::BF16);
    const AttentionDecision d = decide_for(q, q, q);
    ASSERT_TRUE(d.key) << d.refusal;
    EXPECT_EQ(d.key->tensors.q.dims, (std::array<int64_t, 4>{1, 1, 16, 64}));
    EXPECT_EQ(d.key->tensors.q.strides, (std::array<int64_t, 4>{16 * 64, 16 * 64, 64, 1}));
  }
}

TEST(CudnnAttention, WhatCudnnRefusesFallsBackWithTheReason) {
  const Shape s{2, 4, 32, 64};
  const Tensor bf16 = Tensor::empty(s, DType::BF16);
  auto refusal = [](const AttentionDecision& d) { return d.key ? std::string("(taken)") : d.refusal; };
  EXPECT_TRUE(decide_for(bf16, bf16, bf16).key);
  EXPECT_TRUE(decide_for(bf16, bf16, bf16, false, true).key);
  const Tensor f16 = Tensor::empty(s, DType::F16);
  EXPECT_TRUE(decide_for(f16, f16, f16).key);
  const Tensor f32 = Tensor::empty(s, DType::F32);
  EXPECT_EQ(refusal(decide_for(f32, f32, f32)), "cuDNN's fused attention takes BF16 and F16, got f32");
  EXPECT_EQ(refusal(decide_for(bf16, bf16, bf16, true, false, {.sm = 75, .cudnn_version = 91900})),
            "cuDNN's fused attention needs compute capability 8.0 or newer, this GPU has 7.5");
  // Head dims: multiples of 8 up to 128, 256 on Hopper with cuDNN 9.5 or newer.
  const Tensor d12 = Tensor::empty({2, 4, 32, 12}, DType::BF16);
  EXPECT_NE(refusal(decide_for(d12, d12, d12)).find("head dims that are multiples of 8 up to 256, got 12"),
            std::string::npos);
  const Tensor d256 = Tensor::empty({1, 2, 64, 256}, DType::BF16);
  EXPECT_TRUE(decide_for(d256, d256, d256, true, true).key);
  EXPECT_NE(refusal(decide_for(d256, d256, d256, true, false, {.sm = 80, .cudnn_version = 91900}))
                .find("up to 128 (256 needs compute capability 9.x and cuDNN 9.5), got 256"),
            std::string::npos);
  // A value dim other than the head dim: at most it from cuDNN 9.5, equal before.
  const Tensor v32 = Tensor::empty({2, 4, 32, 32}, DType::BF16);
  EXPECT_TRUE(decide_for(bf16, bf16, v32).key);
  EXPECT_EQ(refusal(decide_for(bf16, bf16, v32, true, false, {.sm = 90, .cudnn_version = 90100})),
            "cuDNN 90100 takes a value dim equal to the head dim, got 32 and 64");
  // Rows must start on 16 bytes: a narrowed view whose row stride is 68 elements.
  const Tensor wide = Tensor::empty({2, 4, 32, 68}, DType::BF16).narrow(-1, 0, 64);
  EXPECT_NE(refusal(decide_for(wide, bf16, bf16)).find("strides that are non-zero multiples of 8 elements"),
            std::string::npos);
  const Call c = call_of(bf16, bf16, bf16, true, false);
  EXPECT_EQ(refusal(decide(c.shape, DType::BF16, c.rows, false,
                           {.sm = 90, .cudnn_version = 91900, .pointers_aligned = false}, 0)),
            "cuDNN's fused attention needs 16-byte aligned operands");
  // A head broadcast by a zero stride repeats rows: refused.
  const Tensor shared = Tensor::empty({2, 1, 32, 64}, DType::BF16).expand({2, 4, 32, 64});
  EXPECT_NE(refusal(decide_for(bf16, shared, shared)).find("non-zero multiples of 8"), std::string::npos);
  // What cudnn-frontend refuses by version and shape.
  EXPECT_NE(refusal(decide_for(bf16, bf16, bf16, true, false, {.sm = 90, .cudnn_version = 91001})).find("known bugs"),
            std::string::npos);
  const Tensor one = Tensor::empty({2, 4, 1, 64}, DType::BF16);
  EXPECT_EQ(refusal(decide_for(one, one, one, false, true)),
            "cuDNN's fused attention backward does not take one query and one key");
  EXPECT_TRUE(decide_for(one, bf16, bf16, true, false).key);  // decoding, causal: from 9.10
  EXPECT_NE(refusal(decide_for(one, bf16, bf16, true, false, {.sm = 90, .cudnn_version = 90900}))
                .find("a causal mask with one query"),
            std::string::npos);
  EXPECT_NE(refusal(decide_for(bf16, bf16, bf16, true, true, {.sm = 90, .cudnn_version = 91500}))
                .find("a key count that is a multiple of 128, got 32"),
            std::string::npos);
  const Tensor k128 = Tensor::empty({2, 4, 128, 64}, DType::BF16);
  EXPECT_TRUE(decide_for(bf16, k128, k128, true, true, {.sm = 90, .cudnn_version = 91500}).key);
  // 256-wide heads are Hopper's alone (compute capability 10 takes 128).
  EXPECT_FALSE(decide_for(d256, d256, d256, true, false, {.sm = 100, .cudnn_version = 91900}).key);
  // Sq != Sk (top-left causal, as the own kernels and PyTorch's is_causal) is taken.
  const Tensor k48 = Tensor::empty({2, 4, 48, 64}, DType::BF16);
  const AttentionDecision cross = decide_for(bf16, k48, k48);
  ASSERT_TRUE(cross.key) << cross.refusal;
  EXPECT_EQ(cross.key->queries, 32);
  EXPECT_EQ(cross.key->keys, 48);
}

TEST(CudnnAttention, GraphsAreCachedPerShapeLayoutDtypeMaskAndDirection) {
  const Tensor q = Tensor::empty({2, 4, 32, 64}, DType::BF16);
  const Tensor t = Tensor::empty({2, 32, 4, 64}, DType::BF16).transpose(1, 2);
  const AttentionKey fwd = *decide_for(q, q, q).key;
  EXPECT_EQ(fwd.to_string(), "fwd bf16 causal B1 H8 Sq32 Sk32 D64 Dv64 on cuda:0");
  const std::vector<AttentionKey> keys = {
      fwd,
      *decide_for(q, q, q, false).key,
      *decide_for(q, q, q, true, true).key,
      *decide_for(t, t, t).key,
      *decide_for(t, q, q).key,
      *decide_for(Tensor::empty({2, 4, 32, 64}, DType::F16), Tensor::empty({2, 4, 32, 64}, DType::F16),
                  Tensor::empty({2, 4, 32, 64}, DType::F16))
           .key};
  std::unordered_set<AttentionKey, AttentionKeyHash> distinct(keys.begin(), keys.end());
  EXPECT_EQ(distinct.size(), keys.size());
  // The same call again finds its graph.
  EXPECT_EQ(distinct.count(*decide_for(q, q, q).key), 1u);
  EXPECT_EQ(AttentionKeyHash()(fwd), AttentionKeyHash()(*decide_for(q, q, q).key));
}

}  // namespace
}  // namespace dtensor::backend::cudnn
