// The tiled BF16 attention kernels of backend/attention_tiles.h, which the GPU runs
// with wmma (cuda/attention.cu), here on the CPU through HostExec and HostMma: the
// same tile walk, masks, online softmax, zero padding and fragment addressing, block
// by block over the launch grid, against the naive double-precision reference and
// the CPU kernel. Shared memory starts as NaN in every block, so a read of anything
// the block did not write shows. Shapes cross the 64-row tiles, differ between
// queries and keys both ways (the causal mask top-left aligned), use the transposed
// [B, S, H, D] views a transformer makes and rows that are not 16-byte aligned (the
// element-wise load path).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "attention_reference.h"
#include "backend/attention_tiles.h"
#include "kernel_test_util.h"

namespace dtensor::test {
namespace {

namespace tiles = backend::attention_tiles;

struct Tiled {
  Tensor out, lse, grad_q, grad_k, grad_v;
};

const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* bits(Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }

int64_t tiles_of(int64_t rows) { return (rows + tiles::kTile - 1) / tiles::kTile; }

// Runs the forward grid, then the grad_q and grad_kv grids, every block on the host.
Tiled run_tiled(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal, double scale) {
  backend::AttentionShape s;
  EXPECT_TRUE(backend::make_attention_shape(q, k, v, causal, scale, s));
  EXPECT_TRUE(tiles::applies(s));
  Shape lead(q.shape().begin(), q.shape().end() - 2);
  Shape out_shape = lead, row_shape = lead;
  out_shape.push_back(s.queries);
  out_shape.push_back(s.value_dim);
  row_shape.push_back(s.queries);
  Tiled r{Tensor::empty(out_shape, DType::BF16), Tensor::empty(row_shape, DType::F32),
          Tensor::empty(q.shape(), DType::BF16), Tensor::empty(k.shape(), DType::BF16),
          Tensor::empty(v.shape(), DType::BF16)};
  Tensor delta = Tensor::empty({s.batch.entries * s.queries}, DType::F32);
  std::vector<unsigned char> smem(tiles::max_shared_bytes(s));
  auto poison = [&] { std::memset(smem.data(), 0xff, smem.size()); };  // NaN as BF16 and as F32
  tiles::HostExec ex;
  using Mma = tiles::HostMma;
  const backend::AttentionRows out_rows = backend::attention_rows(r.out);
  for (int64_t e = 0; e < s.batch.entries; ++e) {
    for (int64_t t = 0; t < tiles_of(s.queries); ++t) {
      poison();
      tiles::forward_block<tiles::HostExec, Mma>(ex, s, backend::attention_rows(q), backend::attention_rows(k),
                                                 backend::attention_rows(v), out_rows, bits(q), bits(k), bits(v),
                                                 bits(r.out), static_cast<float*>(r.lse.data_ptr()), t, e, smem.data());
    }
  }
  const backend::AttentionGradRows rows{backend::attention_rows(g),
                                        backend::attention_rows(q),
                                        backend::attention_rows(k),
                                        backend::attention_rows(v),
                                        out_rows,
                                        backend::attention_rows(r.grad_q),
                                        backend::attention_rows(r.grad_k),
                                        backend::attention_rows(r.grad_v)};
  const tiles::GradOperands x{bits(g),
                              bits(q),
                              bits(k),
                              bits(v),
                              bits(r.out),
                              static_cast<const float*>(r.lse.data_ptr()),
                              static_cast<float*>(delta.data_ptr()),
                              bits(r.grad_q),
                              bits(r.grad_k),
                              bits(r.grad_v)};
  for (int64_t e = 0; e < s.batch.entries; ++e) {
    for (int64_t t = 0; t < tiles_of(s.queries); ++t) {
      poison();
      tiles::grad_q_block<tiles::HostExec, Mma>(ex, s, rows, x, t, e, smem.data());
    }
  }
  for (int64_t e = 0; e < s.batch.entries; ++e) {
    for (int64_t t = 0; t < tiles_of(s.keys); ++t) {
      poison();
      tiles::grad_kv_block<tiles::HostExec, Mma>(ex, s, rows, x, t, e, smem.data());
    }
  }
  return r;
}

struct Case {
  int64_t batch, heads, sq, sk, d, dv;
  bool causal;
  enum Layout { Contiguous, HeadViews, Unaligned } layout = Contiguous;
  double scale = -1;  // 1 / sqrt(d)
};

// [B, H, S, width] BF16 values laid out as asked: contiguous, a transposed [B, S, H,
// width] view, or the columns [1, width + 1) of wider rows (2-byte aligned rows).
Tensor operand(const Case& c, int64_t seq, int64_t width, uint64_t seed) {
  switch (c.layout) {
    case Case::HeadViews:
      return uniform_f64({c.batch, seq, c.heads, width}, seed, -1.5, 1.5).to(DType::BF16).transpose(1, 2);
    case Case::Unaligned:
      return uniform_f64({c.batch, c.heads, seq, width + 3}, seed, -1.5, 1.5).to(DType::BF16).slice(3, 1, width + 1);
    case Case::Contiguous: break;
  }
  return uniform_f64({c.batch, c.heads, seq, width}, seed, -1.5, 1.5).to(DType::BF16);
}

void check(const Case& c) {
  SCOPED_TRACE(testing::Message() << "B" << c.batch << " H" << c.heads << " Sq" << c.sq << " Sk" << c.sk << " D" << c.d
                                  << " Dv" << c.dv << (c.causal ? " causal" : "") << " layout " << c.layout);
  const Tensor q = operand(c, c.sq, c.d, 1), k = operand(c, c.sk, c.d, 2), v = operand(c, c.sk, c.dv, 3);
  const Tensor g = operand(c, c.sq, c.dv, 4);
  const double scale = c.scale < 0 ? 1.0 / std::sqrt(static_cast<double>(c.d)) : c.scale;
  const Reference want = naive_attention(values(q), values(k), values(v), values(g), c.batch * c.heads, c.sq, c.sk, c.d,
                                         c.dv, c.causal, scale);
  const Tiled got = run_tiled(q, k, v, g, c.causal, scale);
  // BF16 operands, P and dS rounded to BF16 before their products (as on the GPU).
  expect_close(got.out, want.out, "out", 3.0, 2e-2);
  expect_close(got.lse, want.lse, "lse", 5.0, 1e-4);
  expect_close(got.grad_q, want.dq, "grad_q", 10.0, 4e-2);
  expect_close(got.grad_k, want.dk, "grad_k", 10.0, 4e-2);
  expect_close(got.grad_v, want.dv, "grad_v", 10.0, 4e-2);
  // And within BF16 rounding of the CPU kernel (which keeps P in F32).
  const AttentionResult cpu = scaled_dot_product_attention(q, k, v, c.causal, scale);
  expect_close(got.out, values(cpu.out), "out vs the CPU kernel", 3.0, 2e-2);
}

TEST(AttentionTiles, MatchTheReferenceAcrossTiles) {
  for (bool causal : {false, true}) {
    check({1, 2, 130, 130, 32, 32, causal});  // two full tiles and a partial one
    check({1, 1, 64, 64, 64, 64, causal});    // exactly one tile
    check({2, 1, 20, 45, 16, 48, causal});    // fewer queries than keys
    check({2, 1, 150, 70, 48, 16, causal});   // more queries than keys
  }
}

TEST(AttentionTiles, MatchTheReferenceOnViewsAndUnalignedRows) {
  check({2, 3, 70, 90, 32, 32, true, Case::HeadViews});
  check({1, 2, 70, 40, 16, 32, false, Case::Unaligned});
  check({1, 1, 100, 100, 16, 16, true, Case::Contiguous, 0.3});
}

TEST(AttentionTiles, TakeOnlyBf16WithHeadDimsInFragments) {
  backend::AttentionShape s;
  s.head_dim = s.value_dim = 64;
  s.bf16 = true;
  EXPECT_TRUE(tiles::applies(s));
  s.value_dim = 40;
  EXPECT_FALSE(tiles::applies(s));  // not a multiple of 16
  s.value_dim = 64;
  s.bf16 = false;
  EXPECT_FALSE(tiles::applies(s));  // F32 takes the row kernels
  s.bf16 = true;
  s.head_dim = 0;
  EXPECT_FALSE(tiles::applies(s));
  // Head dim 128 (the benchmark) fits an H100/H200 block's 227 KiB.
  s.head_dim = s.value_dim = 128;
  EXPECT_LE(tiles::max_shared_bytes(s), size_t{227} * 1024);
  EXPECT_GT(tiles::max_shared_bytes(s), size_t{48} * 1024);  // so the launcher opts in
}

}  // namespace
}  // namespace dtensor::test
