// The redistribution planner (internal): the cheapest sequence of transforms from
// one layout to another, cached by (layouts, shape, mesh shape, dtype, backend).
#pragma once

#include <memory>

#include "placements/transform.h"

namespace dtensor::redistribution {

struct PlannedStep {
  TransformKind kind;
  int mesh_dim = -1;
  Placements before, after;
  double predicted_seconds = 0;
};

struct Plan {
  std::vector<PlannedStep> steps;
  double predicted_seconds = 0;
};

// `from` and `to` must be validated (validate_placements). Identical on every rank
// (costs are computed for the slowest rank, never for this one), so all ranks run
// the same collectives in the same order.
std::shared_ptr<const Plan> find_plan(const Placements& from, const Placements& to,
                                      const Shape& shape, const DeviceMesh& mesh, DType dtype);

size_t plan_cache_size();
void clear_plan_cache();

}  // namespace dtensor::redistribution
