// The autograd tape and the backward engine.
#include <map>
#include <queue>

#include "dtensor/autograd.h"
#include "dtensor/tensor_ops.h"

namespace dtensor {
namespace {

thread_local bool grad_mode = true;           // per rank
thread_local uint64_t next_sequence_nr = 0;   // per rank: same program, same numbers
thread_local int backward_depth = 0;          // backwards running on this rank (nested > 1)
thread_local std::vector<std::function<void()>> end_of_backward;  // queue_callback

// Counts a running backward; the outermost one runs the queued callbacks when it
// completes and drops them when it unwinds with an exception.
class BackwardScope {
 public:
  BackwardScope() { ++backward_depth; }
  ~BackwardScope() {
    if (--backward_depth == 0) end_of_backward.clear();
  }
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;

  void run_callbacks() {
    if (backward_depth != 1) return;
    // Index loop: a callback may queue another.
    for (size_t i = 0; i < end_of_backward.size(); ++i) {
      std::function<void()> fn = std::move(end_of_backward[i]);
      fn();
    }
    end_of_backward.clear();
  }
};

std::shared_ptr<DistTensor::AutogradMeta> meta_of(const DistTensor& t) { return t.impl()->autograd; }

std::shared_ptr<DistTensor::AutogradMeta>& ensure_meta(const DistTensor& t) {
  auto& meta = t.impl()->autograd;
  if (!meta) meta = std::make_shared<DistTensor::AutogradMeta>();
  return meta;
}

// a + b with b moved to a's layout first; both are gradients of one tensor.
DistTensor accumulate(const DistTensor& a, const DistTensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  if (!a.mesh().is_member()) return a;  // a gradient that lives on other ranks holds nothing here
  const DistTensor moved = b.placements() == a.placements() ? b : b.redistribute(a.placements());
  const Tensor sum = add(a.to_local(), moved.to_local());
  return DistTensor::from_local(sum, a.mesh(), a.placements(), a.shape());
}

// The gradient sink of a leaf: adds into leaf.grad() and runs its hooks.
class AccumulateGrad final : public autograd::Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<DistTensor::Impl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<DistTensor> apply(std::vector<DistTensor>&& grads) override {
    auto impl = leaf_.lock();
    if (!impl || !grads[0].defined()) return {};
    const DistTensor leaf(impl);
    auto& meta = ensure_meta(leaf);
    meta->grad = accumulate(meta->grad, grads[0]);
    for (const GradReadyHook& hook : meta->hooks) hook(leaf);
    return {};
  }

 private:
  std::weak_ptr<DistTensor::Impl> leaf_;
};

class FunctionNode final : public autograd::Node {
 public:
  FunctionNode(std::string name, autograd::BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<DistTensor> apply(std::vector<DistTensor>&& grads) override { return fn_(grads); }
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  autograd::BackwardFn fn_;
};

// The edge a gradient for `t` should follow: its grad_fn, or its leaf accumulator.
autograd::Edge edge_of(const DistTensor& t) {
  auto meta = meta_of(t);
  if (!meta || !meta->requires_grad) return {};
  if (meta->grad_fn) return {meta->grad_fn, meta->output_nr};
  std::shared_ptr<autograd::Node> acc = meta->accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl());
    acc->sequence_nr = next_sequence_nr++;
    meta->accumulator = acc;
  }
  return {acc, 0};
}

}  // namespace

NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }
bool grad_enabled() { return grad_mode; }
GradModeGuard::GradModeGuard(bool enabled) : previous_(grad_mode) { grad_mode = enabled; }
GradModeGuard::~GradModeGuard() { grad_mode = previous_; }

void register_grad_ready_hook(const DistTensor& param, GradReadyHook hook) {
  DT_CHECK_ARG(param.defined() && param.requires_grad() && param.is_leaf(), "register_grad_ready_hook",
               "expected a leaf DistTensor that requires grad");
  ensure_meta(param)->hooks.push_back(std::move(hook));
}

namespace autograd {

bool in_backward() { return backward_depth > 0; }

void queue_callback(std::function<void()> fn) {
  DT_CHECK_ARG(backward_depth > 0, "queue_callback", "expected to be called during a backward");
  end_of_backward.push_back(std::move(fn));
}

bool needs_grad(const std::vector<DistTensor>& inputs) {
  if (!grad_mode) return false;
  for (const DistTensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(const std::string& name, const std::vector<DistTensor>& inputs,
            std::vector<DistTensor>& outputs, BackwardFn backward) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->sequence_nr = next_sequence_nr++;
  node->num_outputs = static_cast<int>(outputs.size());
  for (const DistTensor& t : inputs) node->next_edges.push_back(t.defined() ? edge_of(t) : Edge{});
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto& meta = ensure_meta(outputs[i]);
    meta->requires_grad = true;
    meta->grad_fn = node;
    meta->output_nr = static_cast<int>(i);
  }
}

}  // namespace autograd

void backward(const DistTensor& root, const DistTensor& grad, bool retain_graph) {
  DT_CHECK_ARG(root.defined() && root.requires_grad(), "backward",
               "expected a tensor that requires grad (did you detach it or run under NoGradGuard?)");
  DistTensor root_grad = grad;
  if (!root_grad.defined() && !root.mesh().is_member()) {
    // The root lives on other ranks (e.g. activations this rank sent to another
    // mesh): its gradient arrives through the recorded moves, so this rank starts
    // from a gradient that holds nothing here.
    Placements whole = root.placements();
    for (Placement& p : whole) {
      if (p.is_partial()) p = Replicate();
    }
    root_grad = zeros(root.shape(), root.mesh(), whole, root.dtype());
  } else if (!root_grad.defined()) {
    DT_CHECK_ARG(root.numel() == 1, "backward", "implicit gradient needs a tensor with one element, got shape ",
                 root.shape(), "; pass a gradient");
    // The gradient of a Partial(sum) value is the same on every coordinate.
    root_grad = ones(root.shape(), root.mesh(), Placements(root.mesh().ndim(), Replicate()), root.dtype());
  } else {
    DT_CHECK_ARG(root_grad.shape() == root.shape(), "backward", "gradient shape ", root_grad.shape(),
                 " differs from the tensor's ", root.shape());
  }
  const autograd::Edge start = edge_of(root);

  // Count how many gradients each node will receive.
  std::map<autograd::Node*, int> dependencies;
  std::vector<autograd::Node*> stack{start.node.get()};
  std::map<autograd::Node*, bool> seen{{start.node.get(), true}};
  while (!stack.empty()) {
    autograd::Node* node = stack.back();
    stack.pop_back();
    DT_CHECK_ARG(!node->released, "backward",
                 "trying to backward through the graph a second time (node ", node->name(),
                 "); pass retain_graph=true to the first backward");
    for (const autograd::Edge& e : node->next_edges) {
      if (!e.node) continue;
      ++dependencies[e.node.get()];
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }

  // Latest-created first among ready nodes: the same order on every rank.
  auto later = [](const autograd::Node* a, const autograd::Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<autograd::Node*, std::vector<autograd::Node*>, decltype(later)> ready(later);
  std::map<autograd::Node*, std::vector<DistTensor>> inbox;
  std::map<autograd::Node*, std::shared_ptr<autograd::Node>> keep_alive{{start.node.get(), start.node}};
  inbox[start.node.get()].resize(start.node->num_outputs);
  inbox[start.node.get()][start.input_nr] = root_grad;
  ready.push(start.node.get());

  BackwardScope scope;
  NoGradGuard no_grad;  // backward functions are not themselves recorded
  while (!ready.empty()) {
    autograd::Node* node = ready.top();
    ready.pop();
    std::vector<DistTensor> grads = std::move(inbox[node]);
    inbox.erase(node);
    grads.resize(node->num_outputs);
    std::vector<DistTensor> input_grads = node->apply(std::move(grads));
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const autograd::Edge& e = node->next_edges[i];
      if (!e.node) continue;
      keep_alive.emplace(e.node.get(), e.node);
      auto& slots = inbox[e.node.get()];
      slots.resize(e.node->num_outputs);
      if (i < input_grads.size() && input_grads[i].defined()) {
        slots[e.input_nr] = accumulate(slots[e.input_nr], input_grads[i]);
      }
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
    if (!retain_graph && node->name() != "AccumulateGrad") {
      node->release();
      node->released = true;
    }
  }
  scope.run_callbacks();
}

}  // namespace dtensor
