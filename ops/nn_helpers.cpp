// Layout-aware helpers of the neural-network op families.
#include "ops/nn_helpers.h"

namespace dtensor::ops {

Placed place_inputs(const char* op, const std::vector<int64_t>& attributes,
                    const std::vector<DistTensor>& inputs, const dispatch::EinsumSpec& spec) {
  dispatch::common_mesh(inputs, op);
  const dispatch::Strategy& strategy = dispatch::cached_strategy(
      op, attributes, inputs, [&](const std::vector<DistTensor>& in) { return dispatch::einsum_strategies(spec, in); });
  return Placed{strategy, dispatch::local_inputs(strategy, inputs)};
}

bool is_sharded_on(const Placements& placements, int64_t dim) {
  for (const Placement& p : placements) {
    if (p.is_shard(dim)) return true;
  }
  return false;
}

Placements partials_replicated(Placements placements) {
  for (Placement& p : placements) {
    if (p.is_partial()) p = Replicate();
  }
  return placements;
}

DistTensor without_partials(const DistTensor& a) {
  const Placements target = partials_replicated(a.placements());
  return target == a.placements() ? a : a.redistribute(target);
}

int64_t shard_offset(const DeviceMesh& mesh, const Shape& shape, const Placements& placements, int64_t dim) {
  if (!is_sharded_on(placements, dim)) return 0;
  return local_block(shape, mesh.shape(), placements, mesh.coordinate())[static_cast<size_t>(dim)].offset;
}

}  // namespace dtensor::ops
