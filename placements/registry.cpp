// The list of redistribution transforms the planner composes. A new transform is
// added here and nowhere else (no static self-registration that is easy to miss).
#include <stdexcept>

#include "placements/transform.h"

namespace dtensor::redistribution {

const Transform& all_gather_transform();
const Transform& all_reduce_transform();
const Transform& reduce_scatter_transform();
const Transform& all_to_all_transform();
const Transform& chunk_transform();
const Transform& replicate_to_partial_transform();
const Transform& shard_to_partial_transform();
const Transform& partial_to_partial_transform();
const Transform& block_transfer_transform();

const std::vector<const Transform*>& all_transforms() {
  static const std::vector<const Transform*> transforms = {
      &all_gather_transform(),          &all_reduce_transform(),
      &reduce_scatter_transform(),      &all_to_all_transform(),
      &chunk_transform(),               &replicate_to_partial_transform(),
      &shard_to_partial_transform(),    &partial_to_partial_transform(),
      &block_transfer_transform(),
  };
  return transforms;
}

const Transform& transform_for(TransformKind kind) {
  for (const Transform* t : all_transforms()) {
    if (t->kind() == kind) return *t;
  }
  throw std::logic_error("[redistribute] no transform registered for this kind");
}

}  // namespace dtensor::redistribution

namespace dtensor {

const char* transform_name(TransformKind kind) {
  switch (kind) {
    case TransformKind::AllGather: return "all_gather";
    case TransformKind::AllReduce: return "all_reduce";
    case TransformKind::ReduceScatter: return "reduce_scatter";
    case TransformKind::AllToAll: return "all_to_all";
    case TransformKind::Chunk: return "chunk";
    case TransformKind::ReplicateToPartial: return "replicate_to_partial";
    case TransformKind::ShardToPartial: return "shard_to_partial";
    case TransformKind::PartialToPartial: return "partial_to_partial";
    case TransformKind::BlockTransfer: return "block_transfer";
    case TransformKind::CrossMesh: return "cross_mesh";
  }
  return "?";
}

}  // namespace dtensor
