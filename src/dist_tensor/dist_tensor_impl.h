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
};

}  // namespace dtensor
