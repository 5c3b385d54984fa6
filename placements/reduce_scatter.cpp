// Partial(op) -> Shard(d) on one mesh dim: reduce-scatter along d. The mesh dim
// becomes the innermost splitter of d, so it scatters the piece the others left.
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

class ReduceScatterTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::ReduceScatter; }

  void moves(const Placements& from, const Placements&, const Shape& mesh_shape, int64_t ndim,
             std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      if (mesh_shape[i] <= 1 || !from[i].is_partial()) continue;
      for (int64_t d = 0; d < ndim; ++d) {
        out.push_back({kind(), static_cast<int>(i), with_inner_shard(from, ndim, static_cast<int>(i), d)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    const int64_t bytes = max_local_bytes(ctx, ctx.from);
    return model.reduce_scatter(bytes, ctx.mesh.size(ctx.mesh_dim));
  }

  Footprint footprint(const StepContext& ctx) const override { return collective_footprint(ctx, "reduce_scatter"); }

  // Inline (synchronous) unless started asynchronously: see all_gather.cpp.
  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.to[m].dim();
    return reduce_scatter(ctx.mesh.group(m), local, ctx.from[m].reduce_op(), d,
                          chunk_sizes(local.size(d), ctx.mesh.size(m)));
  }

  StartedStep start(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.to[m].dim();
    const std::vector<int64_t> sizes = chunk_sizes(local.size(d), ctx.mesh.size(m));
    Shape out_shape = local.shape();
    out_shape[d] = sizes[ctx.mesh.coordinate(m)];
    Tensor out = Tensor::empty(out_shape, local.dtype(), local.device());
    Work work = reduce_scatter_async(ctx.mesh.group(m), local, out, ctx.from[m].reduce_op(), d, sizes);
    return in_flight(work, out);
  }
};

}  // namespace

const Transform& reduce_scatter_transform() {
  static const ReduceScatterTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
