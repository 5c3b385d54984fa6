// Shard(d) -> Replicate on one mesh dim: all-gather the pieces along d.
//
// Only the innermost splitter of d can be gathered: its pieces are consecutive
// slices of the parent piece, so concatenating them in coordinate order rebuilds
// it. (Gathering an outer splitter would interleave blocks.) Uneven pieces are
// gathered with their exact sizes; nothing is padded in the local tensors.
#include <numeric>

#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

class AllGatherTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::AllGather; }

  void moves(const Placements& from, const Placements&, const Shape& mesh_shape, int64_t ndim,
             std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      const int m = static_cast<int>(i);
      if (mesh_shape[i] > 1 && from[i].is_shard() &&
          is_innermost(from, mesh_shape, ndim, m, from[i].dim())) {
        out.push_back({kind(), m, canonicalize(with_placement(from, m, Replicate()), ndim)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    const int64_t out_bytes = max_local_bytes(ctx, ctx.to);
    return model.all_gather(out_bytes, ctx.mesh.size(ctx.mesh_dim));
  }

  Footprint footprint(const StepContext& ctx) const override { return collective_footprint(ctx, "all_gather"); }

  // Synchronous collectives run inline on the calling rank; the async forms hand the
  // call to the group's progress thread, which costs a thread wake-up per call.
  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.from[m].dim();
    return all_gather(ctx.mesh.group(m), local, d, sizes(ctx, d));
  }

  StartedStep start(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.from[m].dim();
    const std::vector<int64_t> pieces = sizes(ctx, d);
    Shape out_shape = local.shape();
    out_shape[d] = std::accumulate(pieces.begin(), pieces.end(), int64_t{0});
    Tensor out = Tensor::empty(out_shape, local.dtype(), local.device());
    return in_flight(all_gather_async(ctx.mesh.group(m), local, out, d, pieces), out);
  }

 private:
  // The pieces of d's parent range, one per coordinate of the mesh dim.
  static std::vector<int64_t> sizes(const StepContext& ctx, int64_t d) {
    const int m = ctx.mesh_dim;
    const Range parent = parent_range(ctx.global_shape, ctx.mesh.shape(), ctx.from, ctx.mesh.coordinate(), m, d);
    return chunk_sizes(parent.length, ctx.mesh.size(m));
  }
};

}  // namespace

const Transform& all_gather_transform() {
  static const AllGatherTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
