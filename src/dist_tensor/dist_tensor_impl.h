// The shared state behind a DistTensor handle and its autograd record (internal: the
// library's sources read them; the public header only declares them).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor {

namespace autograd {
class Node;
}

struct DistTensor::AutogradMeta {
  bool requires_grad = false;
  DistTensor grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  int output_nr = 0;
  std::weak_ptr<autograd::Node> accumulator;  // a leaf's gradient sink
  std::vector<std::function<void(const DistTensor&)>> hooks;
  // Set on a module parameter another tensor replaced (nn::mark_parameter_replaced).
  std::string replaced_note;
};

struct DistTensor::Impl {
  Tensor local;
  DeviceMesh mesh;
  Placements placements;  // normalized
  Shape global_shape;
  std::shared_ptr<AutogradMeta> autograd;  // null unless gradients are involved
  // The recorded op that made it, while a PlannedStep records (step_plan.cpp): the
  // recording's serial in the high 32 bits, the op's index + 1 in the low; 0 for none.
  uint64_t plan_tag = 0;
};

// The local shard, read by library code that handles every layout (redistribution,
// dispatch's own moves, autograd's sums): unlike DistTensor::to_local(), it does not
// pin the tensor's layout in a step being planned.
inline const Tensor& local_of(const DistTensor& t) { return t.impl()->local; }

}  // namespace dtensor
