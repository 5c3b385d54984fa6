// The cross-mesh move (cross_mesh.h): piece assignment, exchange and cost.
#include "placements/cross_mesh.h"

#include <algorithm>

#include "mesh/mesh_index.h"
#include "placements/transform.h"

namespace dtensor::redistribution {
namespace {

using Block = std::vector<Range>;
using mesh_index::coordinate_of;

Block block_at(const Shape& global_shape, const CrossMeshLayout& layout, int64_t index) {
  const Shape& mesh_shape = layout.mesh.shape();
  return local_block(global_shape, mesh_shape, layout.placements, coordinate_of(index, mesh_shape));
}

// The source's distinct blocks and, for each, its holders (world ranks) in mesh order.
struct Holders {
  Block block;
  std::vector<int> ranks;
};

std::vector<Holders> distinct_blocks(const Shape& global_shape, const CrossMeshLayout& layout) {
  std::vector<Holders> out;
  const std::vector<int>& ranks = layout.mesh.ranks();
  for (int64_t i = 0; i < layout.mesh.size(); ++i) {
    const Block b = block_at(global_shape, layout, i);
    auto it = std::find_if(out.begin(), out.end(), [&](const Holders& h) { return h.block == b; });
    if (it == out.end()) {
      out.push_back({b, {}});
      it = out.end() - 1;
    }
    it->ranks.push_back(ranks[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace

std::vector<CrossMeshPiece> cross_mesh_pieces(const Shape& global_shape, const CrossMeshLayout& from,
                                              const CrossMeshLayout& to) {
  const std::vector<Holders> sources = distinct_blocks(global_shape, from);
  std::vector<CrossMeshPiece> pieces;
  const std::vector<int>& receivers = to.mesh.ranks();
  for (int64_t j = 0; j < to.mesh.size(); ++j) {
    const int receiver = receivers[static_cast<size_t>(j)];
    const Block needed = block_at(global_shape, to, j);
    for (const Holders& source : sources) {
      Block part = intersect_blocks(needed, source.block);
      if (ranges_numel(part) == 0) continue;
      const bool holds = std::find(source.ranks.begin(), source.ranks.end(), receiver) != source.ranks.end();
      const int sender = holds ? receiver : source.ranks[static_cast<size_t>(j) % source.ranks.size()];
      pieces.push_back({sender, receiver, std::move(part)});
    }
  }
  return pieces;
}

Tensor cross_mesh_transfer(const Tensor& local, DType dtype, const Shape& global_shape, const CrossMeshLayout& from,
                           const CrossMeshLayout& to) {
  const Group& world = from.mesh.world();
  const int me = world.rank();
  const bool sends = from.mesh.is_member(), receives = to.mesh.is_member();
  const Device device = local.defined() ? local.device() : Device::cpu();
  Block held, wanted;
  if (sends) held = local_block(global_shape, from.mesh.shape(), from.placements, from.mesh.coordinate());
  Tensor out = Tensor::empty({0}, dtype, device);
  if (receives) {
    wanted = local_block(global_shape, to.mesh.shape(), to.placements, to.mesh.coordinate());
    Shape shape;
    for (const Range& r : wanted) shape.push_back(r.length);
    out = Tensor::empty(shape, dtype, device);
  }
  if (!sends && !receives) return out;
  std::vector<P2POp> ops;
  std::vector<std::pair<Tensor, Block>> buffered;
  for (const CrossMeshPiece& piece : cross_mesh_pieces(global_shape, from, to)) {
    if (piece.sender == me && piece.receiver == me) {
      block_view(out, wanted, piece.block).copy_(block_view(local, held, piece.block));
    } else if (piece.sender == me) {
      ops.push_back(P2POp::send(block_view(local, held, piece.block).contiguous(), piece.receiver));
    } else if (piece.receiver == me) {
      // Straight into place when the piece is one contiguous run of the output.
      Tensor target = block_view(out, wanted, piece.block);
      if (target.is_contiguous()) {
        ops.push_back(P2POp::recv(target, piece.sender));
      } else {
        Tensor buffer = Tensor::empty(target.shape(), dtype, device);
        ops.push_back(P2POp::recv(buffer, piece.sender));
        buffered.emplace_back(buffer, piece.block);
      }
    }
  }
  if (!ops.empty()) batch_send_recv(world, ops);
  for (const auto& [buffer, block] : buffered) block_view(out, wanted, block).copy_(buffer);
  return out;
}

CrossMeshCost cross_mesh_cost(DType dtype, const Shape& global_shape, const CrossMeshLayout& from,
                              const CrossMeshLayout& to, const CostModel& model) {
  const int64_t element = static_cast<int64_t>(dtype_size(dtype));
  const int me = from.mesh.world().rank();
  struct Load {
    int64_t bytes = 0, messages = 0, local_bytes = 0;
  };
  std::vector<Load> load(static_cast<size_t>(from.mesh.world().size()));
  for (const CrossMeshPiece& piece : cross_mesh_pieces(global_shape, from, to)) {
    Load& l = load[static_cast<size_t>(piece.sender)];
    const int64_t bytes = ranges_numel(piece.block) * element;
    if (piece.sender == piece.receiver) {
      l.local_bytes += bytes;
    } else {
      l.bytes += bytes;
      ++l.messages;
    }
  }
  Load worst;
  for (const Load& l : load) {
    worst.bytes = std::max(worst.bytes, l.bytes);
    worst.messages = std::max(worst.messages, l.messages);
    worst.local_bytes = std::max(worst.local_bytes, l.local_bytes);
  }
  const Load& mine = load[static_cast<size_t>(me)];
  return {mine.bytes, mine.messages,
          model.point_to_point(worst.bytes, worst.messages) + model.local_copy(worst.local_bytes)};
}

}  // namespace dtensor::redistribution
