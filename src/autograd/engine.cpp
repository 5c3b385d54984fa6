// The autograd tape and the backward engine.
#include <functional>
#include <map>
#include <queue>
#include <set>

#include "dist_tensor/dist_tensor_impl.h"
#include "dist_tensor/step_plan_hooks.h"
#include "dtensor/autograd.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

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
  if (!a.mesh().is_member()) {  // a gradient that lives on other ranks holds nothing here
    if (step_plan::active) step_plan::on_accumulate(a, b, a);  // the members record the move; so does this rank
    return a;
  }
  DistTensor moved = b;
  if (b.placements() != a.placements()) {
    step_plan::InternalMoveScope own_move;  // reported below, with its target's producer
    moved = b.redistribute(a.placements());
  }
  const Tensor sum = add(local_of(a), local_of(moved));
  DistTensor result = DistTensor::from_local(sum, a.mesh(), a.placements(), a.shape());
  if (step_plan::active) step_plan::on_accumulate(a, b, result);
  return result;
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
    if (step_plan::active && !meta->grad.defined()) step_plan::on_leaf_gradient(leaf, grads[0]);
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

void mark_replaced(const DistTensor& old, const std::string& how) {
  if (!old.defined()) return;
  auto& meta = old.impl()->autograd;
  if (!meta) meta = std::make_shared<DistTensor::AutogradMeta>();
  if (meta->replaced_note.empty()) meta->replaced_note = how;
}

const std::string& replaced_note(const DistTensor& param) {
  static const std::string kNone;
  if (!param.defined() || !param.impl()->autograd) return kNone;
  return param.impl()->autograd->replaced_note;
}

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
  if (step_plan::active) step_plan::on_boundary();
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
  if (step_plan::active) step_plan::on_function(static_cast<const Node*>(node.get()), outputs);
}

}  // namespace autograd

namespace {

using autograd::Edge;
using autograd::Node;

// The gradient backward starts from: `grad`, or 1 for a one-element root, or nothing
// held here for a root that lives on other ranks.
DistTensor initial_gradient(const DistTensor& root, const DistTensor& grad) {
  DT_CHECK_ARG(root.defined() && root.requires_grad(), "backward",
               "expected a tensor that requires grad (did you detach it or run under NoGradGuard?)");
  if (!grad.defined() && !root.mesh().is_member()) {
    // The root lives on other ranks (e.g. activations this rank sent to another
    // mesh): its gradient arrives through the recorded moves, so this rank starts
    // from a gradient that holds nothing here.
    Placements whole = root.placements();
    for (Placement& p : whole) {
      if (p.is_partial()) p = Replicate();
    }
    return zeros(root.shape(), root.mesh(), whole, root.dtype(), root.device());
  }
  if (!grad.defined()) {
    DT_CHECK_ARG(root.numel() == 1, "backward", "implicit gradient needs a tensor with one element, got shape ",
                 root.shape(), "; pass a gradient");
    // The gradient of a Partial(sum) value is the same on every coordinate, on the
    // root's device.
    const Placements replicated(root.mesh().ndim(), Replicate());
    return ones(root.shape(), root.mesh(), replicated, root.dtype(), root.device());
  }
  DT_CHECK_ARG(grad.shape() == root.shape(), "backward", "gradient shape ", grad.shape(),
               " differs from the tensor's ", root.shape());
  return grad;
}

// How many gradients each node reachable from `starts` (through nodes `inside`
// accepts) will receive from those nodes.
std::map<Node*, int> dependencies_from(const std::vector<Node*>& starts, const std::function<bool(Node*)>& inside) {
  std::map<Node*, int> dependencies;
  std::set<Node*> seen(starts.begin(), starts.end());
  std::vector<Node*> stack(starts.begin(), starts.end());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    DT_CHECK_ARG(!node->released, "backward",
                 "trying to backward through the graph a second time (node ", node->name(),
                 "); pass retain_graph=true to the first backward");
    for (const Edge& e : node->next_edges) {
      if (!e.node || !inside(e.node.get())) continue;
      ++dependencies[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  return dependencies;
}

// Gradients on their way to nodes, and the nodes kept alive until the backward ends.
struct Inbox {
  std::map<Node*, std::vector<DistTensor>> slots;
  std::map<Node*, std::shared_ptr<Node>> alive;

  void add(const Edge& e, const DistTensor& grad) {
    alive.emplace(e.node.get(), e.node);
    auto& s = slots[e.node.get()];
    s.resize(static_cast<size_t>(e.node->num_outputs));
    if (grad.defined()) s[static_cast<size_t>(e.input_nr)] = accumulate(s[static_cast<size_t>(e.input_nr)], grad);
  }
  std::vector<DistTensor> take(Node* node) {
    std::vector<DistTensor> grads = std::move(slots[node]);
    slots.erase(node);
    grads.resize(static_cast<size_t>(node->num_outputs));
    return grads;
  }
};

// Latest-created first among ready nodes: the same order on every rank.
struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};
using ReadyQueue = std::priority_queue<Node*, std::vector<Node*>, LaterFirst>;

// What grad_wanted answers inside the backward function being applied.
struct WantedInputs {
  const std::vector<bool>* mask = nullptr;
  bool asked = false;
};
thread_local WantedInputs* wanted_inputs = nullptr;

// Applies `node` with the gradients of the edges `wanted` marks wanted; `asked` says
// whether its backward function consulted grad_wanted.
std::vector<DistTensor> apply_node(Node* node, std::vector<DistTensor> grads, const std::vector<bool>& wanted,
                                   bool* asked = nullptr) {
  WantedInputs current{&wanted, false};
  WantedInputs* previous = wanted_inputs;
  wanted_inputs = &current;
  std::vector<DistTensor> out;
  if (step_plan::active) step_plan::on_backward(static_cast<const Node*>(node));
  try {
    out = node->apply(std::move(grads));
  } catch (...) {
    wanted_inputs = previous;
    throw;
  }
  wanted_inputs = previous;
  if (step_plan::active) step_plan::on_backward(nullptr);
  if (asked) *asked = current.asked;
  out.resize(node->next_edges.size());
  return out;
}

std::vector<bool> present_edges(const Node* node) {
  std::vector<bool> wanted(node->next_edges.size());
  for (size_t i = 0; i < wanted.size(); ++i) wanted[i] = node->next_edges[i].node != nullptr;
  return wanted;
}

void release_node(Node* node, bool retain_graph) {
  if (retain_graph || node->name() == "AccumulateGrad") return;
  node->release();
  node->released = true;
}

}  // namespace

bool autograd::grad_wanted(size_t input_nr) {
  if (!wanted_inputs) return true;
  wanted_inputs->asked = true;
  return input_nr < wanted_inputs->mask->size() && (*wanted_inputs->mask)[input_nr];
}

void backward(const DistTensor& root, const DistTensor& grad, bool retain_graph) {
  const DistTensor root_grad = initial_gradient(root, grad);
  const Edge start = edge_of(root);
  std::map<Node*, int> dependencies = dependencies_from({start.node.get()}, [](Node*) { return true; });
  Inbox inbox;
  inbox.add(start, root_grad);
  ReadyQueue ready;
  ready.push(start.node.get());

  BackwardScope scope;
  NoGradGuard no_grad;  // backward functions are not themselves recorded
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    const std::vector<DistTensor> input_grads = apply_node(node, inbox.take(node), present_edges(node));
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.node) continue;
      inbox.add(e, input_grads[i]);
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
    release_node(node, retain_graph);
  }
  scope.run_callbacks();
}

// ---- backward in two parts -------------------------------------------------------------

struct DeferredBackward::State {
  // Gradients the first part computed for nodes outside it.
  Inbox inbox;
  // Nodes of the first part whose backward function left the gradients of their other
  // inputs for the second part: applied again with those wanted.
  struct Reapply {
    std::shared_ptr<Node> node;
    std::vector<DistTensor> grads;
    std::vector<bool> wanted;  // the edges the first part did not compute
  };
  std::vector<Reapply> reapply;
  bool done = false;
};

bool DeferredBackward::pending() const { return state_ && !state_->done; }

DeferredBackward backward_input(const DistTensor& root, const DistTensor& grad, const std::vector<DistTensor>& inputs) {
  const DistTensor root_grad = initial_gradient(root, grad);
  const Edge start = edge_of(root);
  std::set<Node*> targets;
  for (const DistTensor& input : inputs) {
    if (!input.defined() || !input.requires_grad()) continue;
    DT_CHECK_ARG(input.is_leaf(), "backward_input", "expected the inputs to be leaves, got one made by ",
                 input.grad_fn_name());
    targets.insert(edge_of(input).node.get());
  }
  // The first part: the nodes from which an input can be reached.
  dependencies_from({start.node.get()}, [](Node*) { return true; });  // checks for released nodes
  std::map<Node*, bool> leads;
  std::function<bool(Node*)> to_input = [&](Node* node) -> bool {
    const auto it = leads.find(node);
    if (it != leads.end()) return it->second;
    bool found = targets.count(node) > 0;
    for (const Edge& e : node->next_edges) {
      if (found) break;
      if (e.node) found = to_input(e.node.get());
    }
    leads[node] = found;
    return found;
  };
  DeferredBackward deferred;
  deferred.state_ = std::make_shared<DeferredBackward::State>();
  DeferredBackward::State& state = *deferred.state_;
  BackwardScope scope;
  NoGradGuard no_grad;
  if (!to_input(start.node.get())) {
    state.inbox.add(start, root_grad);  // nothing leads to an input: all of it waits
    return deferred;
  }
  std::map<Node*, int> dependencies = dependencies_from({start.node.get()}, to_input);
  Inbox inbox;
  inbox.add(start, root_grad);
  ReadyQueue ready;
  ready.push(start.node.get());
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<bool> now(node->next_edges.size()), later(node->next_edges.size());
    for (size_t i = 0; i < now.size(); ++i) {
      const Node* next = node->next_edges[i].node.get();
      now[i] = next && to_input(node->next_edges[i].node.get());
      later[i] = next && !now[i];
    }
    std::vector<DistTensor> grads = inbox.take(node);
    bool asked = false;
    const std::vector<DistTensor> input_grads = apply_node(node, grads, now, &asked);
    bool again = false;
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (now[i]) {
        inbox.add(e, input_grads[i]);
        if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
      } else if (later[i]) {
        if (asked) {
          again = true;  // the function computes it when wanted
        } else {
          state.inbox.add(e, input_grads[i]);
        }
      }
    }
    if (again) {
      state.reapply.push_back({inbox.alive.at(node), std::move(grads), std::move(later)});
    } else {
      release_node(node, false);
    }
  }
  scope.run_callbacks();
  return deferred;
}

void DeferredBackward::run() {
  if (!state_ || state_->done) return;
  State& state = *state_;
  state.done = true;
  std::vector<Node*> starts;
  for (const auto& [node, _] : state.inbox.slots) starts.push_back(node);
  for (const State::Reapply& r : state.reapply) {
    for (size_t i = 0; i < r.wanted.size(); ++i) {
      if (r.wanted[i]) starts.push_back(r.node->next_edges[i].node.get());
    }
  }
  std::map<Node*, int> dependencies = dependencies_from(starts, [](Node*) { return true; });
  std::map<Node*, const State::Reapply*> reapplied;
  for (const State::Reapply& r : state.reapply) {
    reapplied[r.node.get()] = &r;
    for (size_t i = 0; i < r.wanted.size(); ++i) {
      if (r.wanted[i]) ++dependencies[r.node->next_edges[i].node.get()];
    }
  }
  ReadyQueue ready;
  for (const State::Reapply& r : state.reapply) ready.push(r.node.get());
  for (const auto& [node, _] : state.inbox.slots) {
    if (dependencies[node] == 0) ready.push(node);
  }
  BackwardScope scope;
  NoGradGuard no_grad;
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    const auto again = reapplied.find(node);
    const bool is_reapply = again != reapplied.end();
    const std::vector<bool> wanted = is_reapply ? again->second->wanted : present_edges(node);
    const std::vector<DistTensor> input_grads =
        apply_node(node, is_reapply ? again->second->grads : state.inbox.take(node), wanted);
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!wanted[i]) continue;
      state.inbox.add(e, input_grads[i]);
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
    release_node(node, false);
  }
  scope.run_callbacks();
  state.reapply.clear();
  state.inbox = Inbox();
}

}  // namespace dtensor
