// Replicate -> Shard(d) on one mesh dim: keep this coordinate's chunk, no
// communication. The mesh dim becomes the innermost splitter of d.
//
// When the chunk is one contiguous run of the local buffer (every dim before d has
// a single element locally, e.g. d = 0, the outermost dim, as jax.device_put and
// torch's DTensor make it), the result is a view: no copy. It shares the replicated
// tensor's storage, so that whole buffer stays allocated, and counted in this
// rank's memory, until the last tensor holding it is gone: the replicated input
// and every view of it, this shard included. A caller that drops the replicated
// tensor and keeps a small shard for long can release the rest with
// shard.to_local().clone(). Other chunks (strided pieces) are copied, so they never
// keep the whole replicated tensor alive.
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

// The piece [offset, offset + length) of dim d is contiguous in a contiguous buffer
// of `shape` when every dim before d has one element.
bool piece_is_contiguous(const Shape& shape, int64_t d) {
  for (int64_t i = 0; i < d; ++i) {
    if (shape[static_cast<size_t>(i)] != 1) return false;
  }
  return true;
}

// Local shape before the step at the largest block (coordinate 0 everywhere).
Shape largest_local_shape(const StepContext& ctx) {
  const std::vector<int64_t> origin(static_cast<size_t>(ctx.mesh.ndim()), 0);
  Shape shape;
  for (const Range& r : local_block(ctx.global_shape, ctx.mesh.shape(), ctx.from, origin)) shape.push_back(r.length);
  return shape;
}

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
    const int64_t d = ctx.to[static_cast<size_t>(ctx.mesh_dim)].dim();
    if (piece_is_contiguous(largest_local_shape(ctx), d)) return 0.0;  // a view
    return model.local_copy(max_local_bytes(ctx, ctx.to));
  }

  Footprint footprint(const StepContext&) const override { return {}; }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.to[m].dim();
    const Range piece = chunk_range(local.size(d), ctx.mesh.size(m), ctx.mesh.coordinate(m));
    const Tensor view = local.narrow(d, piece.offset, piece.length);
    if (local.is_contiguous() && piece_is_contiguous(local.shape(), d)) return view;
    // A strided piece is copied, so it does not keep the whole replicated tensor alive.
    return view.clone();
  }
};

}  // namespace

const Transform& chunk_transform() {
  static const ChunkTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
