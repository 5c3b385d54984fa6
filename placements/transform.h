// The interface of one redistribution transform (internal), and the layout helpers
// the transforms share.
//
// A transform knows (1) which moves it offers from a layout, (2) what a move costs
// under the alpha-beta model for the slowest rank, (3) what this rank will issue
// (for explain_redistribute and the comm counters), and (4) how to run it on this
// rank's local tensor. The planner (planner.cpp) composes them; each lives in its
// own file and is listed once in registry.cpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dtensor/cost_model.h"
#include "dtensor/device_mesh.h"
#include "dtensor/group.h"
#include "dtensor/placement.h"
#include "dtensor/redistribute.h"
#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"

namespace dtensor::redistribution {

// A candidate step: run `kind` on `mesh_dim` (-1: whole mesh) to reach `after`.
struct Move {
  TransformKind kind;
  int mesh_dim = -1;
  Placements after;
};

// Everything a transform needs to know about one step.
struct StepContext {
  const DeviceMesh& mesh;
  const Shape& global_shape;
  DType dtype;
  const Placements& from;
  const Placements& to;
  int mesh_dim;  // -1 for whole-mesh transforms
};

// What this rank issues in one step, in the comm counters' terms.
struct Footprint {
  std::string collective;  // "" for local steps
  int64_t calls = 0;
  int64_t bytes_sent = 0;
};

// A step whose communication is in flight; finish() waits and returns the result.
struct StartedStep {
  Work work;
  std::function<Tensor()> finish;
};

class Transform {
 public:
  virtual ~Transform() = default;
  virtual TransformKind kind() const = 0;
  // Moves from `from` (the layout the planner is at) towards `target`.
  virtual void moves(const Placements& from, const Placements& target, const Shape& mesh_shape,
                     int64_t tensor_ndim, std::vector<Move>& out) const = 0;
  // Seconds for the slowest rank.
  virtual double predict(const StepContext& ctx, const CostModel& model) const = 0;
  virtual Footprint footprint(const StepContext& ctx) const = 0;
  virtual Tensor apply(const Tensor& local, const StepContext& ctx) const = 0;
  // Starts the step; by default runs it at once. Collective steps override this to
  // return with their communication in flight.
  virtual StartedStep start(const Tensor& local, const StepContext& ctx) const {
    Tensor out = apply(local, ctx);
    return {Work(), [out] { return out; }};
  }
};

const std::vector<const Transform*>& all_transforms();
const Transform& transform_for(TransformKind kind);

// ---- layout helpers (layout.cpp) ----------------------------------------------------

// Reassigns shard orders to the smallest values that keep each tensor dim's nesting
// (outermost first), so equal layouts compare equal.
Placements canonicalize(const Placements& placements, int64_t tensor_ndim);
// A key equal for layouts that hold the same data on every rank (size-1 mesh dims
// do not split, so their nesting position does not count).
std::string layout_key(const Placements& placements, const Shape& mesh_shape, int64_t tensor_ndim);
// Mesh dim `mesh_dim` is the innermost splitter (among mesh dims of size > 1) of
// tensor dim `tensor_dim`.
bool is_innermost(const Placements& placements, const Shape& mesh_shape, int64_t tensor_ndim,
                  int mesh_dim, int64_t tensor_dim);
// `placements` with mesh dim `mesh_dim` set to Shard(tensor_dim) as the innermost
// splitter of that tensor dim (canonicalized).
Placements with_inner_shard(const Placements& placements, int64_t tensor_ndim, int mesh_dim,
                            int64_t tensor_dim);
Placements with_placement(const Placements& placements, int mesh_dim, const Placement& p);
// Partial ops that may coexist: all equal, or all in {sum, avg}.
bool partials_compatible(const Placements& placements);

// The range along `tensor_dim` that mesh dim `mesh_dim` splits at `coordinate`:
// the piece the other splitters leave (mesh_dim must be innermost or not split it).
Range parent_range(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                   const std::vector<int64_t>& coordinate, int mesh_dim, int64_t tensor_dim);
// Local shape at the largest block (coordinate 0 everywhere: the chunk rule gives
// the first pieces the most elements), used for the slowest rank's cost.
int64_t max_local_numel(const Shape& global_shape, const Shape& mesh_shape,
                        const Placements& placements);
int64_t ranges_numel(const std::vector<Range>& block);
// The common part of two blocks (empty ranges where they do not meet).
std::vector<Range> intersect_blocks(const std::vector<Range>& a, const std::vector<Range>& b);
// The view of sub-block `part` of `t`, which holds block `held` of the global tensor.
Tensor block_view(const Tensor& t, const std::vector<Range>& held, const std::vector<Range>& part);
// Bytes of the largest local block under `placements` (the slowest rank's size).
int64_t max_local_bytes(const StepContext& ctx, const Placements& placements);
// What a one-collective step issues on this rank: `collective` once, with this
// rank's input bytes (the comm counters' convention).
Footprint collective_footprint(const StepContext& ctx, const char* collective);
// A step whose result `out` is ready once `work` completes.
StartedStep in_flight(Work work, Tensor out);

// The reduce op's identity (0 for sum/avg, lowest/highest value for max/min).
double reduce_identity(ReduceOp op, DType dtype);

}  // namespace dtensor::redistribution
