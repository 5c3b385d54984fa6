// Ring attention: the context-parallel layout's arithmetic and the forward and
// backward rings (see ops/attention_context.h).
#include <limits>
#include <optional>

#include "dtensor/placement.h"
#include "dtensor/trace.h"
#include "ops/attention_context.h"

namespace dtensor::ops::context {

int64_t Layout::block_rows(int block) const {
  if (!load_balanced) return chunk_range(seq, ranks, block).length;
  return 2 * (seq / (2 * ranks));
}

std::vector<Segment> Layout::segments(int block) const {
  if (!load_balanced) return {{block, 0, block_rows(block)}};
  const int64_t half = seq / (2 * ranks);
  return {{block, 0, half}, {2 * ranks - 1 - block, half, half}};
}

int64_t Layout::natural_start(int64_t chunk) const {
  if (!load_balanced) return chunk_range(seq, ranks, chunk).offset;
  return chunk * (seq / (2 * ranks));
}

int64_t Layout::held_start(int64_t chunk) const {
  if (!load_balanced) return chunk_range(seq, ranks, chunk).offset;
  const int64_t half = seq / (2 * ranks);
  return chunk < ranks ? chunk * 2 * half : (2 * ranks - 1 - chunk) * 2 * half + half;
}

int64_t Layout::chunk_rows(int64_t chunk) const {
  return load_balanced ? seq / (2 * ranks) : chunk_range(seq, ranks, chunk).length;
}

Tensor rows_of(const Tensor& t, int64_t offset, int64_t rows) {
  return offset == 0 && rows == t.size(-2) ? t : t.narrow(-2, offset, rows);
}

void merge(Tensor out_rows, Tensor lse_rows, const AttentionResult& part) {
  // exp(-inf) = 0 takes the first part as it is.
  const Tensor top = maximum(lse_rows, part.lse);
  const Tensor merged = add(top, log(add(exp(sub(lse_rows, top)), exp(sub(part.lse, top)))));
  const Tensor old_w = exp(sub(lse_rows, merged)).unsqueeze(-1), new_w = exp(sub(part.lse, merged)).unsqueeze(-1);
  out_rows.copy_(add(mul(out_rows, old_w), mul(part.out.to(DType::F32), new_w)));
  lse_rows.copy_(merged);
}

void accumulate(Tensor dst, const Tensor& src) { dst.copy_(add(dst, src.to(DType::F32))); }

AttentionResult empty_result(const Tensor& q, const Tensor& v) {
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  return {Tensor::zeros(out_shape, DType::F32, q.device()),
          Tensor::full(Shape(q.shape().begin(), q.shape().end() - 1), -std::numeric_limits<double>::infinity(),
                       DType::F32, q.device())};
}

namespace {

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
Pass start_pass(const Layout& ring, const std::vector<Tensor>& outgoing, int64_t rows, int first_tag) {
  const TraceSpan span("ring_pass_launch", "comm");
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

Tensor zeros_like_f32(const Tensor& t) { return Tensor::zeros(t.shape(), DType::F32, t.device()); }

}  // namespace

AttentionResult ring_forward(const Layout& ring, const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::vector<Segment> mine = ring.segments(ring.rank);
  AttentionResult acc = empty_result(q, v);
  Tensor kb = k, vb = v;
  for (int step = 0; step < ring.ranks; ++step) {
    const int block = ring.block_at(step);
    // The block goes on to the next rank while this one computes on it.
    std::optional<Pass> pass;
    if (step + 1 < ring.ranks) pass = start_pass(ring, {kb, vb}, ring.block_rows(ring.block_at(step + 1)), kBlockTag);
    // On the trace: the block's compute between the pass's launch and its wait.
    std::optional<TraceSpan> compute(std::in_place, "ring_block", "compute");
    for (const Segment& qs : mine) {
      for (const Segment& ks : ring.segments(block)) {
        const Mask mask = ring.mask(qs, ks);
        if (mask == Mask::None || qs.rows == 0 || ks.rows == 0) continue;
        merge(rows_of(acc.out, qs), acc.lse.narrow(-1, qs.offset, qs.rows),
              scaled_dot_product_attention(rows_of(q, qs), rows_of(kb, ks), rows_of(vb, ks), mask == Mask::Causal));
      }
    }
    compute.reset();
    if (pass) {
      const std::vector<Tensor> got = pass->wait();
      kb = got[0];
      vb = got[1];
    }
  }
  return {acc.out.to(q.dtype()), acc.lse};
}

AttentionGrads ring_backward(const Layout& ring, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
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
    std::optional<TraceSpan> compute(std::in_place, "ring_block_backward", "compute");
    for (const Segment& qs : mine) {
      const AttentionResult saved{rows_of(result.out, qs), result.lse.narrow(-1, qs.offset, qs.rows)};
      const Tensor dout_rows = rows_of(dout, qs), q_rows = rows_of(q, qs);
      for (const Segment& ks : ring.segments(block)) {
        const Mask mask = ring.mask(qs, ks);
        if (mask == Mask::None || qs.rows == 0 || ks.rows == 0) continue;
        const AttentionGrads g = scaled_dot_product_attention_backward(dout_rows, q_rows, rows_of(kb, ks),
                                                                       rows_of(vb, ks), saved, mask == Mask::Causal);
        accumulate(rows_of(dq, qs), g.grad_q);
        accumulate(rows_of(dk, ks), g.grad_k);
        accumulate(rows_of(dv, ks), g.grad_v);
      }
    }
    compute.reset();
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

}  // namespace dtensor::ops::context
