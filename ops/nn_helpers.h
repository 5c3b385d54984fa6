// Helpers shared by the neural-network op families (internal): ops whose local
// kernel needs to know the chosen layout (shard offsets, where extra outputs and
// gradients live), not just the local tensors that run_einsum hands over.
#pragma once

#include <string>
#include <vector>

#include "ops/op_helpers.h"

namespace dtensor::ops {

// The inputs moved to the (cached) cheapest strategy of `spec`, as local tensors,
// with the strategy itself. The redistributions are not recorded: the op records
// its own backward against its original inputs.
struct Placed {
  dispatch::Strategy strategy;
  std::vector<Tensor> locals;
};
Placed place_inputs(const char* op, const std::vector<int64_t>& attributes,
                    const std::vector<DistTensor>& inputs, const dispatch::EinsumSpec& spec);

// True when some mesh dim shards tensor dim `dim`.
bool is_sharded_on(const Placements& placements, int64_t dim);

// The placements with every Partial replaced by Replicate: where the gradient of a
// Partial output lives (d(sum of parts)/d(part) = 1), and what a non-linear op
// needs of its input.
Placements partials_replicated(Placements placements);

// `a` with its Partial mesh dims reduced (a differentiable redistribution). Ops
// that run several steps on a sharded input call this once up front, so that the
// steps do not each reduce the same Partial input again.
DistTensor without_partials(const DistTensor& a);

// Where this rank's block of a tensor of `shape` laid out by `placements` starts
// along tensor dim `dim` (0 where no mesh dim shards it).
int64_t shard_offset(const DeviceMesh& mesh, const Shape& shape, const Placements& placements, int64_t dim);

}  // namespace dtensor::ops
