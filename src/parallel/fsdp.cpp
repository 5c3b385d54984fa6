// FSDP: groups of sharded parameters, the hooks around a module's forward, the
// all-gather node whose backward reduce-scatters, prefetching and the end of
// backward.
//
// Per forward of a fully_shard'ed module:
//   pre-forward hook   wait for (or start) the module's all-gather, start the next
//                      module's (prefetch), record one "fsdp_all_gather" node from the
//                      sharded leaves to the gathered parameters and install those in
//                      the module (Module::swap_parameter);
//   forward            the layers compute with the gathered parameters;
//   post-forward hook  put the sharded leaves back, free the gathered parameters
//                      (stage 3, reshard_after_forward) and route the output through an
//                      "fsdp_pre_backward" node.
// In backward the pre-backward node runs before any of the module's own nodes (they
// all feed the output): it gathers the parameters again into their restored storage,
// which the saved views of the autograd graph share, and starts the next module's
// all-gather. The all-gather node runs after the last use of the module's
// parameters: it packs their gradients into one rank-major buffer, starts one
// reduce-scatter and frees the gathered parameters again. Reductions finish one
// module later, the last at the end of backward (autograd::queue_callback).
#include "dtensor/parallel/fsdp.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <set>
#include <typeinfo>
#if defined(__GNUG__)
#include <cxxabi.h>
#endif

#include "dtensor/autograd.h"
#include "dtensor/ops.h"
#include "dtensor/tensor_ops.h"
#include "dtensor/trace.h"
#include "parallel/fsdp_flat.h"

namespace dtensor::parallel {

using detail::FlatLayout;

namespace {

struct Context;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "TransformerBlock" for errors: the module's type without namespaces.
std::string type_name(const nn::Module& module) {
  std::string name = typeid(module).name();
#if defined(__GNUG__)
  int status = 0;
  char* demangled = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status == 0 && demangled) name = demangled;
  std::free(demangled);
#endif
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace

struct FSDPModule::ParamGroup {
  nn::Module* module = nullptr;
  FSDPOptions options;
  std::string label;  // "module TransformerBlock ('norm1.weight', ...)", for errors
  DeviceMesh mesh;
  int shard_dim = 0;
  int replicate_dim = -1;
  int64_t ranks = 1, rank = 0;

  struct Param {
    std::string name;        // relative to the module
    DistTensor sharded;      // the leaf the optimizer updates
    Placements unsharded;    // the layout forward computes with (Replicate on the FSDP dims)
    size_t bucket = 0, slot = 0;
  };
  std::vector<Param> params;

  // The parameters of one dtype: flat buffers (fsdp_flat.h) and what is in flight.
  struct Bucket {
    DType dtype = DType::F32;  // of the shards
    DType param_dtype = DType::F32, reduce_dtype = DType::F32;
    FlatLayout layout;
    std::vector<size_t> members;  // indices into params, in slot order
    Tensor shard;                 // [R] the shards (the leaves view it)
    Tensor send;                  // [R] the shards in param_dtype (stage 3 with a cast)
    bool send_stale = true;
    Tensor unsharded;             // [U] gathered parameters (memory released when resharded at stage 3)
    Tensor gathered;              // [N * R] all-gather output in flight
    Work gather;
    Tensor grad_full;             // [N * R] packed gradients (kept at stage 1)
    bool grad_holds_sum = false;  // grad_full holds gradients not yet reduced
    std::vector<Placements> grad_placements;  // per member: the reduced gradient's layout
    std::vector<bool> has_grad;               // per member: a gradient arrived since the last reduction
  };
  std::vector<Bucket> buckets;

  enum class State { Sharded, Gathering, Unsharded };
  State state = State::Sharded;
  bool sync = true;
  bool reshard_after_backward = true;
  std::optional<bool> reshard_after_forward_override;
  std::shared_ptr<Context> context;
  std::vector<std::weak_ptr<ParamGroup>> subtree;  // this group and those under its module
  std::vector<nn::HookHandle> hooks;

  bool is_root() const;
  bool reshard_after_forward() const {
    if (options.stage != 3) return false;
    if (reshard_after_forward_override) return *reshard_after_forward_override;
    if (options.reshard_after_forward) return *options.reshard_after_forward;
    return !is_root();
  }
  const dtensor::Group& shard_group() const { return mesh.group(shard_dim); }

  void start_gather(bool prefetch);
  void finish_gather();
  void unshard() {
    start_gather(false);
    finish_gather();
  }
  void reshard();
  // The gathered parameters as DistTensors in their compute layout (views of `unsharded`).
  std::vector<DistTensor> gathered_params() const;
  // The sharded leaves (the autograd inputs of the all-gather node).
  std::vector<DistTensor> sharded_params() const {
    std::vector<DistTensor> out;
    for (const Param& p : params) out.push_back(p.sharded);
    return out;
  }
};

namespace {

using ParamGroup = FSDPModule::ParamGroup;

// What the groups of one tree (a root and the modules under it) share: the recorded
// module order for prefetching, the reductions in flight and the counters.
struct Context {
  std::weak_ptr<ParamGroup> root;
  std::vector<std::weak_ptr<ParamGroup>> groups;
  // Order of pre-forward hooks and of pre-backward nodes in the first step; from the
  // second step on each module prefetches the next one's all-gather.
  std::vector<ParamGroup*> forward_order, backward_order;
  bool order_frozen = false;
  bool callback_queued = false;

  // A module's gradient reduction: the reduce-scatter, then (HSDP) the all-reduce
  // across replica groups.
  struct Reduction {
    std::weak_ptr<ParamGroup> group;
    size_t bucket = 0;
    Tensor out;  // [R] this rank's reduced region
    Work work;
    bool across_replicas = false;  // the second phase is in flight
  };
  std::deque<Reduction> reductions;
  FSDPStats stats;
};

thread_local std::map<const nn::Module*, std::weak_ptr<ParamGroup>> registry;  // per rank

std::shared_ptr<ParamGroup> group_of(const nn::Module* module) {
  auto it = registry.find(module);
  if (it == registry.end()) return nullptr;
  std::shared_ptr<ParamGroup> group = it->second.lock();
  if (!group) registry.erase(it);
  return group;
}

ParamGroup* next_in(const std::vector<ParamGroup*>& order, const ParamGroup* current) {
  auto it = std::find(order.begin(), order.end(), current);
  return it == order.end() || it + 1 == order.end() ? nullptr : *(it + 1);
}

void record_order(std::vector<ParamGroup*>& order, ParamGroup* group) {
  if (std::find(order.begin(), order.end(), group) == order.end()) order.push_back(group);
}

// Puts the reduced region of a finished reduction on the parameters as their
// gradients (accumulated into those already there).
void assign_gradients(ParamGroup& g, ParamGroup::Bucket& b, const Tensor& out) {
  Tensor region = out;
  if (g.options.stage == 1) {
    // Stage 1 keeps the full gradient buffer: the shard lives in this rank's part of it.
    region = b.grad_full.narrow(0, g.rank * b.layout.region_numel(), b.layout.region_numel());
    region.copy_(out);
  }
  for (size_t k = 0; k < b.members.size(); ++k) {
    // A parameter no gradient reached gets none, as on one rank.
    if (!b.has_grad[k]) continue;
    const ParamGroup::Param& p = g.params[b.members[k]];
    const DistTensor grad =
        DistTensor::from_local(b.layout.shard_view(region, k), g.mesh, b.grad_placements[k], p.sharded.shape());
    const DistTensor existing = p.sharded.grad();
    if (!existing.defined()) {
      p.sharded.set_grad(grad);
      continue;
    }
    const DistTensor moved = grad.placements() == existing.placements() ? grad : grad.redistribute(existing.placements());
    p.sharded.set_grad(DistTensor::from_local(add(existing.to_local(), moved.to_local()), existing.mesh(),
                                              existing.placements(), existing.shape()));
  }
  b.grad_holds_sum = false;
  b.has_grad.assign(b.members.size(), false);
  if (g.options.stage != 1) b.grad_full = Tensor();
}

// Moves one reduction a phase on: waits for the reduce-scatter and starts the
// all-reduce across replicas (HSDP), or waits for that, and assigns the gradients.
// Returns true when the reduction is complete.
bool advance(Context& ctx, Context::Reduction& r) {
  std::shared_ptr<ParamGroup> g = r.group.lock();
  if (!g) {
    r.work.wait();
    return true;
  }
  ParamGroup::Bucket& b = g->buckets[r.bucket];
  {
    TraceSpan span("fsdp_reduce_wait", "comm");
    const auto t0 = std::chrono::steady_clock::now();
    r.work.wait();
    ctx.stats.reduce_scatter_wait_seconds += seconds_since(t0);
  }
  if (g->replicate_dim >= 0 && !r.across_replicas) {
    TraceSpan span("fsdp_replica_all_reduce", "comm");
    r.work = all_reduce_async(g->mesh.group(g->replicate_dim), r.out, r.out, ReduceOp::Sum);
    r.across_replicas = true;
    ++ctx.stats.replica_all_reduces;
    return false;
  }
  assign_gradients(*g, b, r.out);
  return true;
}

// Moves every reduction in flight one phase on (so at most one reduce-scatter and one
// replica all-reduce stay in flight), or with `all` to completion.
void progress_reductions(Context& ctx, bool all) {
  std::deque<Context::Reduction> still;
  while (!ctx.reductions.empty()) {
    Context::Reduction r = std::move(ctx.reductions.front());
    ctx.reductions.pop_front();
    bool done = advance(ctx, r);
    while (all && !done) done = advance(ctx, r);
    if (!done) still.push_back(std::move(r));
  }
  ctx.reductions = std::move(still);
}

void finish_backward(Context& ctx);

void ensure_end_of_backward(const std::shared_ptr<Context>& ctx) {
  if (ctx->callback_queued) return;
  ctx->callback_queued = true;
  autograd::queue_callback([weak = std::weak_ptr<Context>(ctx)] {
    if (auto c = weak.lock()) finish_backward(*c);
  });
}

void finish_backward(Context& ctx) {
  ctx.callback_queued = false;
  progress_reductions(ctx, true);
  for (const std::weak_ptr<ParamGroup>& weak : ctx.groups) {
    std::shared_ptr<ParamGroup> g = weak.lock();
    if (!g) continue;
    // A prefetch that no module used this step still has to complete.
    if (g->state == ParamGroup::State::Gathering) g->finish_gather();
    if (g->reshard_after_backward && g->sync) g->reshard();
  }
  if (!ctx.forward_order.empty()) ctx.order_frozen = true;
}

// This rank's local gradient of parameter `k` of bucket `b` in the gathered layout,
// and the layout its reduced shard will have. Returns an undefined tensor when this
// rank contributes nothing (a gradient replicated over an FSDP dim counts once: on
// coordinate 0).
Tensor prepare_gradient(ParamGroup& g, ParamGroup::Bucket& b, size_t k, DistTensor grad) {
  const ParamGroup::Param& p = g.params[b.members[k]];
  const int ndim = g.mesh.ndim();
  // Reduce-scatter and the replica all-reduce sum: other Partial ops go to Replicate
  // first, and other mesh dims go to the gathered parameter's layout where their
  // local shape would differ (Partial stays where the parameter is Replicate; the
  // optimizer reduces it).
  Placements target = grad.placements();
  for (int d = 0; d < ndim; ++d) {
    const Placement& have = target[d];
    const bool fsdp_dim = d == g.shard_dim || d == g.replicate_dim;
    if (fsdp_dim) {
      if (have.is_partial() && have.reduce_op() != ReduceOp::Sum) target[d] = Replicate();
      if (have.is_shard()) target[d] = Replicate();
    } else if (have != p.unsharded[d] && !(have.is_partial() && p.unsharded[d].is_replicate())) {
      target[d] = p.unsharded[d];
    }
  }
  if (target != grad.placements()) grad = grad.redistribute(target);
  Placements reduced = grad.placements();
  reduced[g.shard_dim] = p.sharded.placements()[g.shard_dim];
  if (g.replicate_dim >= 0) reduced[g.replicate_dim] = Replicate();
  b.grad_placements[k] = reduced;
  for (int d : {g.shard_dim, g.replicate_dim}) {
    if (d >= 0 && grad.placements()[d].is_replicate() && g.mesh.coordinate(d) != 0) return Tensor();
  }
  return grad.to_local();
}

// The backward of the all-gather node: packs the module's gradients and starts their
// reduction.
void reduce_gradients(const std::shared_ptr<ParamGroup>& gp, const std::vector<DistTensor>& grads) {
  ParamGroup& g = *gp;
  Context& ctx = *g.context;
  ensure_end_of_backward(g.context);
  bool launched = false;
  for (size_t bi = 0; bi < g.buckets.size(); ++bi) {
    ParamGroup::Bucket& b = g.buckets[bi];
    bool any = b.grad_holds_sum;
    for (size_t idx : b.members) any |= grads[idx].defined();
    if (!any) continue;
    TraceSpan span("fsdp_pack_gradients", "compute");
    if (!b.grad_full.defined()) {
      b.grad_full = Tensor::empty({g.ranks * b.layout.region_numel()}, b.reduce_dtype);
      b.layout.zero_padding(b.grad_full);
    } else if (!b.grad_holds_sum) {
      // Stage 1 hands out views of its kept buffer; a gradient still holding one (no
      // zero_grad since the last step) gets its own copy before the buffer is reused.
      for (size_t idx : b.members) {
        const DistTensor old = g.params[idx].sharded.grad();
        if (old.defined() && old.to_local().shares_storage(b.grad_full)) {
          g.params[idx].sharded.set_grad(
              DistTensor::from_local(old.to_local().clone(), old.mesh(), old.placements(), old.shape()));
        }
      }
    }
    for (size_t k = 0; k < b.members.size(); ++k) {
      const DistTensor& grad = grads[b.members[k]];
      const Tensor local = grad.defined() ? prepare_gradient(g, b, k, grad) : Tensor();
      if (grad.defined()) b.has_grad[k] = true;
      if (local.defined()) {
        b.layout.pack(k, local, b.grad_full, b.grad_holds_sum);
      } else if (!b.grad_holds_sum) {
        b.layout.zero_slots(k, b.grad_full);
      }
    }
    b.grad_holds_sum = true;
    if (!g.sync) continue;
    // One reduction in flight: the previous module's finishes now, after this
    // module's backward has run beside it.
    if (!launched) progress_reductions(ctx, false);
    launched = true;
    TraceSpan launch("fsdp_reduce_scatter", "comm");
    Context::Reduction r{gp, bi, Tensor::empty({b.layout.region_numel()}, b.reduce_dtype), Work(), false};
    r.work = reduce_scatter_async(g.shard_group(), b.grad_full, r.out, ReduceOp::Sum);
    ++ctx.stats.reduce_scatters;
    ctx.reductions.push_back(std::move(r));
    b.send_stale = true;  // the optimizer updates the shards after this backward
  }
  if (g.reshard_after_backward && g.sync) g.reshard();
}

void pre_backward(const std::shared_ptr<ParamGroup>& gp) {
  ParamGroup& g = *gp;
  Context& ctx = *g.context;
  ensure_end_of_backward(g.context);
  if (!ctx.order_frozen) record_order(ctx.backward_order, &g);
  g.unshard();
  if (g.options.prefetch && ctx.order_frozen) {
    if (ParamGroup* next = next_in(ctx.backward_order, &g)) next->start_gather(true);
  }
}

void pre_forward(const std::shared_ptr<ParamGroup>& gp) {
  ParamGroup& g = *gp;
  Context& ctx = *g.context;
  // Activation checkpointing recomputes forward inside backward: no order, no forward prefetch.
  const bool recompute = autograd::in_backward();
  if (!ctx.order_frozen && !recompute) record_order(ctx.forward_order, &g);
  g.unshard();
  if (g.options.prefetch && ctx.order_frozen && !recompute) {
    if (ParamGroup* next = next_in(ctx.forward_order, &g)) next->start_gather(true);
  }
  std::vector<DistTensor> gathered = g.gathered_params();
  const std::vector<DistTensor> sharded = g.sharded_params();
  autograd::record("fsdp_all_gather", sharded, gathered,
                   [weak = std::weak_ptr<ParamGroup>(gp)](const std::vector<DistTensor>& grads) {
                     if (auto group = weak.lock()) reduce_gradients(group, grads);
                     return std::vector<DistTensor>();
                   });
  for (size_t i = 0; i < g.params.size(); ++i) g.module->swap_parameter(g.params[i].name, gathered[i]);
}

std::optional<DistTensor> post_forward(const std::shared_ptr<ParamGroup>& gp, const DistTensor& output) {
  ParamGroup& g = *gp;
  for (const ParamGroup::Param& p : g.params) g.module->swap_parameter(p.name, p.sharded);
  // Recomputation inside backward: the module's backward follows at once.
  if (!autograd::in_backward() && g.reshard_after_forward()) g.reshard();
  if (!output.defined() || !autograd::needs_grad({output})) return std::nullopt;
  std::vector<DistTensor> outs{DistTensor::from_local(output.to_local(), output.mesh(), output.placements(), output.shape())};
  autograd::record("fsdp_pre_backward", {output}, outs,
                   [weak = std::weak_ptr<ParamGroup>(gp)](const std::vector<DistTensor>& grads) {
                     if (auto group = weak.lock()) pre_backward(group);
                     return std::vector<DistTensor>{grads[0]};
                   });
  return outs[0];
}

}  // namespace

bool ParamGroup::is_root() const {
  std::shared_ptr<ParamGroup> root = context->root.lock();
  return root.get() == this;
}

void ParamGroup::start_gather(bool prefetch) {
  if (state != State::Sharded) return;
  TraceSpan span("fsdp_all_gather", "comm");
  for (Bucket& b : buckets) {
    if (!b.unsharded.defined()) {
      b.unsharded = Tensor::empty({b.layout.unsharded_numel()}, b.param_dtype);
    } else {
      b.unsharded.storage()->restore_memory();
    }
    Tensor send = b.shard;
    if (b.param_dtype != b.dtype) {
      if (options.stage == 3) {
        // Kept: forward and backward gather the same cast (refreshed after each step).
        if (!b.send.defined()) b.send = Tensor::empty({b.layout.region_numel()}, b.param_dtype);
        if (b.send_stale) b.send.copy_(b.shard);
        send = b.send;
      } else {
        b.send = b.shard.to(b.param_dtype);  // dropped when the gather finishes
        send = b.send;
      }
      b.send_stale = false;
    }
    b.gathered = Tensor::empty({ranks * b.layout.region_numel()}, b.param_dtype);
    b.gather = all_gather_async(shard_group(), send, b.gathered, 0);
    Context& ctx = *context;
    ++ctx.stats.all_gathers;
    if (prefetch) ++ctx.stats.prefetched_all_gathers;
  }
  state = State::Gathering;
}

void ParamGroup::finish_gather() {
  if (state != State::Gathering) return;
  for (Bucket& b : buckets) {
    {
      TraceSpan span("fsdp_all_gather_wait", "comm");
      const auto t0 = std::chrono::steady_clock::now();
      b.gather.wait();
      context->stats.all_gather_wait_seconds += seconds_since(t0);
    }
    TraceSpan span("fsdp_unpack_parameters", "compute");
    b.layout.unpack(b.gathered, b.unsharded);
    b.gathered = Tensor();
    b.gather = Work();
    if (options.stage != 3) b.send = Tensor();
  }
  state = State::Unsharded;
}

void ParamGroup::reshard() {
  finish_gather();
  if (state == State::Sharded) return;
  if (options.stage == 3) {
    for (Bucket& b : buckets) b.unsharded.storage()->release_memory();
  }
  state = State::Sharded;
}

std::vector<DistTensor> ParamGroup::gathered_params() const {
  std::vector<DistTensor> out;
  out.reserve(params.size());
  for (const Param& p : params) {
    const Bucket& b = buckets[p.bucket];
    out.push_back(DistTensor::from_local(b.layout.unsharded_view(b.unsharded, p.slot), mesh, p.unsharded,
                                         p.sharded.shape()));
  }
  return out;
}

// ---- fully_shard -------------------------------------------------------------------

namespace {

const char* kOp = "fully_shard";

std::string describe(const nn::Module& module, const std::vector<std::string>& names) {
  std::string text = "module " + type_name(module);
  if (!names.empty()) {
    text += " ('" + names.front() + "'";
    if (names.size() > 1) text += " and " + std::to_string(names.size() - 1) + " more parameters";
    text += ")";
  }
  return text;
}

int mesh_dim_of(const DeviceMesh& mesh, const std::string& name, const char* option, const std::string& label) {
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (mesh.names()[d] == name) return d;
  }
  std::string dims;
  for (const std::string& n : mesh.names()) dims += (dims.empty() ? "" : ", ") + n;
  throw std::invalid_argument(std::string("[") + kOp + "] " + label + ": option " + option + " '" + name +
                              "' is not a dim of mesh " + mesh.to_string() + " (its dims: " + dims + ")");
}

// The order that makes `shard_dim` the innermost of the mesh dims sharding dim 0.
int inner_order(const Placements& placements, int shard_dim) {
  int order = -1;
  bool other = false;
  for (int d = 0; d < static_cast<int>(placements.size()); ++d) {
    if (d == shard_dim || !placements[d].is_shard(0)) continue;
    other = true;
    order = std::max(order, placements[d].order());
  }
  return other ? order + 1 : 0;
}

}  // namespace

FSDPModule fully_shard(nn::Module& module, const DeviceMesh& mesh, const FSDPOptions& options) {
  // The parameters that sub-modules' fully_shard calls took.
  std::set<std::string> taken;
  std::vector<std::shared_ptr<ParamGroup>> children;
  for (auto& [name, m] : module.named_modules()) {
    if (name.empty()) continue;
    if (std::shared_ptr<ParamGroup> child = group_of(m)) {
      children.push_back(child);
      for (const ParamGroup::Param& p : child->params) taken.insert(name + "." + p.name);
    }
  }
  std::vector<std::pair<std::string, DistTensor>> named;
  std::vector<std::string> names;
  for (auto& [name, p] : module.named_parameters()) {
    if (taken.count(name)) continue;
    named.emplace_back(name, p);
    names.push_back(name);
  }
  const std::string label = describe(module, names);
  DT_CHECK_ARG(!group_of(&module), kOp, label, ": fully_shard was already applied to this module");
  DT_CHECK_ARG(options.stage >= 1 && options.stage <= 3, kOp, label, ": option stage must be 1, 2 or 3, got ",
               options.stage);
  DT_CHECK_ARG(mesh.defined() && mesh.is_member(), kOp, label, ": expected a mesh this rank belongs to");
  DT_CHECK_ARG(options.stage == 3 || !options.reshard_after_forward.value_or(false), kOp, label,
               ": option reshard_after_forward needs stage 3 (stages 1 and 2 keep the gathered parameters), got stage ",
               options.stage);
  for (const std::optional<DType>& d : {options.mixed_precision.param_dtype, options.mixed_precision.reduce_dtype}) {
    DT_CHECK_ARG(!d || is_floating(*d), kOp, label, ": mixed precision dtypes must be floating, got ",
                 dtype_name(*d));
  }
  auto group = std::make_shared<ParamGroup>();
  ParamGroup& g = *group;
  g.module = &module;
  g.options = options;
  g.label = label;
  g.mesh = mesh;
  g.shard_dim = mesh_dim_of(mesh, options.shard_dim, "shard_dim", label);
  if (!options.replicate_dim.empty()) {
    g.replicate_dim = mesh_dim_of(mesh, options.replicate_dim, "replicate_dim", label);
    DT_CHECK_ARG(g.replicate_dim != g.shard_dim, kOp, label, ": options shard_dim and replicate_dim are both '",
                 options.shard_dim, "'");
  }
  g.ranks = mesh.size(g.shard_dim);
  g.rank = mesh.coordinate(g.shard_dim);

  // Check every parameter before changing any.
  std::vector<DType> dtypes;
  std::vector<DistTensor> originals;  // aligned with g.params below
  for (const auto& [name, p] : named) {
    const auto& [first_name, first] = named.front();
    DT_CHECK_ARG(p.mesh() == first.mesh(), kOp, label, ": the parameters live on different meshes: '", first_name,
                 "' on ", first.mesh().to_string(), ", '", name, "' on ", p.mesh().to_string());
    if (!(p.mesh() == mesh)) {
      const bool same_world = p.mesh().world() == mesh.world();
      throw std::invalid_argument(std::string("[") + kOp + "] " + label + ": parameter '" + name +
                                  "' lives on mesh " + p.mesh().to_string() + ", the mesh given is " +
                                  mesh.to_string() +
                                  (same_world ? " (fully_shard needs the parameters' own mesh)"
                                              : " over another world (fully_shard needs the parameters' own mesh)"));
    }
    DT_CHECK_ARG(p.dim() >= 1, kOp, label, ": parameter '", name, "' is 0-d; FSDP shards dim 0");
    for (int d = 0; d < mesh.ndim(); ++d) {
      DT_CHECK_ARG(!p.placements()[d].is_partial(), kOp, label, ": parameter '", name, "' is ",
                   placements_to_string(p.placements()), "; a parameter cannot be Partial");
    }
    for (int d : {g.shard_dim, g.replicate_dim}) {
      if (d < 0) continue;
      DT_CHECK_ARG(p.placements()[d].is_replicate(), kOp, label, ": parameter '", name, "' is ",
                   placements_to_string(p.placements()), ", expected Replicate on mesh dim '", mesh.names()[d],
                   "' (is an enclosing module sharded already? apply fully_shard to sub-modules first)");
    }
    if (std::find(dtypes.begin(), dtypes.end(), p.dtype()) == dtypes.end()) dtypes.push_back(p.dtype());
  }

  // One bucket per dtype, in order of first appearance.
  for (DType dtype : dtypes) {
    ParamGroup::Bucket b;
    b.dtype = dtype;
    b.param_dtype = options.mixed_precision.param_dtype.value_or(dtype);
    b.reduce_dtype = options.mixed_precision.reduce_dtype.value_or(b.param_dtype);
    std::vector<Shape> shapes;
    std::vector<Tensor> locals;
    for (size_t i = 0; i < named.size(); ++i) {
      if (named[i].second.dtype() != dtype) continue;
      b.members.push_back(g.params.size());
      ParamGroup::Param p;
      p.name = named[i].first;
      p.unsharded = named[i].second.placements();
      p.bucket = g.buckets.size();
      p.slot = shapes.size();
      g.params.push_back(p);
      originals.push_back(named[i].second);
      shapes.push_back(named[i].second.to_local().shape());
      locals.push_back(named[i].second.to_local());
    }
    b.layout = FlatLayout(shapes, g.ranks, g.rank);
    b.shard = Tensor::empty({b.layout.region_numel()}, dtype);
    b.layout.scatter_into_region(locals, b.shard);
    b.grad_placements.resize(b.members.size());
    b.has_grad.assign(b.members.size(), false);
    g.buckets.push_back(std::move(b));
  }
  // The sharded leaves replace the replicated parameters in the module.
  for (size_t i = 0; i < g.params.size(); ++i) {
    ParamGroup::Param& p = g.params[i];
    const DistTensor& original = originals[i];
    Placements sharded = p.unsharded;
    sharded[g.shard_dim] = Shard(0, inner_order(p.unsharded, g.shard_dim));
    const ParamGroup::Bucket& b = g.buckets[p.bucket];
    p.sharded = DistTensor::from_local(b.layout.shard_view(b.shard, p.slot), mesh, sharded, original.shape());
    p.sharded.set_requires_grad(true);
    module.swap_parameter(p.name, p.sharded);
  }
  // One context for the whole tree: this module is its root.
  auto context = std::make_shared<Context>();
  context->root = group;
  context->groups.push_back(group);
  g.subtree.push_back(group);
  for (const std::shared_ptr<ParamGroup>& child : children) {
    for (const std::weak_ptr<ParamGroup>& weak : child->context->groups) {
      if (std::shared_ptr<ParamGroup> member = weak.lock()) {
        member->context = context;
        context->groups.push_back(member);
        g.subtree.push_back(member);
      }
    }
  }
  g.context = context;

  // The module's hooks own the group (the handle returned is optional to keep).
  g.hooks.push_back(module.register_forward_pre_hook([group](nn::Module&, const DistTensor&) { pre_forward(group); }));
  g.hooks.push_back(module.register_forward_post_hook(
      [group](nn::Module&, const DistTensor&, const DistTensor& out) { return post_forward(group, out); }));
  registry[&module] = group;
  return FSDPModule(group);
}

// ---- FSDPModule --------------------------------------------------------------------

namespace {

ParamGroup& checked(const std::shared_ptr<ParamGroup>& group, const char* op) {
  DT_CHECK_ARG(group != nullptr, op, "this FSDPModule handle is empty (made by its default constructor)");
  return *group;
}

template <class F>
void for_subtree(const ParamGroup& g, F&& fn) {
  for (const std::weak_ptr<ParamGroup>& weak : g.subtree) {
    if (std::shared_ptr<ParamGroup> member = weak.lock()) fn(*member);
  }
}

}  // namespace

nn::Module& FSDPModule::module() const { return *checked(group_, "FSDPModule").module; }
const FSDPOptions& FSDPModule::options() const { return checked(group_, "FSDPModule").options; }

std::vector<std::string> FSDPModule::parameter_names() const {
  std::vector<std::string> out;
  for (const ParamGroup::Param& p : checked(group_, "FSDPModule").params) out.push_back(p.name);
  return out;
}

int64_t FSDPModule::sharded_numel() const {
  int64_t n = 0;
  for (const ParamGroup::Bucket& b : checked(group_, "FSDPModule").buckets) n += b.layout.region_numel();
  return n;
}

void FSDPModule::unshard() { checked(group_, "FSDPModule::unshard").unshard(); }
void FSDPModule::reshard() { checked(group_, "FSDPModule::reshard").reshard(); }

void FSDPModule::set_requires_gradient_sync(bool sync) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) { g.sync = sync; });
}

void FSDPModule::set_reshard_after_backward(bool reshard) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) { g.reshard_after_backward = reshard; });
}

void FSDPModule::set_reshard_after_forward(bool reshard) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) { g.reshard_after_forward_override = reshard; });
}

void FSDPModule::set_accumulating(bool accumulating) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) {
    g.sync = !accumulating;
    g.reshard_after_backward = !accumulating;
    if (accumulating) {
      g.reshard_after_forward_override = false;
    } else {
      g.reshard_after_forward_override.reset();
    }
  });
}

void FSDPModule::finish_gradient_sync() {
  ParamGroup& g = checked(group_, "FSDPModule::finish_gradient_sync");
  progress_reductions(*g.context, true);
}

FSDPModule::NoSync::NoSync(const FSDPModule& module) : group_(module.group_) { FSDPModule(group_).set_accumulating(true); }
FSDPModule::NoSync::~NoSync() { FSDPModule(group_).set_accumulating(false); }

const FSDPStats& FSDPModule::stats() const { return checked(group_, "FSDPModule").context->stats; }

std::map<std::string, DistTensor> FSDPModule::state_dict(StateDictOptions options) const {
  ParamGroup& g = checked(group_, "FSDPModule::state_dict");
  NoGradGuard no_grad;
  std::map<std::string, DistTensor> out;
  for (auto& [name, p] : g.module->named_parameters()) {
    out[name] = options.full ? p.redistribute(Placements(p.mesh().ndim(), Replicate())) : p.detach();
  }
  return out;
}

void FSDPModule::load_state_dict(const std::map<std::string, DistTensor>& state) {
  ParamGroup& g = checked(group_, "FSDPModule::load_state_dict");
  NoGradGuard no_grad;
  std::set<std::string> seen;
  for (auto& [name, p] : g.module->named_parameters()) {
    auto it = state.find(name);
    DT_CHECK_ARG(it != state.end(), "FSDPModule::load_state_dict", "missing parameter '", name, "'");
    const DistTensor& value = it->second;
    DT_CHECK_ARG(value.shape() == p.shape(), "FSDPModule::load_state_dict", "parameter '", name,
                 "': expected shape ", p.shape(), ", got ", value.shape());
    const DistTensor moved = value.placements() == p.placements() ? value : value.redistribute(p.mesh(), p.placements());
    Tensor(p.to_local()).copy_(moved.to_local());
    seen.insert(name);
  }
  for (const auto& [name, _] : state) {
    DT_CHECK_ARG(seen.count(name), "FSDPModule::load_state_dict", "unexpected parameter '", name, "'");
  }
  for_subtree(g, [](ParamGroup& member) {
    member.reshard();
    member.state = ParamGroup::State::Sharded;
    for (ParamGroup::Bucket& b : member.buckets) b.send_stale = true;
  });
}

}  // namespace dtensor::parallel
