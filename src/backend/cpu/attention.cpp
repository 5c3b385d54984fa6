// Fused attention on the CPU, forward and backward (FlashAttention-2's scheme).
//
// Forward, per batch entry and block of Br queries: walk the visible keys in tiles of
// Bc; S = Q K^T (GEMM), an online softmax turns S into P while keeping each row's
// running max m and sum l (vec softmax_tile_online), O = O * correction + P V
// (GEMM). Then O /= l and lse = m + log l. Memory: one Br x Bc tile and one Br x Dv
// accumulator per thread, never [Sq, Sk]; with a causal mask the tiles past the
// diagonal are skipped.
//
// Backward, per batch entry: D = rowsum(dO * O); for each key tile j and each query
// tile i that sees it: P = exp(scale S - lse) (recomputed, not stored), dV_j += P^T
// dO_i, dP = dO_i V_j^T, dS = scale P (dP - D), dQ_i += dS K_j, dK_j += dS^T Q_i. A task
// owns whole batch entries, so dQ, dK and dV accumulate without races.
//
// The tile GEMMs run single-threaded inside the tasks, on the engine measured fastest
// for their shape (gemm_f32). BF16 inputs are converted to F32 per entry (the tiles
// compute in F32, as the scores need) and the outputs rounded once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_kernels.h"

namespace dtensor::backend::cpu {
namespace {

constexpr int64_t kQueryTile = 64;      // Br
constexpr int64_t kKeyTile = 256;       // Bc (forward)
constexpr int64_t kBackwardTile = 64;   // key and query tiles of the backward

// Element offsets of each batch entry of t (the dims before its last two),
// row-major over those dims.
std::vector<int64_t> entry_offsets(const Tensor& t) {
  std::vector<int64_t> offsets{0};
  for (int64_t d = 0; d + 2 < t.dim(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(t.size(d)));
    for (int64_t o : offsets) {
      for (int64_t i = 0; i < t.size(d); ++i) next.push_back(o + i * t.stride(d));
    }
    offsets = std::move(next);
  }
  return offsets;
}

// One batch entry's [rows, cols] matrix as F32 rows: the tensor's own memory for
// F32, a converted copy (into `buffer`) for BF16.
struct Matrix {
  const float* data;
  int64_t ld;
};

Matrix f32_rows(const Tensor& t, int64_t offset, std::vector<float>& buffer) {
  const int64_t rows = t.size(-2), cols = t.size(-1), ld = t.stride(-2);
  if (t.dtype() == DType::F32) return {static_cast<const float*>(t.data_ptr()) + offset, ld};
  buffer.resize(static_cast<size_t>(rows * cols));
  const bf16* src = static_cast<const bf16*>(t.data_ptr()) + offset;
  for (int64_t r = 0; r < rows; ++r) bf16_to_f32(src + r * ld, buffer.data() + r * cols, cols);
  return {buffer.data(), cols};
}

// Stores F32 rows [rows, cols] (leading dim cols) into a batch entry of t.
void store_rows(const float* src, int64_t rows, int64_t cols, Tensor& t, int64_t offset, int64_t first_row = 0) {
  const int64_t ld = t.stride(-2);
  if (t.dtype() == DType::F32) {
    float* dst = static_cast<float*>(t.data_ptr()) + offset + first_row * ld;
    for (int64_t r = 0; r < rows; ++r) std::copy(src + r * cols, src + (r + 1) * cols, dst + r * ld);
  } else {
    bf16* dst = static_cast<bf16*>(t.data_ptr()) + offset + first_row * ld;
    for (int64_t r = 0; r < rows; ++r) f32_to_bf16(src + r * cols, dst + r * ld, cols);
  }
}

// Keys visible to each query row of a tile: query i sees key j when j <= i.
void visible_keys(bool causal, int64_t first_query, int64_t rows, int64_t first_key, int64_t cols,
                  std::vector<int64_t>& valid) {
  valid.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    valid[r] = causal ? std::clamp<int64_t>(first_query + r - first_key + 1, 0, cols) : cols;
  }
}

GemmArgs args(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, float beta) {
  return GemmArgs{ta, tb, m, n, k, lda, ldb, ldc, beta};
}

struct ForwardWork {
  std::vector<float> q, k, v, scores, acc, row_max, row_sum, correction;
  std::vector<int64_t> valid;
};

// Queries [q0, q1) of one batch entry.
void forward_block(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale, int64_t offset_q,
                   int64_t offset_k, int64_t offset_v, int64_t offset_out, int64_t offset_lse, int64_t q0, int64_t q1,
                   Tensor& out, Tensor& lse, ForwardWork& w) {
  const int64_t d = q.size(-1), dv = v.size(-1), keys = k.size(-2);
  const Matrix qm = f32_rows(q, offset_q, w.q), km = f32_rows(k, offset_k, w.k), vm = f32_rows(v, offset_v, w.v);
  w.scores.resize(static_cast<size_t>(kQueryTile * kKeyTile));
  w.acc.resize(static_cast<size_t>(kQueryTile * dv));
  for (int64_t i0 = q0; i0 < q1; i0 += kQueryTile) {
    const int64_t rows = std::min(kQueryTile, q1 - i0);
    const int64_t key_end = causal ? std::min(keys, i0 + rows) : keys;
    w.row_max.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
    w.row_sum.assign(static_cast<size_t>(rows), 0.0f);
    w.correction.resize(static_cast<size_t>(rows));
    std::fill(w.acc.begin(), w.acc.begin() + rows * dv, 0.0f);
    const float* q_tile = qm.data + i0 * qm.ld;
    for (int64_t j0 = 0; j0 < key_end; j0 += kKeyTile) {
      const int64_t cols = std::min(kKeyTile, key_end - j0);
      gemm_f32(args(false, true, rows, cols, d, qm.ld, km.ld, kKeyTile, 0.0f), q_tile, km.data + j0 * km.ld,
               w.scores.data());
      visible_keys(causal, i0, rows, j0, cols, w.valid);
      vec().softmax_tile_online(w.scores.data(), rows, cols, kKeyTile, scale, w.valid.data(), w.row_max.data(),
                                w.row_sum.data(), w.correction.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float c = w.correction[r];
        if (c != 1.0f) {
          for (int64_t e = 0; e < dv; ++e) w.acc[r * dv + e] *= c;
        }
      }
      gemm_f32(args(false, false, rows, dv, cols, kKeyTile, vm.ld, dv, 1.0f), w.scores.data(), vm.data + j0 * vm.ld,
               w.acc.data());
    }
    float* lse_out = static_cast<float*>(lse.data_ptr()) + offset_lse + i0;
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / w.row_sum[r];  // no visible key: 0 * inf = NaN, as softmax of nothing
      for (int64_t e = 0; e < dv; ++e) w.acc[r * dv + e] *= inv;
      lse_out[r] = w.row_max[r] + std::log(w.row_sum[r]);
    }
    store_rows(w.acc.data(), rows, dv, out, offset_out, i0);
  }
}

struct BackwardWork {
  std::vector<float> q, k, v, out, grad_out, delta, dq, dk, dv, p, dp;
  std::vector<int64_t> valid;
};

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
               Tensor& lse) {
  const std::vector<int64_t> oq = entry_offsets(q), ok = entry_offsets(k), ov = entry_offsets(v),
                             oo = entry_offsets(out);
  const int64_t entries = static_cast<int64_t>(oq.size()), queries = q.size(-2);
  if (entries == 0 || queries == 0) return;
  // Whole entries per task when there are enough of them; else query ranges too.
  const int64_t query_tiles = (queries + kQueryTile - 1) / kQueryTile;
  const int64_t pieces = entries >= 2 * rank_threads() ? 1 : std::min<int64_t>(query_tiles, 2 * rank_threads());
  parallel_run(static_cast<int>(entries * pieces), [&](int task) {
    thread_local ForwardWork work;
    const int64_t e = task / pieces, piece = task % pieces;
    const int64_t q0 = piece * query_tiles / pieces * kQueryTile;
    const int64_t q1 = std::min(queries, (piece + 1) * query_tiles / pieces * kQueryTile);
    forward_block(q, k, v, causal, static_cast<float>(scale), oq[e], ok[e], ov[e], oo[e], e * queries, q0, q1, out,
                  lse, work);
  });
}

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, bool causal, double scale_d, Tensor& grad_q, Tensor& grad_k,
                        Tensor& grad_v) {
  const std::vector<int64_t> oq = entry_offsets(q), ok = entry_offsets(k), ov = entry_offsets(v),
                             oo = entry_offsets(out), og = entry_offsets(grad_out), ogq = entry_offsets(grad_q),
                             ogk = entry_offsets(grad_k), ogv = entry_offsets(grad_v);
  const int64_t entries = static_cast<int64_t>(oq.size());
  const int64_t queries = q.size(-2), keys = k.size(-2), d = q.size(-1), dv = v.size(-1);
  const float scale = static_cast<float>(scale_d);
  constexpr int64_t T = kBackwardTile;
  parallel_run(static_cast<int>(entries), [&](int e) {
    thread_local BackwardWork w;
    const Matrix qm = f32_rows(q, oq[e], w.q), km = f32_rows(k, ok[e], w.k), vm = f32_rows(v, ov[e], w.v);
    const Matrix om = f32_rows(out, oo[e], w.out), gm = f32_rows(grad_out, og[e], w.grad_out);
    const float* lse_e = static_cast<const float*>(lse.data_ptr()) + e * queries;
    w.delta.resize(static_cast<size_t>(queries));
    for (int64_t r = 0; r < queries; ++r) vec().row_dots(gm.data + r * gm.ld, om.data + r * om.ld, &w.delta[r], 1, dv, 0);
    w.dq.assign(static_cast<size_t>(queries * d), 0.0f);
    w.dk.assign(static_cast<size_t>(keys * d), 0.0f);
    w.dv.assign(static_cast<size_t>(keys * dv), 0.0f);
    w.p.resize(static_cast<size_t>(T * T));
    w.dp.resize(static_cast<size_t>(T * T));
    for (int64_t j0 = 0; j0 < keys; j0 += T) {
      const int64_t cols = std::min(T, keys - j0);
      // With the causal mask, queries before j0 see none of these keys.
      for (int64_t i0 = causal ? j0 / T * T : 0; i0 < queries; i0 += T) {
        const int64_t rows = std::min(T, queries - i0);
        const float* q_tile = qm.data + i0 * qm.ld;
        const float* g_tile = gm.data + i0 * gm.ld;
        gemm_f32(args(false, true, rows, cols, d, qm.ld, km.ld, T, 0.0f), q_tile, km.data + j0 * km.ld, w.p.data());
        visible_keys(causal, i0, rows, j0, cols, w.valid);
        vec().softmax_tile_recompute(w.p.data(), rows, cols, T, scale, w.valid.data(), lse_e + i0);
        gemm_f32(args(true, false, cols, dv, rows, T, gm.ld, dv, 1.0f), w.p.data(), g_tile, w.dv.data() + j0 * dv);
        gemm_f32(args(false, true, rows, cols, dv, gm.ld, vm.ld, T, 0.0f), g_tile, vm.data + j0 * vm.ld, w.dp.data());
        vec().softmax_tile_grad(w.p.data(), w.dp.data(), rows, cols, T, scale, w.delta.data() + i0);
        gemm_f32(args(false, false, rows, d, cols, T, km.ld, d, 1.0f), w.dp.data(), km.data + j0 * km.ld,
                 w.dq.data() + i0 * d);
        gemm_f32(args(true, false, cols, d, rows, T, qm.ld, d, 1.0f), w.dp.data(), q_tile, w.dk.data() + j0 * d);
      }
    }
    store_rows(w.dq.data(), queries, d, grad_q, ogq[e]);
    store_rows(w.dk.data(), keys, d, grad_k, ogk[e]);
    store_rows(w.dv.data(), keys, dv, grad_v, ogv[e]);
  });
}

}  // namespace dtensor::backend::cpu
