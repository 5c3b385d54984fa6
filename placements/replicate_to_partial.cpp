// Replicate -> Partial(op) on one mesh dim, no communication.
//
// For sum, coordinate 0 keeps the value and the others hold zeros, so the sum is
// the value. For avg, max and min every coordinate keeps the value: the average,
// maximum or minimum of equal values is that value.
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

class ReplicateToPartialTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::ReplicateToPartial; }

  void moves(const Placements& from, const Placements& target, const Shape& mesh_shape,
             int64_t ndim, std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      // Only towards a Partial the target asks for: a Partial nobody wants only
      // costs a reduction later.
      if (mesh_shape[i] > 1 && from[i].is_replicate() && target[i].is_partial()) {
        out.push_back({kind(), static_cast<int>(i), canonicalize(with_placement(from, static_cast<int>(i), target[i]), ndim)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    if (ctx.to[ctx.mesh_dim].reduce_op() != ReduceOp::Sum) return 0;
    return model.local_copy(max_local_bytes(ctx, ctx.to));
  }

  Footprint footprint(const StepContext&) const override { return {}; }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    if (ctx.to[m].reduce_op() != ReduceOp::Sum || ctx.mesh.coordinate(m) == 0) return local;
    return Tensor::zeros(local.shape(), local.dtype(), local.device());
  }
};

}  // namespace

const Transform& replicate_to_partial_transform() {
  static const ReplicateToPartialTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
