// Ring attention over a context-parallel mesh dim: the forward and backward rings.
#include "dtensor/parallel/context_parallel.h"

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "dtensor/autograd.h"
#include "dtensor/group.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "ring_attention";

// A run of rows of one block that holds one chunk of the sequence (its position in
// chunk order decides the causal mask).
struct Segment {
  int64_t chunk = 0;
  int64_t offset = 0, rows = 0;  // within the block
};

// How one pair of segments attends: fully (the keys come first), with the causal mask
// (the same chunk), or not at all (the keys come later).
enum class Mask { Full, Causal, None };

// What the rings need to know of the layout.
struct Ring {
  const Group* group = nullptr;
  int ranks = 1, rank = 0;
  int64_t seq = 0;  // the global sequence length
  bool causal = false;
  bool load_balanced = false;  // blocks of two mirrored chunks
  int next() const { return (rank + 1) % ranks; }
  int prev() const { return (rank + ranks - 1) % ranks; }
  int block_at(int step) const { return (rank - step % ranks + ranks) % ranks; }  // the K/V block held at `step`
  int64_t block_rows(int block) const { return chunk_range(seq, ranks, block).length; }
  // Contiguous: block b is chunk b. Load-balanced: chunks b and 2P - 1 - b of 2P.
  std::vector<Segment> segments(int block) const {
    if (!load_balanced) return {{block, 0, block_rows(block)}};
    const int64_t half = seq / (2 * ranks);
    return {{block, 0, half}, {2 * ranks - 1 - block, half, half}};
  }
  Mask mask(const Segment& queries, const Segment& keys) const {
    if (!causal || keys.chunk < queries.chunk) return Mask::Full;
    return keys.chunk == queries.chunk ? Mask::Causal : Mask::None;
  }
};

Tensor rows_of(const Tensor& t, const Segment& s) {
  return s.offset == 0 && s.rows == t.size(-2) ? t : t.narrow(-2, s.offset, s.rows);
}

Tensor zeros_like_f32(const Tensor& t) { return Tensor::zeros(t.shape(), DType::F32, t.device()); }

void check_layout(const DistTensor& t, const char* name, const DistTensor& q, int cp) {
  const int seq_dim = static_cast<int>(t.dim()) - 2;
  DT_CHECK_ARG(t.dim() >= 2, kOp, name, " must be [..., S, D], got ", t.shape());
  DT_CHECK_ARG(t.mesh() == q.mesh(), kOp, name, " is on another mesh than q");
  DT_CHECK_ARG(t.dim() == q.dim() && t.placements() == q.placements(), kOp, name, " must be laid out as q (",
               placements_to_string(q.placements()), "), got ", placements_to_string(t.placements()), " for ",
               t.shape());
  for (int d = 0; d < t.mesh().ndim(); ++d) {
    const Placement& p = t.placements()[static_cast<size_t>(d)];
    if (d == cp) {
      DT_CHECK_ARG(p.is_shard() && p.dim() == seq_dim, kOp, name, " must be sharded on its sequence dim (Shard(",
                   seq_dim, ")) over the context-parallel mesh dim, got ", p.to_string());
    } else {
      DT_CHECK_ARG(p.is_replicate() || (p.is_shard() && p.dim() < seq_dim), kOp, name, ": mesh dim ", d, " holds ",
                   p.to_string(),
                   "; only Replicate or a Shard of a dim before the sequence (batch, heads) compose with "
                   "context parallelism");
    }
  }
}

// A pass of tensors to the next rank, in flight while this rank computes: wait()
// returns what arrived from the previous rank.
struct Pass {
  Work work;
  std::vector<Tensor> outgoing, incoming;  // both alive until the exchange completes
  std::vector<Tensor> wait() {
    work.wait();
    return incoming;
  }
};

// Starts sending `outgoing` on and receiving the previous rank's tensors of the same
// shapes but `rows` rows on the sequence dim; tags from `first_tag` keep two passes in
// flight apart.
Pass start_pass(const Ring& ring, const std::vector<Tensor>& outgoing, int64_t rows, int first_tag) {
  Pass pass;
  std::vector<P2POp> ops;
  for (size_t i = 0; i < outgoing.size(); ++i) {
    Shape shape = outgoing[i].shape();
    shape[shape.size() - 2] = rows;
    pass.outgoing.push_back(outgoing[i].contiguous());
    pass.incoming.push_back(Tensor::empty(shape, outgoing[i].dtype(), outgoing[i].device()));
    const int tag = first_tag + static_cast<int>(i);
    ops.push_back(P2POp::send(pass.outgoing.back(), ring.next(), tag));
    ops.push_back(P2POp::recv(pass.incoming.back(), ring.prev(), tag));
  }
  pass.work = batch_send_recv_async(*ring.group, ops);
  return pass;
}

constexpr int kBlockTag = 0, kGradTag = 2;

// out, lse of this rank's queries over the whole ring: per query segment, the
// partial results of every key segment it sees, merged by the online-softmax rule.
AttentionResult ring_forward(const Ring& ring, const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::vector<Segment> mine = ring.segments(ring.rank);
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  Tensor out = Tensor::zeros(out_shape, DType::F32, q.device());
  Tensor lse = Tensor::full(Shape(q.shape().begin(), q.shape().end() - 1), -std::numeric_limits<double>::infinity(),
                            DType::F32, q.device());
  Tensor kb = k, vb = v;
  for (int step = 0; step < ring.ranks; ++step) {
    const int block = ring.block_at(step);
    // The block goes on to the next rank while this one computes on it.
    std::optional<Pass> pass;
    if (step + 1 < ring.ranks) pass = start_pass(ring, {kb, vb}, ring.block_rows(ring.block_at(step + 1)), kBlockTag);
    for (const Segment& qs : mine) {
      for (const Segment& ks : ring.segments(block)) {
        const Mask mask = ring.mask(qs, ks);
        if (mask == Mask::None || qs.rows == 0 || ks.rows == 0) continue;
        const AttentionResult part =
            scaled_dot_product_attention(rows_of(q, qs), rows_of(kb, ks), rows_of(vb, ks), mask == Mask::Causal);
        Tensor out_rows = out.narrow(-2, qs.offset, qs.rows), lse_rows = lse.narrow(-1, qs.offset, qs.rows);
        // The online-softmax merge (exp(-inf) = 0 takes the first part as it is).
        const Tensor top = maximum(lse_rows, part.lse);
        const Tensor merged = add(top, log(add(exp(sub(lse_rows, top)), exp(sub(part.lse, top)))));
        const Tensor old_w = exp(sub(lse_rows, merged)).unsqueeze(-1), new_w = exp(sub(part.lse, merged)).unsqueeze(-1);
        out_rows.copy_(add(mul(out_rows, old_w), mul(part.out.to(DType::F32), new_w)));
        lse_rows.copy_(merged);
      }
    }
    if (pass) {
      const std::vector<Tensor> got = pass->wait();
      kb = got[0];
      vb = got[1];
    }
  }
  return {out.to(q.dtype()), lse};
}

// dq of this rank's queries, and dk, dv of its own block, by the same ring run again.
AttentionGrads ring_backward(const Ring& ring, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionResult& result) {
  const std::vector<Segment> mine = ring.segments(ring.rank);
  Tensor dq = zeros_like_f32(q);
  // The K/V block and its dK/dV accumulators travel together.
  Tensor kb = k, vb = v;
  Tensor dk = zeros_like_f32(kb), dv = zeros_like_f32(vb);
  for (int step = 0; step < ring.ranks; ++step) {
    const int block = ring.block_at(step);
    const int64_t rows = ring.block_rows(ring.block_at(step + 1));
    // K and V go on while this rank computes; the block's gradient accumulators follow
    // once this rank has added its share (after the last step only they travel, home).
    std::optional<Pass> pass;
    if (step + 1 < ring.ranks) pass = start_pass(ring, {kb, vb}, rows, kBlockTag);
    for (const Segment& qs : mine) {
      const AttentionResult saved{rows_of(result.out, qs), result.lse.narrow(-1, qs.offset, qs.rows)};
      const Tensor dout_rows = rows_of(dout, qs), q_rows = rows_of(q, qs);
      for (const Segment& ks : ring.segments(block)) {
        const Mask mask = ring.mask(qs, ks);
        if (mask == Mask::None || qs.rows == 0 || ks.rows == 0) continue;
        const AttentionGrads g = scaled_dot_product_attention_backward(dout_rows, q_rows, rows_of(kb, ks),
                                                                       rows_of(vb, ks), saved, mask == Mask::Causal);
        Tensor dq_rows = dq.narrow(-2, qs.offset, qs.rows), dk_rows = dk.narrow(-2, ks.offset, ks.rows),
               dv_rows = dv.narrow(-2, ks.offset, ks.rows);
        dq_rows.copy_(add(dq_rows, g.grad_q.to(DType::F32)));
        dk_rows.copy_(add(dk_rows, g.grad_k.to(DType::F32)));
        dv_rows.copy_(add(dv_rows, g.grad_v.to(DType::F32)));
      }
    }
    if (ring.ranks > 1) {
      Pass grad_pass = start_pass(ring, {dk, dv}, rows, kGradTag);
      if (pass) {
        const std::vector<Tensor> got = pass->wait();
        kb = got[0];
        vb = got[1];
      }
      const std::vector<Tensor> got = grad_pass.wait();
      dk = got[0];
      dv = got[1];
    }
  }
  return {dq, dk, dv};
}

}  // namespace

DistTensor ring_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, const std::string& cp_dim,
                          RingAttentionOptions options) {
  const int cp = q.mesh().dim_index(cp_dim);
  check_layout(q, "q", q, cp);
  check_layout(k, "k", q, cp);
  check_layout(v, "v", q, cp);
  DT_CHECK_ARG(q.size(-2) == k.size(-2) && k.size(-2) == v.size(-2), kOp,
               "q, k and v must have one sequence length (self-attention), got ", q.shape(), ", ", k.shape(), ", ",
               v.shape());
  Ring ring;
  ring.group = &q.mesh().group(cp);
  ring.ranks = ring.group->size();
  ring.rank = ring.group->rank();
  ring.seq = q.size(-2);
  ring.causal = options.causal;
  ring.load_balanced = options.load_balanced;
  DT_CHECK_ARG(!ring.load_balanced || ring.seq % (2 * ring.ranks) == 0, kOp, "the load-balanced order cuts the ",
               ring.seq, " positions into ", 2 * ring.ranks, " equal chunks (2 per context-parallel rank)");
  const AttentionResult result = ring_forward(ring, q.to_local(), k.to_local(), v.to_local());
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  std::vector<DistTensor> outputs{DistTensor::from_local(result.out, q.mesh(), q.placements(), out_shape)};
  if (!autograd::needs_grad({q, k, v})) return outputs[0];
  const DistTensor qs = q.detach(), ks = k.detach(), vs = v.detach();
  autograd::record(kOp, {q, k, v}, outputs, [ring, qs, ks, vs, result](const std::vector<DistTensor>& grads) {
    // The gradient may arrive in any layout (sum's is replicated): bring it to the output's.
    const Tensor dout = grads[0].redistribute(qs.placements()).to_local().contiguous();
    const AttentionGrads g = ring_backward(ring, dout, qs.to_local(), ks.to_local(), vs.to_local(), result);
    return std::vector<DistTensor>{
        DistTensor::from_local(g.grad_q.to(qs.dtype()), qs.mesh(), qs.placements(), qs.shape()),
        DistTensor::from_local(g.grad_k.to(ks.dtype()), ks.mesh(), ks.placements(), ks.shape()),
        DistTensor::from_local(g.grad_v.to(vs.dtype()), vs.mesh(), vs.placements(), vs.shape())};
  });
  return outputs[0];
}

DistTensor ring_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, const std::string& cp_dim,
                          bool causal) {
  return ring_attention(q, k, v, cp_dim, RingAttentionOptions{.causal = causal});
}

std::vector<int64_t> load_balanced_positions(int64_t seq, int64_t ranks) {
  DT_CHECK_ARG(ranks >= 1 && seq % (2 * ranks) == 0, "load_balanced_positions", "expected ", seq,
               " positions to cut into ", 2 * ranks, " equal chunks (2 per rank)");
  const int64_t half = seq / (2 * ranks);
  std::vector<int64_t> positions;
  for (int64_t r = 0; r < ranks; ++r) {
    for (const int64_t chunk : {r, 2 * ranks - 1 - r}) {
      for (int64_t i = 0; i < half; ++i) positions.push_back(chunk * half + i);
    }
  }
  return positions;
}

}  // namespace dtensor::parallel
