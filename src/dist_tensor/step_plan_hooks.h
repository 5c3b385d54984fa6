// What dispatch, redistribute and autograd tell an open PlannedStep (internal; see
// dtensor/step_plan.h). Every hook is one thread-local test when no step is open.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "dist_tensor/dispatch.h"

namespace dtensor::step_plan {

// `active` is declared in dispatch.h (its hot path reads it).

// A dispatched op while a step is open: the planned strategy on replay, else the
// greedy one (recorded with the candidates `build` offers for other input layouts).
const dispatch::Strategy& dispatch(std::string_view op, const std::vector<int64_t>& attributes,
                                   const std::vector<DistTensor>& inputs, const dispatch::Builder& build);
// A DistTensor wrapped by dispatch::wrap: the output of the op dispatched last, if
// nothing else happened since (on_boundary).
void on_wrap(const std::shared_ptr<DistTensor::Impl>& impl);
// Autograd records a function or runs one: wraps that follow belong to no op.
void on_boundary();
// Autograd recorded `node` (an autograd::Node) for an op's outputs, or is about to run
// it (null when the function ended): wraps and moves in the function that are in one of
// the op's layouts follow the op's strategy.
void on_function(const void* node, const std::vector<DistTensor>& outputs);
void on_backward(const void* node);
// A tensor's local shard read outside the dispatch machinery (DistTensor::to_local(),
// called whenever the tensor has a plan tag, a step open or not): its layout is seen by
// code the plan cannot follow, so the op that made it keeps its recorded layout. A
// read of a tensor whose layout a replayed plan changed (the recorded step did not
// read it) throws.
void on_observe(const DistTensor::Impl& impl);
// The plan tag of tensors whose layout a replayed plan changed.
constexpr uint64_t kChangedLayout = ~uint64_t{0};
// `source` moved to `to`: charged to the plan (its layout decides the move's cost).
// Moves that dispatch makes for an op's inputs are the op's own and are not reported.
void on_redistribute(const DistTensor& source, const Placements& to);
// Code reads `t`'s layout to choose what to do (a path of an op, a move across meshes):
// the op that made it keeps its recorded layout.
void on_keep(const DistTensor& t, const char* why);
// Code chooses what to do by `decides(t's placements)`: the op that made t keeps to
// strategies whose output decides the same way (the same path on replay).
void on_keep_decision(const DistTensor& t, std::function<bool(const Placements&)> decides);
inline void keep_decision(const DistTensor& t, std::function<bool(const Placements&)> decides) {
  if (active) on_keep_decision(t, std::move(decides));
}
// Autograd summing two gradients of one tensor: `b` is moved to `a`'s layout and the
// sum `result` has `a`'s layout, whatever the plan makes it.
void on_accumulate(const DistTensor& a, const DistTensor& b, const DistTensor& result);
// A leaf's gradient, `grad` for `leaf`: an optimizer will need it in the leaf's layout.
void on_leaf_gradient(const DistTensor& leaf, const DistTensor& grad);

// While alive, redistributions on this thread are dispatch's own input moves.
class InternalMoveScope {
 public:
  InternalMoveScope();
  ~InternalMoveScope();
  InternalMoveScope(const InternalMoveScope&) = delete;
  InternalMoveScope& operator=(const InternalMoveScope&) = delete;

 private:
  bool previous_;
};

}  // namespace dtensor::step_plan
