// Partial(op) -> Replicate on one mesh dim: all-reduce with op.
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

class AllReduceTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::AllReduce; }

  void moves(const Placements& from, const Placements&, const Shape& mesh_shape, int64_t ndim,
             std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      if (mesh_shape[i] > 1 && from[i].is_partial()) {
        const int m = static_cast<int>(i);
        out.push_back({kind(), m, canonicalize(with_placement(from, m, Replicate()), ndim)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    const int64_t bytes = max_local_bytes(ctx, ctx.from);
    return model.all_reduce(bytes, ctx.mesh.size(ctx.mesh_dim));
  }

  Footprint footprint(const StepContext& ctx) const override { return collective_footprint(ctx, "all_reduce"); }

  // Inline (synchronous) unless started asynchronously: see all_gather.cpp.
  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    return all_reduce(ctx.mesh.group(ctx.mesh_dim), local, ctx.from[ctx.mesh_dim].reduce_op());
  }

  StartedStep start(const Tensor& local, const StepContext& ctx) const override {
    Tensor out = Tensor::empty(local.shape(), local.dtype(), local.device());
    Work work = all_reduce_async(ctx.mesh.group(ctx.mesh_dim), local, out,
                                 ctx.from[ctx.mesh_dim].reduce_op());
    return in_flight(work, out);
  }
};

}  // namespace

const Transform& all_reduce_transform() {
  static const AllReduceTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
