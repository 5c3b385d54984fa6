// Shard(d) -> Shard(e) on one mesh dim: all-to-all.
//
// Before, coordinate c holds piece c of d's parent range and all of e's parent
// range; after, all of d's and piece c of e's. Rank c cuts its tensor along e into
// the n pieces of the chunk rule and sends piece j to coordinate j; it receives from
// j the j-th piece along d, cut to its own piece along e, and stacks them along d.
// The mesh dim must be the innermost splitter of d and becomes that of e.
#include <numeric>

#include "comm/block_all_to_all.h"
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

class AllToAllTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::AllToAll; }

  void moves(const Placements& from, const Placements&, const Shape& mesh_shape, int64_t ndim,
             std::vector<Move>& out) const override {
    for (size_t i = 0; i < from.size(); ++i) {
      const int m = static_cast<int>(i);
      if (mesh_shape[i] <= 1 || !from[i].is_shard() ||
          !is_innermost(from, mesh_shape, ndim, m, from[i].dim())) {
        continue;
      }
      for (int64_t e = 0; e < ndim; ++e) {
        if (e != from[i].dim()) out.push_back({kind(), m, with_inner_shard(from, ndim, m, e)});
      }
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    const int64_t bytes = max_local_bytes(ctx, ctx.from);
    const int m = ctx.mesh_dim;
    // Packing strided pieces (e is not the outer dim) and unpacking them (d is not)
    // are local copies on top of the exchange, unless the backend moves strided
    // blocks in place.
    const int copies = model.strided_all_to_all ? 0 : (ctx.to[m].dim() != 0) + (ctx.from[m].dim() != 0);
    // Every backend also copies the piece a rank keeps (1/n of its tensor) into the
    // output; without it a chunk to the outermost dim plus an all-to-all priced
    // below a local strided chunk, and R -> S(1) exchanged data it already had.
    const int64_t n = ctx.mesh.size(m);
    return model.all_to_all(bytes, n) + model.local_copy(bytes / n) + copies * model.local_copy(bytes);
  }

  Footprint footprint(const StepContext& ctx) const override { return collective_footprint(ctx, "all_to_all"); }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.from[m].dim(), e = ctx.to[m].dim();
    const int64_t n = ctx.mesh.size(m), me = ctx.mesh.coordinate(m);
    const std::vector<int64_t> d_sizes = chunk_sizes(
        parent_range(ctx.global_shape, ctx.mesh.shape(), ctx.from, ctx.mesh.coordinate(), m, d).length, n);
    const std::vector<int64_t> e_sizes = chunk_sizes(local.size(e), n);

    Shape out_shape = local.shape();
    out_shape[d] = std::accumulate(d_sizes.begin(), d_sizes.end(), int64_t{0});
    out_shape[e] = e_sizes[me];
    const Tensor in = local.contiguous();
    Tensor out = Tensor::empty(out_shape, local.dtype(), local.device());
    // Piece j of the input is its j-th chunk along e; piece j of the output the rows
    // along d that coordinate j held. Both are strided blocks (unless e, resp. d, is
    // the outermost dim); the backends exchange them where they lie.
    comm::all_to_all_blocks(ctx.mesh.group(m), in, comm::blocks_along(in, e, e_sizes), out,
                            comm::blocks_along(out, d, d_sizes));
    return out;
  }
};

}  // namespace

const Transform& all_to_all_transform() {
  static const AllToAllTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
