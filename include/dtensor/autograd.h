// Reverse-mode automatic differentiation of DistTensor programs.
//
// Every op on DistTensors that require gradients records a Node on a tape: its
// backward function, the edges to the nodes of its inputs and what it saved.
// backward() runs the nodes in reverse creation order (identical on every rank, so
// collectives issued by backward functions line up), sums the gradients that meet
// at a tensor, and accumulates leaf gradients into `grad()`.
//
// Gradients are DistTensors with placements. A gradient of a Partial(sum) output is
// Replicate (d(sum)/d(part) = 1); the backward of redistribute follows DESIGN.md:
// S->R turns a Partial gradient into S by reduce-scatter (a Replicate one by a local
// chunk), P->R is free. So data parallelism's all-reduce and FSDP's reduce-scatter
// come out of the ordinary rules.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor {

// Disables recording on this rank while alive (nests).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
bool grad_enabled();

// Sets gradient recording on or off on this rank while alive (activation
// checkpointing turns it back on to recompute inside a backward).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Runs backward from `root`. Without `grad`, root must have one element and gets a
// gradient of 1. retain_graph keeps saved tensors for another backward.
void backward(const DistTensor& root, const DistTensor& grad = {}, bool retain_graph = false);

// ---- backward in two parts (zero-bubble pipeline schedules) ------------------------------

// The part of a backward that backward_input left for later. run() computes it once
// (in the same way backward() would: leaf gradients accumulate, grad-ready hooks and
// end-of-backward callbacks run); a default-constructed one has nothing to do.
class DeferredBackward {
 public:
  DeferredBackward() = default;
  void run();
  bool pending() const;
  struct State;

 private:
  friend DeferredBackward backward_input(const DistTensor&, const DistTensor&, const std::vector<DistTensor>&);
  std::shared_ptr<State> state_;
};

// Runs only the part of the backward from `root` that leads to `inputs` (leaves that
// require grad: their gradients accumulate as backward() would accumulate them) and
// returns the rest. What goes only elsewhere (the parameters' gradients) waits in the
// returned handle, with what it needs saved, until run(); together the two compute
// what backward(root, grad) computes. A backward function that asks
// autograd::grad_wanted computes only the gradients of the part being run (matmul:
// the input's in the first, the weight's in the second); one that does not computes
// all of its gradients in the first part, and those bound elsewhere are kept for
// run(). Inputs that do not require grad are ignored (with none, the whole backward
// is deferred).
DeferredBackward backward_input(const DistTensor& root, const DistTensor& grad, const std::vector<DistTensor>& inputs);

// Called once per backward when `param`'s gradient for this backward has been
// accumulated into param.grad() (DDP and FSDP start communication from here).
using GradReadyHook = std::function<void(const DistTensor& param)>;
void register_grad_ready_hook(const DistTensor& param, GradReadyHook hook);

// A module parameter another tensor took the place of (nn::Module::set_parameter,
// parallelize_module, fully_shard, Module::to) is marked with how, so that whoever
// still holds the old tensor (an optimizer or a wrapper built before the parameters
// were re-laid out) fails with that message instead of training a tensor no forward
// reads. The first mark stays.
void mark_replaced(const DistTensor& old, const std::string& how);
// The mark ("'fc1.weight' was re-laid out by parallelize_module over tp"), or "".
const std::string& replaced_note(const DistTensor& param);

namespace autograd {

class Node;

// Where a gradient goes: input `input_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  int input_nr = 0;
};

class Node {
 public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // Gradients w.r.t. this node's outputs (undefined where none arrived) -> gradients
  // w.r.t. its inputs, aligned with next_edges (undefined for "no gradient").
  virtual std::vector<DistTensor> apply(std::vector<DistTensor>&& grad_outputs) = 0;
  // Frees what apply needs (after a backward without retain_graph).
  virtual void release() {}

  std::vector<Edge> next_edges;
  int num_outputs = 1;
  uint64_t sequence_nr = 0;  // creation order on this rank
  bool released = false;
};

// A node whose backward is a function of the output gradients; what the function
// captures is what the node saves (released after backward).
using BackwardFn = std::function<std::vector<DistTensor>(const std::vector<DistTensor>& grad_outputs)>;

// Records `name` with `backward` on the tape when gradients are enabled and some
// input requires them: the outputs get the node as grad_fn. Inputs that do not
// require gradients get no edge (their gradient is dropped). Outputs must be
// freshly created by the op. Save tensors for backward with `DistTensor::detach()`
// so that no output keeps its own node alive.
void record(const std::string& name, const std::vector<DistTensor>& inputs,
            std::vector<DistTensor>& outputs, BackwardFn backward);

// Inside a backward function: whether the engine wants the gradient of input
// `input_nr` now. False for an input without an edge (it does not require grad), and
// for the inputs of the part that backward_input defers. A function that asks may
// return an undefined gradient for an input not wanted, and must compute it when
// called again with it wanted; outside a backward everything is wanted.
bool grad_wanted(size_t input_nr);

// True when recording is on and some input requires a gradient.
bool needs_grad(const std::vector<DistTensor>& inputs);

// True while this rank runs a backward (including one nested in a backward function,
// as activation checkpointing's recomputation runs).
bool in_backward();

// Runs `fn` when the outermost backward running on this rank has applied every node
// (FSDP finishes its asynchronous gradient reductions there, so gradients are in
// place when backward() returns). Only valid inside a backward; callbacks run in the
// order queued and may queue more. A backward that throws drops its callbacks.
void queue_callback(std::function<void()> fn);

}  // namespace autograd
}  // namespace dtensor
