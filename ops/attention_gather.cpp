// The all-gather variant of context-parallel attention (see ops/attention_context.h):
// one all-gather of K and V instead of P - 1 passes, and per query segment at most two
// kernel calls (the keys before its chunk, then its own chunk under the causal mask)
// instead of one per block, at the price of holding the whole K and V and of no
// overlap. Backward gathers K and V again and reduce-scatters dK and dV.
#include "ops/attention_context.h"

namespace dtensor::ops::context {
namespace {

Placements with_cp(Placements placements, int cp, Placement p) {
  placements[static_cast<size_t>(cp)] = p;
  return placements;
}

// Copies the chunks of `from` to `to`, from the ranks' order (blocks one after the
// other) to the natural order of the sequence or back.
void reorder_chunks(const Layout& l, const Tensor& from, Tensor to, bool to_natural) {
  for (int64_t c = 0; c < l.chunks(); ++c) {
    const int64_t natural = l.natural_start(c), held = l.held_start(c), rows = l.chunk_rows(c);
    rows_of(to, to_natural ? natural : held, rows).copy_(rows_of(from, to_natural ? held : natural, rows));
  }
}

// t whole along the sequence, in natural order.
Tensor gathered(const Layout& l, const DistTensor& t) {
  const Tensor held = t.redistribute(with_cp(t.placements(), l.cp, Replicate())).to_local();
  if (!l.load_balanced) return held;
  Tensor natural = Tensor::empty(held.shape(), held.dtype(), held.device());
  reorder_chunks(l, held, natural, /*to_natural=*/true);
  return natural;
}

// The key ranges a query segment attends: [0, start) fully, then its own chunk with
// the causal mask (everything, fully, without it).
struct KeyRange {
  int64_t start = 0, rows = 0;
  bool causal = false;
};
std::vector<KeyRange> key_ranges(const Layout& l, const Segment& qs) {
  if (!l.causal) return {{0, l.seq, false}};
  const int64_t start = l.natural_start(qs.chunk);
  std::vector<KeyRange> ranges;
  if (start > 0) ranges.push_back({0, start, false});
  ranges.push_back({start, qs.rows, true});
  return ranges;
}

// dK or dV of the whole sequence (natural order, F32, summed over this rank's
// queries) reduce-scattered to the ranks' blocks, in t's layout.
Tensor reduce_home(const Layout& l, const Tensor& natural, const DistTensor& t) {
  Tensor held = natural;
  if (l.load_balanced) {
    held = Tensor::empty(natural.shape(), natural.dtype(), natural.device());
    reorder_chunks(l, natural, held, /*to_natural=*/false);
  }
  return DistTensor::from_local(held, t.mesh(), with_cp(t.placements(), l.cp, Partial()), t.shape())
      .redistribute(t.placements())
      .to_local();
}

}  // namespace

AttentionResult gather_forward(const Layout& l, const DistTensor& q, const DistTensor& k, const DistTensor& v) {
  const Tensor ql = q.to_local(), kn = gathered(l, k), vn = gathered(l, v);
  AttentionResult acc = empty_result(ql, vn);
  for (const Segment& qs : l.segments(l.rank)) {
    if (qs.rows == 0) continue;
    for (const KeyRange& r : key_ranges(l, qs)) {
      merge(rows_of(acc.out, qs), acc.lse.narrow(-1, qs.offset, qs.rows),
            scaled_dot_product_attention(rows_of(ql, qs), rows_of(kn, r.start, r.rows), rows_of(vn, r.start, r.rows),
                                         r.causal));
    }
  }
  return {acc.out.to(ql.dtype()), acc.lse};
}

AttentionGrads gather_backward(const Layout& l, const Tensor& dout, const DistTensor& q, const DistTensor& k,
                               const DistTensor& v, const AttentionResult& result) {
  const Tensor ql = q.to_local(), kn = gathered(l, k), vn = gathered(l, v);
  Tensor dq = Tensor::zeros(ql.shape(), DType::F32, ql.device());
  Tensor dk = Tensor::zeros(kn.shape(), DType::F32, kn.device()),
         dv = Tensor::zeros(vn.shape(), DType::F32, vn.device());
  for (const Segment& qs : l.segments(l.rank)) {
    if (qs.rows == 0) continue;
    const AttentionResult saved{rows_of(result.out, qs), result.lse.narrow(-1, qs.offset, qs.rows)};
    for (const KeyRange& r : key_ranges(l, qs)) {
      const AttentionGrads g =
          scaled_dot_product_attention_backward(rows_of(dout, qs), rows_of(ql, qs), rows_of(kn, r.start, r.rows),
                                                rows_of(vn, r.start, r.rows), saved, r.causal);
      accumulate(rows_of(dq, qs), g.grad_q);
      accumulate(rows_of(dk, r.start, r.rows), g.grad_k);
      accumulate(rows_of(dv, r.start, r.rows), g.grad_v);
    }
  }
  return {dq, reduce_home(l, dk, k), reduce_home(l, dv, v)};
}

}  // namespace dtensor::ops::context
