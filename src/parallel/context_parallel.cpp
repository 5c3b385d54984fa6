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

// What the rings need to know of the layout.
struct Ring {
  const Group* group = nullptr;
  int ranks = 1, rank = 0;
  int64_t seq = 0;  // the global sequence length
  bool causal = false;
  int next() const { return (rank + 1) % ranks; }
  int prev() const { return (rank + ranks - 1) % ranks; }
  int block_at(int step) const { return (rank - step % ranks + ranks) % ranks; }  // the K/V block held at `step`
  int64_t block_rows(int block) const { return chunk_range(seq, ranks, block).length; }
  // How this rank's queries see key block `block`: fully, with the causal mask (the
  // diagonal block), or not at all.
  enum class Mask { Full, Causal, None };
  Mask mask(int block) const {
    if (!causal || block < rank) return Mask::Full;
    return block == rank ? Mask::Causal : Mask::None;
  }
};

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

// out, lse of this rank's queries over the whole ring.
AttentionResult ring_forward(const Ring& ring, const Tensor& q, const Tensor& k, const Tensor& v) {
  std::optional<Tensor> out, lse;
  Tensor kb = k, vb = v;
  for (int step = 0; step < ring.ranks; ++step) {
    const int block = ring.block_at(step);
    // The block goes on to the next rank while this one computes on it.
    std::optional<Pass> pass;
    if (step + 1 < ring.ranks) pass = start_pass(ring, {kb, vb}, ring.block_rows(ring.block_at(step + 1)), kBlockTag);
    const Ring::Mask mask = ring.mask(block);
    if (mask != Ring::Mask::None && q.size(-2) > 0 && kb.size(-2) > 0) {
      const AttentionResult part = scaled_dot_product_attention(q, kb, vb, mask == Ring::Mask::Causal);
      if (!out) {
        out = part.out.to(DType::F32);
        lse = part.lse;
      } else {
        // The online-softmax merge of two partial results.
        const Tensor merged =
            add(maximum(*lse, part.lse),
                log(add(exp(sub(*lse, maximum(*lse, part.lse))), exp(sub(part.lse, maximum(*lse, part.lse))))));
        const Tensor old_w = exp(sub(*lse, merged)).unsqueeze(-1), new_w = exp(sub(part.lse, merged)).unsqueeze(-1);
        out = add(mul(*out, old_w), mul(part.out.to(DType::F32), new_w));
        lse = merged;
      }
    }
    if (pass) {
      const std::vector<Tensor> got = pass->wait();
      kb = got[0];
      vb = got[1];
    }
  }
  if (!out) {  // no key visible to any query (an empty chunk)
    Shape shape = q.shape();
    shape.back() = v.size(-1);
    Shape lse_shape(q.shape().begin(), q.shape().end() - 1);
    return {Tensor::zeros(shape, q.dtype(), q.device()),
            Tensor::full(lse_shape, -std::numeric_limits<double>::infinity(), DType::F32, q.device())};
  }
  return {out->to(q.dtype()), *lse};
}

}  // namespace

DistTensor ring_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, const std::string& cp_dim,
                          bool causal) {
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
  ring.causal = causal;
  const AttentionResult result = ring_forward(ring, q.to_local(), k.to_local(), v.to_local());
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  std::vector<DistTensor> outputs{DistTensor::from_local(result.out, q.mesh(), q.placements(), out_shape)};
  if (!autograd::needs_grad({q, k, v})) return outputs[0];
  const DistTensor qs = q.detach(), ks = k.detach(), vs = v.detach();
  autograd::record(kOp, {q, k, v}, outputs, [ring, qs, ks, vs, result](const std::vector<DistTensor>& grads) {
    // The gradient may arrive in any layout (sum's is replicated): bring it to the output's.
    const Tensor dout = grads[0].redistribute(qs.placements()).to_local().contiguous();
    const Tensor& q_local = qs.to_local();
    Tensor dq = zeros_like_f32(q_local);
    // The K/V block and its dK/dV accumulators travel together.
    Tensor kb = ks.to_local(), vb = vs.to_local();
    Tensor dk = zeros_like_f32(kb), dv = zeros_like_f32(vb);
    for (int step = 0; step < ring.ranks; ++step) {
      const int block = ring.block_at(step);
      const int64_t rows = ring.block_rows(ring.block_at(step + 1));
      // K and V go on while this rank computes; the block's gradient accumulators follow
      // once this rank has added its share (after the last step only they travel, home).
      std::optional<Pass> pass;
      if (step + 1 < ring.ranks) pass = start_pass(ring, {kb, vb}, rows, kBlockTag);
      const Ring::Mask mask = ring.mask(block);
      if (mask != Ring::Mask::None && q_local.size(-2) > 0 && kb.size(-2) > 0) {
        const AttentionGrads g =
            scaled_dot_product_attention_backward(dout, q_local, kb, vb, result, mask == Ring::Mask::Causal);
        dq = add(dq, g.grad_q.to(DType::F32));
        dk = add(dk, g.grad_k.to(DType::F32));
        dv = add(dv, g.grad_v.to(DType::F32));
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
    return std::vector<DistTensor>{DistTensor::from_local(dq.to(qs.dtype()), qs.mesh(), qs.placements(), qs.shape()),
                                   DistTensor::from_local(dk.to(ks.dtype()), ks.mesh(), ks.placements(), ks.shape()),
                                   DistTensor::from_local(dv.to(vs.dtype()), vs.mesh(), vs.placements(), vs.shape())};
  });
  return outputs[0];
}

}  // namespace dtensor::parallel
