// Replicate -> Shard(d) on one mesh dim: keep this coordinate's chunk, no
// communication. The mesh dim becomes the innermost splitter of d.
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

class ChunkTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::Chunk; }

  void moves(const Placements& from, const Placements&, const Shape& mesh_shape, int64_t ndim,
             std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      if (mesh_shape[i] <= 1 || !from[i].is_replicate()) continue;
      for (int64_t d = 0; d < ndim; ++d) {
        out.push_back({kind(), static_cast<int>(i), with_inner_shard(from, ndim, static_cast<int>(i), d)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    return model.local_copy(max_local_bytes(ctx, ctx.to));
  }

  Footprint footprint(const StepContext&) const override { return {}; }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.to[m].dim();
    const Range piece = chunk_range(local.size(d), ctx.mesh.size(m), ctx.mesh.coordinate(m));
    // A copy, so the piece does not keep the whole replicated tensor alive.
    return local.narrow(d, piece.offset, piece.length).clone();
  }
};

}  // namespace

const Transform& chunk_transform() {
  static const ChunkTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
