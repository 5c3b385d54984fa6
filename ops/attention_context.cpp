// scaled_dot_product_attention's context-parallel path: the layouts it takes, the
// ContextParallelScope, the choice between the ring and the all-gather variant, and
// the recorded backward (see ops/attention_context.h).
#include "ops/attention_context.h"

#include <algorithm>
#include <cmath>

#include "dtensor/cost_model.h"
#include "dtensor/trace.h"
#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {
namespace {

thread_local std::optional<ContextParallelOptions> scoped;  // per rank

}  // namespace

ContextParallelScope::ContextParallelScope(ContextParallelOptions options) : previous_(scoped) {
  scoped = std::move(options);
}
ContextParallelScope::ContextParallelScope(std::optional<ContextParallelOptions> options) : previous_(scoped) {
  if (options) scoped = std::move(options);
}
ContextParallelScope::~ContextParallelScope() { scoped = previous_; }
std::optional<ContextParallelOptions> ContextParallelScope::current() { return scoped; }

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

std::vector<int64_t> sequence_positions(const DeviceMesh& mesh, int64_t seq) {
  const std::vector<std::string>& names = mesh.names();
  if (scoped && scoped->load_balanced && std::count(names.begin(), names.end(), scoped->mesh_dim) > 0) {
    return load_balanced_positions(seq, mesh.size(scoped->mesh_dim));
  }
  std::vector<int64_t> positions(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) positions[static_cast<size_t>(i)] = i;
  return positions;
}

namespace ops::context {
namespace {

const char* const kOp = "scaled_dot_product_attention";

// Kernel calls (and the small ops around them) cost about this much each, whatever
// their size: what makes many small blocks slower than one large one.
constexpr double kCallSeconds = 5e-6;

// The ring or the all-gather variant, whichever is predicted faster, forward and
// backward together: communication the compute does not hide, kernel calls and the
// merges after them, and the reordering. Every rank of the ring must choose alike, so
// only what they share enters: the global sequence, the ring's size and the leading
// dims (equal across a cp group, whose ranks share every other mesh coordinate).
ContextAttention choose(const Layout& l, const Tensor& q, const Tensor& k, const Tensor& v) {
  if (l.ranks == 1) return ContextAttention::Ring;  // one step: the kernels alone
  const std::string backend = l.group->backend();
  const CostModel model = CostModel::for_backend(backend, backend == "threads" ? l.ranks : 1);
  const double lead = static_cast<double>(shape_numel(Shape(q.shape().begin(), q.shape().end() - 2)));
  const double p = l.ranks, rows = std::ceil(static_cast<double>(l.seq) / p);
  const double d = static_cast<double>(q.size(-1)), dv = static_cast<double>(v.size(-1));
  const auto kv = static_cast<int64_t>(lead * rows * (d + dv) * static_cast<double>(dtype_size(k.dtype())));
  const auto kv_grads = static_cast<int64_t>(lead * rows * (d + dv) * 4);
  // The block pairs that attend and the key ranges of the all-gather variant, over
  // every rank (a rank-independent average).
  double pairs = 0, ranges = 0;
  for (int r = 0; r < l.ranks; ++r) {
    Layout at = l;
    at.rank = r;
    for (const Segment& qs : at.segments(r)) {
      ranges += l.causal && at.natural_start(qs.chunk) > 0 ? 2 : 1;
      for (int s = 0; s < l.ranks; ++s) {
        for (const Segment& ks : at.segments(at.block_at(s))) pairs += at.mask(qs, ks) == Mask::None ? 0 : 1;
      }
    }
  }
  pairs /= p;
  ranges /= p;
  const double segment_rows = rows / static_cast<double>(l.segments(0).size());
  const double pair_flops = 4.0 * lead * segment_rows * segment_rows * d;
  const double step_compute = pair_flops / model.flops_per_s * pairs / p;
  const double per_call = 3 * kCallSeconds + model.local_copy(static_cast<int64_t>(8 * lead * segment_rows * dv * 4));
  const double ring = (p - 1) * std::max(0.0, model.point_to_point(kv, 1) - step_compute) +
                      p * std::max(0.0, model.point_to_point(kv + kv_grads, 1) - 2.5 * step_compute) + pairs * per_call;
  const int64_t whole = l.ranks * kv, whole_grads = l.ranks * kv_grads;
  const double gather = 2 * model.all_gather(whole, l.ranks) + model.reduce_scatter(whole_grads, l.ranks) +
                        ranges * per_call + (l.load_balanced ? model.local_copy(2 * whole + whole_grads) : 0.0);
  return gather < ring ? ContextAttention::AllGather : ContextAttention::Ring;
}

}  // namespace

int sequence_mesh_dim(const DistTensor& q, const DistTensor& k, const DistTensor& v) {
  const int64_t n = q.dim();
  if (n < 2 || k.dim() != n || v.dim() != n) return -1;
  if (Shape(q.shape().begin(), q.shape().end() - 1) != Shape(k.shape().begin(), k.shape().end() - 1) ||
      Shape(q.shape().begin(), q.shape().end() - 1) != Shape(v.shape().begin(), v.shape().end() - 1)) {
    return -1;  // one sequence length and one set of leading dims (self-attention)
  }
  int cp = -1;
  for (int d = 0; d < q.mesh().ndim(); ++d) {
    const Placement p = q.placements()[static_cast<size_t>(d)].normalized(n);
    if (p != k.placements()[static_cast<size_t>(d)].normalized(n) ||
        p != v.placements()[static_cast<size_t>(d)].normalized(n)) {
      return -1;
    }
    if (p.is_partial() || p.is_shard(n - 1) || (p.is_shard(n - 2) && cp >= 0)) return -1;
    if (p.is_shard(n - 2)) cp = d;
  }
  return cp;
}

DistTensor attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, bool causal, int cp,
                     bool load_balanced, ContextAttention algorithm) {
  Layout l;
  l.group = &q.mesh().group(cp);
  l.cp = cp;
  l.ranks = l.group->size();
  l.rank = l.group->rank();
  l.seq = q.size(-2);
  l.causal = causal;
  l.load_balanced = load_balanced && l.ranks > 1;
  DT_CHECK_ARG(!l.load_balanced || l.seq % (2 * l.ranks) == 0, kOp, "the load-balanced order cuts the ", l.seq,
               " positions into ", 2 * l.ranks, " equal chunks (2 per context-parallel rank)");
  const DistTensor qs = q.detach(), ks = k.detach(), vs = v.detach();
  if (algorithm == ContextAttention::Auto) algorithm = choose(l, qs.to_local(), ks.to_local(), vs.to_local());
  const bool ring = algorithm == ContextAttention::Ring;
  const AttentionResult result = [&] {
    const TraceSpan span(ring ? "ring_attention" : "all_gather_attention", "op");
    return ring ? ring_forward(l, qs.to_local(), ks.to_local(), vs.to_local()) : gather_forward(l, qs, ks, vs);
  }();
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  const DistTensor out = DistTensor::from_local(result.out, q.mesh(), q.placements(), out_shape);
  if (!autograd::needs_grad({q, k, v})) return out;
  return ops::with_grad(out, kOp, {q, k, v}, [l, ring, qs, ks, vs, result](const std::vector<DistTensor>& grads) {
    // The gradient may arrive in any layout (sum's is replicated): bring it to the output's.
    const Tensor dout = grads[0].redistribute(qs.placements()).to_local().contiguous();
    const AttentionGrads g = ring ? ring_backward(l, dout, qs.to_local(), ks.to_local(), vs.to_local(), result)
                                  : gather_backward(l, dout, qs, ks, vs, result);
    return std::vector<DistTensor>{
        DistTensor::from_local(g.grad_q.to(qs.dtype()), qs.mesh(), qs.placements(), qs.shape()),
        DistTensor::from_local(g.grad_k.to(ks.dtype()), ks.mesh(), ks.placements(), ks.shape()),
        DistTensor::from_local(g.grad_v.to(vs.dtype()), vs.mesh(), vs.placements(), vs.shape())};
  });
}

}  // namespace ops::context
}  // namespace dtensor
