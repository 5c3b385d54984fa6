// Shard(d) -> Partial(op) on one mesh dim, no communication: each coordinate
// places its shard where it belongs in the parent piece and fills the rest with the
// reduce op's identity (zeros for sum, -inf for max, +inf for min). For avg the
// shard is scaled by the dim size, so the average of the contributions is the value.
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

class ShardToPartialTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::ShardToPartial; }

  void moves(const Placements& from, const Placements& target, const Shape& mesh_shape,
             int64_t ndim, std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      const int m = static_cast<int>(i);
      if (mesh_shape[i] > 1 && from[i].is_shard() && target[i].is_partial() &&
          is_innermost(from, mesh_shape, ndim, m, from[i].dim())) {
        out.push_back({kind(), m, canonicalize(with_placement(from, m, target[i]), ndim)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    return model.local_copy(max_local_bytes(ctx, ctx.to));
  }

  Footprint footprint(const StepContext&) const override { return {}; }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.from[m].dim();
    const ReduceOp op = ctx.to[m].reduce_op();
    const Range parent = parent_range(ctx.global_shape, ctx.mesh.shape(), ctx.from,
                                      ctx.mesh.coordinate(), m, d);
    const Range piece = chunk_range(parent.length, ctx.mesh.size(m), ctx.mesh.coordinate(m));
    Shape out_shape = local.shape();
    out_shape[d] = parent.length;
    Tensor out = Tensor::full(out_shape, reduce_identity(op, local.dtype()), local.dtype(), local.device());
    const Tensor value = op == ReduceOp::Avg ? mul(local, static_cast<double>(ctx.mesh.size(m))) : local;
    out.narrow(d, piece.offset, piece.length).copy_(value);
    return out;
  }
};

}  // namespace

const Transform& shard_to_partial_transform() {
  static const ShardToPartialTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
