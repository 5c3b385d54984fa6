// Ring attention's checked entry point and the sequence layout of a batch (the rings
// themselves are scaled_dot_product_attention's context-parallel path, ops/).
#include "dtensor/parallel/context_parallel.h"

#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "ring_attention";

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
  const ContextParallelScope scope(
      {.mesh_dim = cp_dim, .load_balanced = options.load_balanced, .attention = ContextAttention::Ring});
  return scaled_dot_product_attention(q, k, v, options.causal);
}

DistTensor ring_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, const std::string& cp_dim,
                          bool causal) {
  return ring_attention(q, k, v, cp_dim, RingAttentionOptions{.causal = causal});
}

DistTensor distribute_sequence(const Tensor& global, const DeviceMesh& mesh, const Placements& placements,
                               const ContextParallelOptions& options, int64_t seq_dim) {
  const char* op = "distribute_sequence";
  const int64_t dim = seq_dim < 0 ? seq_dim + global.dim() : seq_dim;
  DT_CHECK_ARG(dim >= 0 && dim < global.dim(), op, "sequence dim ", seq_dim, " is out of range for ", global.shape());
  const int cp = mesh.dim_index(options.mesh_dim);
  DT_CHECK_ARG(static_cast<int>(placements.size()) == mesh.ndim() &&
                   placements[static_cast<size_t>(cp)].normalized(global.dim()).is_shard(dim),
               op, "expected placements that shard the sequence dim ", dim, " over '", options.mesh_dim, "' of mesh ",
               mesh.to_string(), ", got ", placements_to_string(placements));
  const int64_t ranks = mesh.size(cp);
  if (!options.load_balanced || ranks == 1) return distribute(global, mesh, placements);
  const std::vector<int64_t> positions = load_balanced_positions(global.size(dim), ranks);
  const int64_t run = global.size(dim) / (2 * ranks);  // positions come in runs of one chunk
  Tensor ordered = Tensor::empty(global.shape(), global.dtype(), global.device());
  for (int64_t i = 0; i < global.size(dim); i += run) {
    ordered.narrow(dim, i, run).copy_(global.narrow(dim, positions[static_cast<size_t>(i)], run));
  }
  return distribute(ordered, mesh, placements);
}

}  // namespace dtensor::parallel
