// Moving a tensor between two meshes over one world (internal): which rank sends
// which block to which, and the point-to-point exchange that does it.
//
// Both layouts are without Partial (DistTensor::redistribute resolves Partials on
// the source mesh first and re-partitions on the target after). Every rank of the
// source holds its block of the global tensor; every rank of the target needs its
// block; each needed block is cut along the source's distinct blocks, and each
// piece is sent by exactly one holder: the receiver itself when it holds the piece
// (a local copy), otherwise the holders of a replicated block take turns by the
// receiver's mesh index, which spreads the sends over the replicas. Ranks in
// neither mesh take no part.
#pragma once

#include <vector>

#include "dtensor/cost_model.h"
#include "dtensor/device_mesh.h"
#include "dtensor/placement.h"

namespace dtensor::redistribution {

struct CrossMeshLayout {
  const DeviceMesh& mesh;
  const Placements& placements;  // normalized, without Partial
};

// One block moving from a source rank to a target rank (world ranks; equal for a
// local copy). `block` holds global index ranges, one per tensor dim.
struct CrossMeshPiece {
  int sender = 0;
  int receiver = 0;
  std::vector<Range> block;
};

// Every piece of the move, identical on every rank (a pure function of the
// meshes' ranks and shapes, the placements and the global shape).
std::vector<CrossMeshPiece> cross_mesh_pieces(const Shape& global_shape, const CrossMeshLayout& from,
                                              const CrossMeshLayout& to);

// Runs the move on this rank: `local` is its block under `from` (ignored when it is
// not in the source mesh); returns its block under `to` (an empty {0} tensor when
// it is not in the target mesh). One batch of sends and receives over the world.
Tensor cross_mesh_transfer(const Tensor& local, DType dtype, const Shape& global_shape, const CrossMeshLayout& from,
                           const CrossMeshLayout& to);

// What this rank sends (bytes, messages) and the slowest rank's predicted time.
struct CrossMeshCost {
  int64_t bytes_sent = 0;
  int64_t messages = 0;
  double predicted_seconds = 0;
};
CrossMeshCost cross_mesh_cost(DType dtype, const Shape& global_shape, const CrossMeshLayout& from,
                              const CrossMeshLayout& to, const CostModel& model);

}  // namespace dtensor::redistribution
