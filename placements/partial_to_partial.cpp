// Partial(sum) <-> Partial(avg) on one mesh dim: a local scaling. With n
// coordinates, sum(x) = avg(n * x) and avg(x) = sum(x / n). Other changes of the
// reduce op (max to sum, ...) are not linear: the planner reduces first (P -> R)
// and then re-partitions (R -> P).
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

bool linear(ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Avg; }

class PartialToPartialTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::PartialToPartial; }

  void moves(const Placements& from, const Placements& target, const Shape& mesh_shape,
             int64_t ndim, std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      if (mesh_shape[i] > 1 && from[i].is_partial() && target[i].is_partial() &&
          from[i].reduce_op() != target[i].reduce_op() && linear(from[i].reduce_op()) &&
          linear(target[i].reduce_op())) {
        out.push_back({kind(), static_cast<int>(i), canonicalize(with_placement(from, static_cast<int>(i), target[i]), ndim)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    return model.local_copy(max_local_bytes(ctx, ctx.to));
  }

  Footprint footprint(const StepContext&) const override { return {}; }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const double n = static_cast<double>(ctx.mesh.size(ctx.mesh_dim));
    return ctx.to[ctx.mesh_dim].reduce_op() == ReduceOp::Avg ? mul(local, n) : div(local, n);
  }
};

}  // namespace

const Transform& partial_to_partial_transform() {
  static const PartialToPartialTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
