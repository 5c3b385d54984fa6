// Any layout -> any layout with the same Partial mesh dims, in one point-to-point
// exchange over the whole mesh.
//
// Every rank's block before and after is known everywhere (local_block), so each
// rank sends every other rank exactly the intersection of what it holds with what
// the other needs, and nothing else. When a block is replicated (or partial) over
// some mesh dims, several ranks hold it; the sender for receiver q is the holder
// that agrees with q on every mesh dim that does not shard the source, so partial
// values never mix across partial coordinates and a rank that already holds what
// it needs copies it locally. This is the path for changes on several mesh dims at
// once, e.g. (S(0),S(1)) -> (S(1),S(0)), where per-dim collectives would first
// have to gather.
#include <algorithm>

#include "mesh/mesh_index.h"
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

using mesh_index::coordinate_of;

using Block = std::vector<Range>;

// Does the holder at `sender` serve receiver `receiver`? Only when they agree on
// every mesh dim that does not shard the source layout.
bool serves(const std::vector<int64_t>& sender, const std::vector<int64_t>& receiver,
            const Placements& from, const Shape& mesh_shape) {
  for (size_t i = 0; i < mesh_shape.size(); ++i) {
    const bool splits = from[i].is_shard() && mesh_shape[i] > 1;
    if (!splits && sender[i] != receiver[i]) return false;
  }
  return true;
}

struct Traffic {
  int64_t bytes = 0;        // sent to other ranks
  int64_t peers = 0;
  int64_t local_bytes = 0;  // kept and copied into the new local tensor
};

// Every rank's block under `placements`, by row-major mesh index.
std::vector<Block> all_blocks(const StepContext& ctx, const Placements& placements) {
  const Shape& mesh_shape = ctx.mesh.shape();
  std::vector<Block> blocks;
  blocks.reserve(static_cast<size_t>(shape_numel(mesh_shape)));
  for (int64_t r = 0; r < shape_numel(mesh_shape); ++r) {
    blocks.push_back(local_block(ctx.global_shape, mesh_shape, placements, coordinate_of(r, mesh_shape)));
  }
  return blocks;
}

int64_t intersection_numel(const Block& a, const Block& b) {
  int64_t n = 1;
  for (size_t d = 0; d < a.size() && n > 0; ++d) {
    n *= std::max<int64_t>(std::min(a[d].end(), b[d].end()) - std::max(a[d].offset, b[d].offset), 0);
  }
  return n;
}

// What mesh rank `me` sends to other ranks, given every rank's block before and
// after (the planner prices a block transfer for every rank, so the blocks are
// computed once per step rather than once per pair).
Traffic sends_of(int64_t me, const StepContext& ctx, const std::vector<Block>& before,
                 const std::vector<Block>& after) {
  const Shape& mesh_shape = ctx.mesh.shape();
  const std::vector<int64_t> my_coordinate = coordinate_of(me, mesh_shape);
  Traffic traffic;
  for (int64_t q = 0; q < shape_numel(mesh_shape); ++q) {
    if (!serves(my_coordinate, coordinate_of(q, mesh_shape), ctx.from, mesh_shape)) continue;
    const int64_t n = intersection_numel(before[static_cast<size_t>(me)], after[static_cast<size_t>(q)]);
    if (q == me) {
      // A block that stays whole is kept, not copied (apply).
      const bool kept = before[static_cast<size_t>(me)] == after[static_cast<size_t>(me)];
      traffic.local_bytes = kept ? 0 : n * static_cast<int64_t>(dtype_size(ctx.dtype));
    } else if (n > 0) {
      traffic.bytes += n * static_cast<int64_t>(dtype_size(ctx.dtype));
      ++traffic.peers;
    }
  }
  return traffic;
}

class BlockTransferTransform final : public Transform {
 public:
  TransformKind kind() const override { return TransformKind::BlockTransfer; }

  void moves(const Placements& from, const Placements& target, const Shape& mesh_shape,
             int64_t ndim, std::vector<Move>& out) const override {
    // Towards the target with this layout's Partial dims kept as they are (and the
    // target's other Partial dims replicated, to be re-partitioned locally after).
    Placements next = target;
    for (size_t i = 0; i < next.size(); ++i) {
      if (from[i].is_partial()) {
        next[i] = from[i];
      } else if (next[i].is_partial()) {
        next[i] = Replicate();
      }
    }
    next = canonicalize(next, ndim);
    // A change on one mesh dim is that dim's collective (all_gather, all_to_all...);
    // the block transfer is for changes on several mesh dims at once.
    int changed = 0;
    for (size_t i = 0; i < next.size(); ++i) changed += mesh_shape[i] > 1 && !(next[i] == from[i]);
    if (changed >= 2 && layout_key(next, mesh_shape, ndim) != layout_key(from, mesh_shape, ndim)) {
      out.push_back({kind(), -1, next});
    }
  }

  double predict(const StepContext& ctx, const CostModel& model) const override {
    const std::vector<Block> before = all_blocks(ctx, ctx.from), after = all_blocks(ctx, ctx.to);
    Traffic worst;
    for (int64_t r = 0; r < ctx.mesh.size(); ++r) {
      const Traffic t = sends_of(r, ctx, before, after);
      worst.bytes = std::max(worst.bytes, t.bytes);
      worst.peers = std::max(worst.peers, t.peers);
      worst.local_bytes = std::max(worst.local_bytes, t.local_bytes);
    }
    // Received blocks land in place; only what a rank keeps is copied locally.
    return model.point_to_point(worst.bytes, worst.peers) + model.local_copy(worst.local_bytes);
  }

  Footprint footprint(const StepContext& ctx) const override {
    const Traffic t = sends_of(ctx.mesh.linear_index(), ctx, all_blocks(ctx, ctx.from), all_blocks(ctx, ctx.to));
    return {"send", t.peers, t.bytes};
  }

  Tensor apply(const Tensor& local, const StepContext& ctx) const override {
    const Shape& mesh_shape = ctx.mesh.shape();
    const std::vector<int64_t>& me = ctx.mesh.coordinate();
    const Block mine_before = local_block(ctx.global_shape, mesh_shape, ctx.from, me);
    const Block mine_after = local_block(ctx.global_shape, mesh_shape, ctx.to, me);
    Shape out_shape;
    for (const Range& r : mine_after) out_shape.push_back(r.length);
    // A rank whose block does not change (the diagonal of a 2x2 swap) keeps its
    // tensor: the result shares its storage, as a chunk view does (chunk.cpp), and
    // nothing arrives for it (only its own block serves it).
    const bool keeps_block = mine_before == mine_after && local.is_contiguous();
    Tensor out = keeps_block ? local : Tensor::empty(out_shape, local.dtype(), local.device());

    std::vector<P2POp> ops;
    std::vector<std::pair<Tensor, Block>> received;
    for (int64_t q = 0; q < shape_numel(mesh_shape); ++q) {
      const std::vector<int64_t> other = coordinate_of(q, mesh_shape);
      // What I send to `other` (or copy to myself).
      if (serves(me, other, ctx.from, mesh_shape)) {
        const Block part = intersect_blocks(mine_before, local_block(ctx.global_shape, mesh_shape, ctx.to, other));
        if (ranges_numel(part) > 0) {
          const Tensor piece = block_view(local, mine_before, part);
          if (other == me) {
            if (!keeps_block) block_view(out, mine_after, part).copy_(piece);
          } else {
            ops.push_back(P2POp::send(piece.contiguous(), static_cast<int>(q)));
          }
        }
      }
      // What `other` sends me.
      if (other != me && serves(other, me, ctx.from, mesh_shape)) {
        const Block part = intersect_blocks(local_block(ctx.global_shape, mesh_shape, ctx.from, other), mine_after);
        if (ranges_numel(part) > 0) {
          // Straight into the output when the part is one contiguous run of it (a
          // whole block moving between owners), else through a buffer.
          Tensor target = block_view(out, mine_after, part);
          if (target.is_contiguous()) {
            ops.push_back(P2POp::recv(target, static_cast<int>(q)));
          } else {
            Tensor buffer = Tensor::empty(target.shape(), local.dtype(), local.device());
            ops.push_back(P2POp::recv(buffer, static_cast<int>(q)));
            received.emplace_back(buffer, part);
          }
        }
      }
    }
    if (!ops.empty()) batch_send_recv(ctx.mesh.group(), ops);
    for (const auto& [buffer, part] : received) block_view(out, mine_after, part).copy_(buffer);
    return out;
  }
};

}  // namespace

const Transform& block_transfer_transform() {
  static const BlockTransferTransform transform;
  return transform;
}

}  // namespace dtensor::redistribution
