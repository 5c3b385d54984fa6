// Shard(d) -> Shard(e) on one mesh dim: all-to-all.
//
// Before, coordinate c holds piece c of d's parent range and all of e's parent
// range; after, all of d's and piece c of e's. Rank c cuts its tensor along e into
// the n pieces of the chunk rule and sends piece j to coordinate j; it receives from
// j the j-th piece along d, cut to its own piece along e, and stacks them along d.
// The mesh dim must be the innermost splitter of d and becomes that of e.
#include <algorithm>
#include <functional>
#include <numeric>

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
    // are local copies on top of the exchange.
    const int copies = (ctx.to[m].dim() != 0) + (ctx.from[m].dim() != 0);
    return model.all_to_all(bytes, ctx.mesh.size(m)) + copies * model.local_copy(bytes);
  }

  Footprint footprint(const StepContext& ctx) const override { return collective_footprint(ctx, "all_to_all"); }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const int m = ctx.mesh_dim;
    const int64_t d = ctx.from[m].dim(), e = ctx.to[m].dim();
    const int64_t n = ctx.mesh.size(m), me = ctx.mesh.coordinate(m);
    const std::vector<int64_t> d_sizes = chunk_sizes(
        parent_range(ctx.global_shape, ctx.mesh.shape(), ctx.from, ctx.mesh.coordinate(), m, d).length, n);
    const std::vector<int64_t> e_sizes = chunk_sizes(local.size(e), n);

    // Pack: the pieces along e, each made contiguous, one after another.
    std::vector<Tensor> send_pieces = local.split(e_sizes, e);
    std::vector<int64_t> send_counts, recv_counts;
    int64_t send_total = 0, recv_total = 0;
    Shape recv_piece = local.shape();
    recv_piece[e] = e_sizes[me];
    for (int64_t j = 0; j < n; ++j) {
      send_counts.push_back(send_pieces[j].numel());
      send_total += send_counts.back();
      recv_piece[d] = d_sizes[j];
      recv_counts.push_back(shape_numel(recv_piece));
      recv_total += recv_counts.back();
    }
    // When e is the outermost dim the pieces are consecutive rows: send as they are.
    Tensor send = e == 0 ? local.contiguous().view({-1}) : Tensor::empty({send_total}, local.dtype(), local.device());
    int64_t offset = 0;
    for (int64_t j = 0; j < n && e != 0; ++j) {
      send.narrow(0, offset, send_counts[j]).view(send_pieces[j].shape()).copy_(send_pieces[j]);
      offset += send_counts[j];
    }
    Shape out_shape = local.shape();
    out_shape[d] = std::accumulate(d_sizes.begin(), d_sizes.end(), int64_t{0});
    out_shape[e] = e_sizes[me];
    Tensor out = Tensor::empty(out_shape, local.dtype(), local.device());
    // When d is the outermost dim, the piece from coordinate j is a contiguous block
    // of rows of the output: receive straight into it.
    // Equal pieces everywhere is a group-wide fact (the sizes come from the global
    // shape), so the call can go without split sizes: the equal-split routine.
    const bool equal = std::adjacent_find(d_sizes.begin(), d_sizes.end(), std::not_equal_to<>()) == d_sizes.end() &&
                       std::adjacent_find(e_sizes.begin(), e_sizes.end(), std::not_equal_to<>()) == e_sizes.end();
    const std::vector<int64_t> no_sizes;
    const std::vector<int64_t>& recv_splits = equal ? no_sizes : recv_counts;
    const std::vector<int64_t>& send_splits = equal ? no_sizes : send_counts;
    if (d == 0) {
      all_to_all_into(ctx.mesh.group(m), send, out.view({-1}), recv_splits, send_splits);
      return out;
    }
    Tensor recv = all_to_all(ctx.mesh.group(m), send, recv_splits, send_splits);

    // Unpack: piece j is this rank's e-piece of coordinate j's d-piece.
    offset = 0;
    int64_t row = 0;
    for (int64_t j = 0; j < n; ++j) {
      recv_piece[d] = d_sizes[j];
      out.narrow(d, row, d_sizes[j]).copy_(recv.narrow(0, offset, recv_counts[j]).view(recv_piece));
      offset += recv_counts[j];
      row += d_sizes[j];
    }
    return out;
  }
};

}  // namespace

const Transform& all_to_all_transform() {
  static const AllToAllTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
