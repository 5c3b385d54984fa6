// The tiled BF16 attention kernels, written once for the GPU and for the CPU tests
// (internal). A block owns 64 rows (queries for the forward and grad_q, keys for
// grad_k/grad_v) and walks the other side in tiles of 64, with the tiles in shared
// memory and every product a 16x16x16 matrix multiply-accumulate of one warp
// (FlashAttention-2's schedule: online softmax in the forward, P and dS recomputed
// from lse and delta in the backward; grad_q and grad_k/grad_v in separate kernels,
// so nothing is accumulated across blocks: no atomics, deterministic).
//
// Each kernel body is a template over
// - Exec: threads(f) runs f(t) for the block's kThreads threads, warps(f) runs f(w)
//   for its kWarps warps (every lane of the warp calls it: the products are warp-wide),
//   each followed by a barrier. On the GPU that is the thread itself and
//   __syncthreads (cuda/attention.cu); HostExec runs them one after another.
// - Mma: 16x16 fragments of BF16 operands (A row- or column-major, B likewise) and of
//   F32 accumulators, loaded from and stored to shared memory with a leading
//   dimension: nvcuda::wmma on the GPU, HostMma (the same meaning, in loops) here.
// So the CPU tests (test_attention_tiles) run the very tile walk, masking, online
// softmax, zero padding and fragment addressing the GPU runs; only the fragment ops
// and the launch differ. Semantics are cpu/attention.cpp's (scale on the scores, the
// causal mask keeps key j for query i when j <= i, lse in F32); P and dS are rounded
// to BF16 before their products, as FlashAttention does.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>

#include "backend/attention_plan.h"
#include "backend/scalar_ops.h"

namespace dtensor::backend::attention_tiles {

constexpr int kTile = 64;  // rows a block owns, and the rows of each tile it walks
constexpr int kWarps = 4;  // warp w owns rows [16 w, 16 w + 16) of a 64-row tile
constexpr int kThreads = 32 * kWarps;
constexpr int kFrag = 16;  // the fragment edge

// Whether the tiled kernels take these operands: BF16 with head and value dims a
// positive multiple of the fragment (the shared memory they need is checked by the
// launcher against what the device offers).
DT_HOST_DEVICE inline bool applies(const AttentionShape& s) {
  return s.bf16 && s.head_dim > 0 && s.value_dim > 0 && s.head_dim % kFrag == 0 && s.value_dim % kFrag == 0;
}

// Leading dimensions: BF16 rows padded by 8 elements and F32 rows by 4 (16 bytes, so
// the rows of a fragment fall in different banks), both kept multiples of what
// wmma's loads require.
DT_HOST_DEVICE constexpr int bf16_ld(int64_t width) { return static_cast<int>(width) + 8; }
DT_HOST_DEVICE constexpr int f32_ld(int64_t width) { return static_cast<int>(width) + 4; }

// Arrays carved out of one shared-memory block, each 32-byte aligned (wmma's loads
// and stores need 256-bit aligned pointers).
struct Carve {
  size_t bytes = 0;
  DT_HOST_DEVICE size_t take(size_t n) {
    const size_t at = bytes;
    bytes = (bytes + n + 31) / 32 * 32;
    return at;
  }
  DT_HOST_DEVICE size_t bf16_tile(int ld) { return take(sizeof(uint16_t) * kTile * ld); }
  DT_HOST_DEVICE size_t f32_tile(int ld) { return take(sizeof(float) * kTile * ld); }
  DT_HOST_DEVICE size_t f32_rows() { return take(sizeof(float) * kTile); }
};

// The forward: q of the block, the k and v tile, scores s, probabilities p, the
// output accumulator o, and per row the running max m, sum l and this tile's
// rescaling of o.
struct ForwardLayout {
  int ldq, ldv, lds, ldp, ldo;
  size_t q, k, v, s, p, o, m, l, rescale, bytes;
  DT_HOST_DEVICE explicit ForwardLayout(const AttentionShape& sh)
      : ldq(bf16_ld(sh.head_dim)),
        ldv(bf16_ld(sh.value_dim)),
        lds(f32_ld(kTile)),
        ldp(bf16_ld(kTile)),
        ldo(f32_ld(sh.value_dim)) {
    Carve c;
    q = c.bf16_tile(ldq);
    k = c.bf16_tile(ldq);
    v = c.bf16_tile(ldv);
    s = c.f32_tile(lds);
    p = c.bf16_tile(ldp);
    o = c.f32_tile(ldo);
    m = c.f32_rows();
    l = c.f32_rows();
    rescale = c.f32_rows();
    bytes = c.bytes;
  }
};

// grad_q: the block's q and grad_out rows, the k and v tile, scores s and dP = dO V^T,
// dS in BF16, the dq accumulator, and lse and delta per row.
struct GradQLayout {
  int ldq, ldv, lds, ldp, lddq;
  size_t q, dout, k, v, s, dp, ds, dq, lse, delta, bytes;
  DT_HOST_DEVICE explicit GradQLayout(const AttentionShape& sh)
      : ldq(bf16_ld(sh.head_dim)),
        ldv(bf16_ld(sh.value_dim)),
        lds(f32_ld(kTile)),
        ldp(bf16_ld(kTile)),
        lddq(f32_ld(sh.head_dim)) {
    Carve c;
    q = c.bf16_tile(ldq);
    dout = c.bf16_tile(ldv);
    k = c.bf16_tile(ldq);
    v = c.bf16_tile(ldv);
    s = c.f32_tile(lds);
    dp = c.f32_tile(lds);
    ds = c.bf16_tile(ldp);
    dq = c.f32_tile(lddq);
    lse = c.f32_rows();
    delta = c.f32_rows();
    bytes = c.bytes;
  }
};

// grad_k/grad_v: the block's k and v rows, the q and grad_out tile, s and dP, P and
// dS in BF16, the dk and dv accumulators, and the tile's lse and delta.
struct GradKVLayout {
  int ldq, ldv, lds, ldp, lddk, lddv;
  size_t k, v, q, dout, s, dp, p, ds, dk, dv, lse, delta, bytes;
  DT_HOST_DEVICE explicit GradKVLayout(const AttentionShape& sh)
      : ldq(bf16_ld(sh.head_dim)),
        ldv(bf16_ld(sh.value_dim)),
        lds(f32_ld(kTile)),
        ldp(bf16_ld(kTile)),
        lddk(f32_ld(sh.head_dim)),
        lddv(f32_ld(sh.value_dim)) {
    Carve c;
    k = c.bf16_tile(ldq);
    v = c.bf16_tile(ldv);
    q = c.bf16_tile(ldq);
    dout = c.bf16_tile(ldv);
    s = c.f32_tile(lds);
    dp = c.f32_tile(lds);
    p = c.bf16_tile(ldp);
    ds = c.bf16_tile(ldp);
    dk = c.f32_tile(lddk);
    dv = c.f32_tile(lddv);
    lse = c.f32_rows();
    delta = c.f32_rows();
    bytes = c.bytes;
  }
};

// The shared memory of the largest of the three kernels for this shape.
DT_HOST_DEVICE inline size_t max_shared_bytes(const AttentionShape& s) {
  const size_t f = ForwardLayout(s).bytes, q = GradQLayout(s).bytes, kv = GradKVLayout(s).bytes;
  const size_t m = f > q ? f : q;
  return m > kv ? m : kv;
}

template <class T>
DT_HOST_DEVICE T* at(unsigned char* smem, size_t offset) {
  return reinterpret_cast<T*>(smem + offset);
}

DT_HOST_DEVICE inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Eight BF16 elements, moved as one 16-byte load and store.
struct alignas(16) Chunk {
  uint32_t words[4];
};

// Rows [row0, row0 + kTile) of an operand (BF16 bits, unit stride along the row) into
// a tile with leading dimension ld (a multiple of 8); rows at or past `rows` become
// zeros. Thread t's share of the block's copy: 16 bytes at a time where the operand's
// rows allow it (width a multiple of 8, rows 16-byte aligned), else element-wise.
DT_HOST_DEVICE inline void load_tile(int t, const uint16_t* src, int64_t row_stride, int64_t row0, int64_t rows,
                                     int64_t width, uint16_t* tile, int ld) {
  const int w = static_cast<int>(width);
  if (w % 8 == 0 && row_stride % 8 == 0 && reinterpret_cast<uintptr_t>(src) % sizeof(Chunk) == 0) {
    const int chunks = w / 8;
    for (int x = t; x < kTile * chunks; x += kThreads) {
      const int r = x / chunks, c = (x % chunks) * 8;
      Chunk value{};
      if (row0 + r < rows) value = *reinterpret_cast<const Chunk*>(src + (row0 + r) * row_stride + c);
      *reinterpret_cast<Chunk*>(tile + r * ld + c) = value;
    }
    return;
  }
  for (int x = t; x < kTile * w; x += kThreads) {
    const int r = x / w, c = x % w;
    tile[r * ld + c] = row0 + r < rows ? src[(row0 + r) * row_stride + c] : uint16_t{0};
  }
}

DT_HOST_DEVICE inline void zero_tile(int t, float* tile, int ld, int64_t width) {
  const int w = static_cast<int>(width);
  for (int x = t; x < kTile * w; x += kThreads) tile[(x / w) * ld + x % w] = 0;
}

// Rows of an F32 tile, rounded to BF16, out to the rows [row0, rows) of an operand
// (each multiplied by row_scale[r] when given).
DT_HOST_DEVICE inline void store_tile(int t, const float* tile, int ld, int64_t width, const float* row_scale,
                                      int64_t row0, int64_t rows, uint16_t* dst, int64_t row_stride) {
  const int w = static_cast<int>(width);
  for (int x = t; x < kTile * w; x += kThreads) {
    const int r = x / w, c = x % w;
    if (row0 + r >= rows) continue;
    const float value = tile[r * ld + c] * (row_scale ? row_scale[r] : 1.0f);
    dst[(row0 + r) * row_stride + c] = scalar::f32_to_bf16_bits(value);
  }
}

// c (16x16 F32, leading dimension ldc) = [c +] sum over `steps` of A_i B_i, where A_i
// is the 16x16 BF16 block at a + i * a_step (column-major when kACol) and B_i the one
// at b + i * b_step (column-major when kBCol). One warp's product.
template <class Mma, bool kACol, bool kBCol>
DT_HOST_DEVICE void warp_product(float* c, int ldc, bool accumulate, const uint16_t* a, int lda, int64_t a_step,
                                 const uint16_t* b, int ldb, int64_t b_step, int64_t steps) {
  typename Mma::Acc acc;
  if (accumulate) {
    Mma::load_acc(acc, c, ldc);
  } else {
    Mma::zero(acc);
  }
  for (int64_t i = 0; i < steps; ++i) {
    typename Mma::template A<kACol> fa;
    typename Mma::template B<kBCol> fb;
    Mma::template load_a<kACol>(fa, a + i * a_step, lda);
    Mma::template load_b<kBCol>(fb, b + i * b_step, ldb);
    Mma::mma(acc, fa, fb);
  }
  Mma::store_acc(c, acc, ldc);
}

// out [16 w.., 64] = x [16 w.., width] y^T, y a [64, width] tile: a warp's rows of
// q k^T or dO v^T.
template <class Mma>
DT_HOST_DEVICE void warp_times_transposed(int w, const uint16_t* x, int ldx, const uint16_t* y, int ldy, int64_t width,
                                          float* out, int ldout) {
  for (int n = 0; n < kTile / kFrag; ++n) {
    warp_product<Mma, false, true>(out + kFrag * w * ldout + kFrag * n, ldout, false, x + kFrag * w * ldx, ldx, kFrag,
                                   y + kFrag * n * ldy, ldy, kFrag, width / kFrag);
  }
}

// acc [16 w.., width] += p [16 w.., 64] y, y a [64, width] tile; with kTransposed, p^T
// (the warp's columns of p) in place of p's rows.
template <class Mma, bool kTransposed>
DT_HOST_DEVICE void warp_accumulate(int w, const uint16_t* p, int ldp, const uint16_t* y, int ldy, int64_t width,
                                    float* acc, int ldacc) {
  const uint16_t* a = kTransposed ? p + kFrag * w : p + kFrag * w * ldp;
  const int64_t a_step = kTransposed ? int64_t{kFrag} * ldp : kFrag;
  for (int64_t n = 0; n < width / kFrag; ++n) {
    warp_product<Mma, kTransposed, false>(acc + kFrag * w * ldacc + kFrag * n, ldacc, true, a, ldp, a_step,
                                          y + kFrag * n, ldy, int64_t{kFrag} * ldy, kTile / kFrag);
  }
}

// How many of a tile's columns (keys j0 + c) query i sees.
DT_HOST_DEVICE inline int64_t visible_keys(const AttentionShape& s, int64_t i, int64_t j0) {
  int64_t n = min64(kTile, s.keys - j0);
  if (s.causal) n = min64(n, i - j0 + 1);
  return n < 0 ? 0 : n;
}

// The keys a block of queries starting at q0 needs: with the causal mask none past
// its last query.
DT_HOST_DEVICE inline int64_t key_end(const AttentionShape& s, int64_t q0) {
  return s.causal ? min64(s.keys, q0 + kTile) : s.keys;
}

// out rows [q0, q0 + 64) of batch entry e, and their lse.
template <class Exec, class Mma>
DT_HOST_DEVICE void forward_block(Exec& ex, const AttentionShape& s, const AttentionRows& qr, const AttentionRows& kr,
                                  const AttentionRows& vr, const AttentionRows& outr, const uint16_t* q,
                                  const uint16_t* k, const uint16_t* v, uint16_t* out, float* lse, int64_t tile,
                                  int64_t e, unsigned char* smem) {
  const ForwardLayout L(s);
  uint16_t *qs = at<uint16_t>(smem, L.q), *ks = at<uint16_t>(smem, L.k), *vs = at<uint16_t>(smem, L.v);
  uint16_t* ps = at<uint16_t>(smem, L.p);
  float *ss = at<float>(smem, L.s), *os = at<float>(smem, L.o);
  float *row_m = at<float>(smem, L.m), *row_l = at<float>(smem, L.l), *rescale = at<float>(smem, L.rescale);
  const int64_t q0 = tile * kTile;
  const uint16_t* k_entry = k + entry_offset(s.batch, kr, e);
  const uint16_t* v_entry = v + entry_offset(s.batch, vr, e);
  ex.threads([&](int t) {
    load_tile(t, q + entry_offset(s.batch, qr, e), qr.row_stride, q0, s.queries, s.head_dim, qs, L.ldq);
    zero_tile(t, os, L.ldo, s.value_dim);
    if (t < kTile) {
      row_m[t] = -INFINITY;
      row_l[t] = 0;
    }
  });
  const int64_t end = key_end(s, q0);
  for (int64_t j0 = 0; j0 < end; j0 += kTile) {
    ex.threads([&](int t) {
      load_tile(t, k_entry, kr.row_stride, j0, s.keys, s.head_dim, ks, L.ldq);
      load_tile(t, v_entry, vr.row_stride, j0, s.keys, s.value_dim, vs, L.ldv);
    });
    ex.warps([&](int w) { warp_times_transposed<Mma>(w, qs, L.ldq, ks, L.ldq, s.head_dim, ss, L.lds); });
    // The online softmax, a thread per row: the new running max, P = exp(scale S - m)
    // over the visible keys, and the factor that carries o and l over to the new max.
    ex.threads([&](int t) {
      if (t >= kTile) return;
      const float* srow = ss + t * L.lds;
      uint16_t* prow = ps + t * L.ldp;
      const int64_t n = visible_keys(s, q0 + t, j0);
      float tile_max = -INFINITY;
      for (int64_t c = 0; c < n; ++c) tile_max = fmaxf(tile_max, srow[c] * s.scale);
      const float m = fmaxf(row_m[t], tile_max);
      if (m == -INFINITY) {  // nothing visible yet: o and l stay 0
        for (int c = 0; c < kTile; ++c) prow[c] = 0;
        rescale[t] = 1;
        return;
      }
      float sum = 0;
      for (int64_t c = 0; c < kTile; ++c) {
        const float p = c < n ? expf(srow[c] * s.scale - m) : 0.0f;
        prow[c] = scalar::f32_to_bf16_bits(p);
        sum += p;
      }
      rescale[t] = expf(row_m[t] - m);  // 0 on the first visible tile (m was -inf)
      row_l[t] = row_l[t] * rescale[t] + sum;
      row_m[t] = m;
    });
    ex.threads([&](int t) {
      const int w = static_cast<int>(s.value_dim);
      for (int x = t; x < kTile * w; x += kThreads) os[(x / w) * L.ldo + x % w] *= rescale[x / w];
    });
    ex.warps([&](int w) { warp_accumulate<Mma, false>(w, ps, L.ldp, vs, L.ldv, s.value_dim, os, L.ldo); });
  }
  // o / l (no visible key: 0 / 0 = NaN, softmax of nothing, as the CPU's) and lse.
  ex.threads([&](int t) {
    if (t < kTile) rescale[t] = 1.0f / row_l[t];
  });
  ex.threads([&](int t) {
    store_tile(t, os, L.ldo, s.value_dim, rescale, q0, s.queries, out + entry_offset(s.batch, outr, e),
               outr.row_stride);
    if (t < kTile && q0 + t < s.queries) lse[e * s.queries + q0 + t] = row_m[t] + logf(row_l[t]);
  });
}

struct GradOperands {
  const uint16_t *grad_out, *q, *k, *v, *out;
  const float* lse;
  float* delta;  // written by grad_q_block, read by grad_kv_block
  uint16_t *grad_q, *grad_k, *grad_v;
};

// P = exp(scale S - lse) and dS = scale P (dP - delta) of a 64x64 tile pair, in BF16,
// zero where query q0 + r does not see key j0 + c (or either is padding).
DT_HOST_DEVICE inline void probabilities_and_score_grads(int t, const AttentionShape& s, int64_t q0, int64_t j0,
                                                         const float* ss, const float* dps, int lds, const float* lse,
                                                         const float* delta, uint16_t* ps, uint16_t* dss, int ldp) {
  for (int x = t; x < kTile * kTile; x += kThreads) {
    const int r = x / kTile, c = x % kTile;
    const bool visible = q0 + r < s.queries && c < visible_keys(s, q0 + r, j0);
    const float p = visible ? expf(ss[r * lds + c] * s.scale - lse[r]) : 0.0f;
    const float ds = s.scale * p * (dps[r * lds + c] - delta[r]);
    if (ps) ps[r * ldp + c] = scalar::f32_to_bf16_bits(p);
    dss[r * ldp + c] = scalar::f32_to_bf16_bits(ds);
  }
}

// grad_q rows [q0, q0 + 64) of entry e, and delta = rowsum(grad_out * out) of them.
template <class Exec, class Mma>
DT_HOST_DEVICE void grad_q_block(Exec& ex, const AttentionShape& s, const AttentionGradRows& r, const GradOperands& x,
                                 int64_t tile, int64_t e, unsigned char* smem) {
  const GradQLayout L(s);
  uint16_t *qs = at<uint16_t>(smem, L.q), *dos = at<uint16_t>(smem, L.dout), *ks = at<uint16_t>(smem, L.k);
  uint16_t *vs = at<uint16_t>(smem, L.v), *dss = at<uint16_t>(smem, L.ds);
  float *ss = at<float>(smem, L.s), *dps = at<float>(smem, L.dp), *dq = at<float>(smem, L.dq);
  float *lse = at<float>(smem, L.lse), *delta = at<float>(smem, L.delta);
  const int64_t q0 = tile * kTile;
  const uint16_t* g_entry = x.grad_out + entry_offset(s.batch, r.grad_out, e);
  const uint16_t* o_entry = x.out + entry_offset(s.batch, r.out, e);
  const uint16_t* k_entry = x.k + entry_offset(s.batch, r.k, e);
  const uint16_t* v_entry = x.v + entry_offset(s.batch, r.v, e);
  ex.threads([&](int t) {
    load_tile(t, x.q + entry_offset(s.batch, r.q, e), r.q.row_stride, q0, s.queries, s.head_dim, qs, L.ldq);
    load_tile(t, g_entry, r.grad_out.row_stride, q0, s.queries, s.value_dim, dos, L.ldv);
    zero_tile(t, dq, L.lddq, s.head_dim);
    if (t >= kTile) return;
    const int64_t i = q0 + t;
    float d = 0;
    if (i < s.queries) {
      for (int64_t c = 0; c < s.value_dim; ++c) {
        d += scalar::bf16_bits_to_f32(g_entry[i * r.grad_out.row_stride + c]) *
             scalar::bf16_bits_to_f32(o_entry[i * r.out.row_stride + c]);
      }
      x.delta[e * s.queries + i] = d;
    }
    delta[t] = d;
    lse[t] = i < s.queries ? x.lse[e * s.queries + i] : 0.0f;
  });
  const int64_t end = key_end(s, q0);
  for (int64_t j0 = 0; j0 < end; j0 += kTile) {
    ex.threads([&](int t) {
      load_tile(t, k_entry, r.k.row_stride, j0, s.keys, s.head_dim, ks, L.ldq);
      load_tile(t, v_entry, r.v.row_stride, j0, s.keys, s.value_dim, vs, L.ldv);
    });
    ex.warps([&](int w) {
      warp_times_transposed<Mma>(w, qs, L.ldq, ks, L.ldq, s.head_dim, ss, L.lds);
      warp_times_transposed<Mma>(w, dos, L.ldv, vs, L.ldv, s.value_dim, dps, L.lds);
    });
    ex.threads(
        [&](int t) { probabilities_and_score_grads(t, s, q0, j0, ss, dps, L.lds, lse, delta, nullptr, dss, L.ldp); });
    ex.warps([&](int w) { warp_accumulate<Mma, false>(w, dss, L.ldp, ks, L.ldq, s.head_dim, dq, L.lddq); });
  }
  ex.threads([&](int t) {
    store_tile(t, dq, L.lddq, s.head_dim, nullptr, q0, s.queries, x.grad_q + entry_offset(s.batch, r.grad_q, e),
               r.grad_q.row_stride);
  });
}

// grad_k and grad_v rows [j0, j0 + 64) of entry e (after grad_q_block wrote delta).
template <class Exec, class Mma>
DT_HOST_DEVICE void grad_kv_block(Exec& ex, const AttentionShape& s, const AttentionGradRows& r, const GradOperands& x,
                                  int64_t tile, int64_t e, unsigned char* smem) {
  const GradKVLayout L(s);
  uint16_t *ks = at<uint16_t>(smem, L.k), *vs = at<uint16_t>(smem, L.v), *qs = at<uint16_t>(smem, L.q);
  uint16_t *dos = at<uint16_t>(smem, L.dout), *ps = at<uint16_t>(smem, L.p), *dss = at<uint16_t>(smem, L.ds);
  float *ss = at<float>(smem, L.s), *dps = at<float>(smem, L.dp), *dk = at<float>(smem, L.dk);
  float *dv = at<float>(smem, L.dv), *lse = at<float>(smem, L.lse), *delta = at<float>(smem, L.delta);
  const int64_t j0 = tile * kTile;
  const uint16_t* q_entry = x.q + entry_offset(s.batch, r.q, e);
  const uint16_t* g_entry = x.grad_out + entry_offset(s.batch, r.grad_out, e);
  ex.threads([&](int t) {
    load_tile(t, x.k + entry_offset(s.batch, r.k, e), r.k.row_stride, j0, s.keys, s.head_dim, ks, L.ldq);
    load_tile(t, x.v + entry_offset(s.batch, r.v, e), r.v.row_stride, j0, s.keys, s.value_dim, vs, L.ldv);
    zero_tile(t, dk, L.lddk, s.head_dim);
    zero_tile(t, dv, L.lddv, s.value_dim);
  });
  // With the causal mask only queries i >= j see key j; j0 is a multiple of the tile.
  for (int64_t i0 = s.causal ? j0 : 0; i0 < s.queries; i0 += kTile) {
    ex.threads([&](int t) {
      load_tile(t, q_entry, r.q.row_stride, i0, s.queries, s.head_dim, qs, L.ldq);
      load_tile(t, g_entry, r.grad_out.row_stride, i0, s.queries, s.value_dim, dos, L.ldv);
      if (t < kTile) {
        const bool real = i0 + t < s.queries;
        lse[t] = real ? x.lse[e * s.queries + i0 + t] : 0.0f;
        delta[t] = real ? x.delta[e * s.queries + i0 + t] : 0.0f;
      }
    });
    ex.warps([&](int w) {
      warp_times_transposed<Mma>(w, qs, L.ldq, ks, L.ldq, s.head_dim, ss, L.lds);
      warp_times_transposed<Mma>(w, dos, L.ldv, vs, L.ldv, s.value_dim, dps, L.lds);
    });
    ex.threads([&](int t) { probabilities_and_score_grads(t, s, i0, j0, ss, dps, L.lds, lse, delta, ps, dss, L.ldp); });
    // Warp w now owns keys [16 w, 16 w + 16): dv += P^T dO, dk += dS^T q.
    ex.warps([&](int w) {
      warp_accumulate<Mma, true>(w, ps, L.ldp, dos, L.ldv, s.value_dim, dv, L.lddv);
      warp_accumulate<Mma, true>(w, dss, L.ldp, qs, L.ldq, s.head_dim, dk, L.lddk);
    });
  }
  ex.threads([&](int t) {
    store_tile(t, dk, L.lddk, s.head_dim, nullptr, j0, s.keys, x.grad_k + entry_offset(s.batch, r.grad_k, e),
               r.grad_k.row_stride);
    store_tile(t, dv, L.lddv, s.value_dim, nullptr, j0, s.keys, x.grad_v + entry_offset(s.batch, r.grad_v, e),
               r.grad_v.row_stride);
  });
}

// ---- the CPU's Exec and Mma (for the tests) ------------------------------------------

struct HostExec {
  template <class F>
  void threads(F&& f) {
    for (int t = 0; t < kThreads; ++t) f(t);
  }
  template <class F>
  void warps(F&& f) {
    for (int w = 0; w < kWarps; ++w) f(w);
  }
};

// wmma's meaning: a fragment is a 16x16 matrix; a row-major load reads element (r, c)
// at p[r * ld + c], a column-major one at p[c * ld + r]; mma is acc += a b with F32
// accumulation.
struct HostMma {
  struct Frag {
    float v[kFrag * kFrag];
  };
  using Acc = Frag;
  template <bool kCol>
  using A = Frag;
  template <bool kCol>
  using B = Frag;
  static void zero(Acc& acc) {
    for (float& x : acc.v) x = 0;
  }
  static void load_acc(Acc& acc, const float* p, int ld) {
    for (int r = 0; r < kFrag; ++r) {
      for (int c = 0; c < kFrag; ++c) acc.v[r * kFrag + c] = p[r * ld + c];
    }
  }
  static void store_acc(float* p, const Acc& acc, int ld) {
    for (int r = 0; r < kFrag; ++r) {
      for (int c = 0; c < kFrag; ++c) p[r * ld + c] = acc.v[r * kFrag + c];
    }
  }
  template <bool kCol>
  static void load(Frag& f, const uint16_t* p, int ld) {
    for (int r = 0; r < kFrag; ++r) {
      for (int c = 0; c < kFrag; ++c)
        f.v[r * kFrag + c] = scalar::bf16_bits_to_f32(kCol ? p[c * ld + r] : p[r * ld + c]);
    }
  }
  template <bool kCol>
  static void load_a(Frag& f, const uint16_t* p, int ld) {
    load<kCol>(f, p, ld);
  }
  template <bool kCol>
  static void load_b(Frag& f, const uint16_t* p, int ld) {
    load<kCol>(f, p, ld);
  }
  static void mma(Acc& acc, const Frag& a, const Frag& b) {
    for (int r = 0; r < kFrag; ++r) {
      for (int c = 0; c < kFrag; ++c) {
        float sum = acc.v[r * kFrag + c];
        for (int i = 0; i < kFrag; ++i) sum += a.v[r * kFrag + i] * b.v[i * kFrag + c];
        acc.v[r * kFrag + c] = sum;
      }
    }
  }
};

}  // namespace dtensor::backend::attention_tiles
