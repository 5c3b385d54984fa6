// Redistribution plans: how a tensor moves from one placement list to another.
//
// The planner (placements/planner.cpp) searches the cheapest sequence of
// transforms, each one file under placements/:
//   per mesh dim:  S->R all_gather, P->R all_reduce, P->S reduce_scatter,
//                  R->S local chunk, S(i)->S(j) all_to_all, R->P and S->P local,
//                  P(sum)<->P(avg) local scaling;
//   whole mesh:    a block transfer (point-to-point, each rank sends exactly the
//                  elements another rank needs) between any two layouts without
//                  Partial, which moves the fewest bytes when several mesh dims
//                  change at once.
// Costs use the alpha-beta model (cost_model.h). Plans are cached.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/cost_model.h"
#include "dtensor/placement.h"

namespace dtensor {

class DeviceMesh;
class DistTensor;

enum class TransformKind : uint8_t {
  AllGather,       // S(d) -> R on one mesh dim
  AllReduce,       // P -> R
  ReduceScatter,   // P -> S(d)
  AllToAll,        // S(d) -> S(e)
  Chunk,           // R -> S(d), local
  ReplicateToPartial,  // R -> P, local
  ShardToPartial,  // S(d) -> P, local
  PartialToPartial,    // P(sum) <-> P(avg), local scaling
  BlockTransfer,   // any -> any without Partial, whole mesh, point-to-point
  CrossMesh,       // from one mesh to another over the same world, point-to-point
};
const char* transform_name(TransformKind kind);

struct RedistributeStep {
  TransformKind kind;
  int mesh_dim = -1;            // -1 for BlockTransfer
  Placements before, after;     // the whole placement list around this step
  // What this rank sends (the comm counters' bytes: the collective's input bytes
  // on this rank; for a block transfer the bytes of its sends).
  int64_t bytes_sent = 0;
  // Collective calls this step issues on this rank, by comm-counter kind.
  std::string collective;       // "all_gather", ..., "send" or "" for local steps
  int64_t collective_calls = 0;
  double predicted_seconds = 0;  // cost model, slowest rank
  std::string meshes;            // CrossMesh: "from front=2 to back=2"
  std::string to_string() const;
};

struct RedistributePlan {
  Placements from, to;
  std::vector<RedistributeStep> steps;
  double predicted_seconds = 0;
  // Bytes this rank sends over the whole plan.
  int64_t bytes_sent() const;
  // One line per step: "1. all_gather on mesh dim 0 (dp): S(0),S(1) -> R,S(1), sends 96 B, 3.1 us".
  std::string to_string() const;
};

// The plan redistribute() would run for a tensor of `shape` and `dtype` on `mesh`,
// seen from this rank. Needs no communication.
RedistributePlan explain_redistribute(const Placements& from, const Placements& to,
                                      const Shape& shape, const DeviceMesh& mesh,
                                      DType dtype = DType::F32);

// The same for a move between two meshes over one world
// (DistTensor::redistribute(mesh, placements)): the steps that resolve the
// source's Partials on the source mesh, the point-to-point transfer (what this rank
// sends), and the local steps that form the target's Partials. Seen from this rank;
// a rank outside a mesh issues nothing for that mesh's steps.
RedistributePlan explain_redistribute(const Placements& from, const DeviceMesh& from_mesh, const Placements& to,
                                      const DeviceMesh& to_mesh, const Shape& shape, DType dtype = DType::F32);

// A redistribution in flight (DistTensor::redistribute_async).
class PendingRedistribute {
 public:
  PendingRedistribute() = default;
  // Finishes the plan and returns the redistributed tensor; call once.
  DistTensor wait();
  bool is_first_step_completed() const;

  struct State;
  explicit PendingRedistribute(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dtensor
