// FSDP groups at work: the hooks around a module's forward, the all-gather node
// whose backward reduce-scatters, prefetching, the reductions in flight and the end
// of backward.
//
// Per forward of a fully_shard'ed module:
//   pre-forward hook   wait for (or start) the module's all-gather, start the next
//                      modules' (prefetch), record one "fsdp_all_gather" node from the
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
// parameters: it frees the gathered parameters again, packs their gradients into one
// rank-major buffer and starts one reduce-scatter. Reductions finish one
// module later, the last at the end of backward (autograd::queue_callback).
#include "parallel/fsdp_group.h"

#include <algorithm>
#include <chrono>

#include "dtensor/autograd.h"
#include "dtensor/ops.h"
#include "dtensor/tensor_ops.h"
#include "dtensor/trace.h"

namespace dtensor::parallel {
namespace detail {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Starts the all-gathers of the `depth` modules after `current` in `order`.
void prefetch_after(const std::vector<ParamGroup*>& order, const ParamGroup* current, int depth) {
  auto it = std::find(order.begin(), order.end(), current);
  if (it == order.end()) return;
  for (++it; depth > 0 && it != order.end(); ++it, --depth) (*it)->start_gather(true);
}

void record_order(std::vector<ParamGroup*>& order, ParamGroup* group) {
  if (std::find(order.begin(), order.end(), group) == order.end()) order.push_back(group);
}

// Puts the reduced region of a finished reduction on the parameters as their
// gradients (accumulated into those already there).
void assign_gradients(ParamGroup& g, ParamGroup::Bucket& b, const Tensor& out) {
  // Offloaded: the reduced shard goes to the host, where the optimizer steps.
  Tensor region = g.offloaded() ? out.to(b.shard.device()) : out;
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
    const DistTensor moved =
        grad.placements() == existing.placements() ? grad : grad.redistribute(existing.placements());
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
    ctx.stats.reduce_scatter_wait_seconds += detail::seconds_since(t0);
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
  // One reduction in flight: the previous module's finishes now, after this module's
  // backward has run beside it, and before this module's packed gradients take memory.
  if (g.sync) progress_reductions(ctx, false);
  // The module's backward is over (this node runs after every use of its gathered
  // parameters): they go before the packed gradients are allocated, not after.
  if (g.reshard_after_backward && g.sync) g.reshard();
  for (size_t bi = 0; bi < g.buckets.size(); ++bi) {
    ParamGroup::Bucket& b = g.buckets[bi];
    bool any = b.grad_holds_sum;
    for (size_t idx : b.members) any |= grads[idx].defined();
    if (!any) continue;
    TraceSpan span("fsdp_pack_gradients", "compute");
    if (!b.grad_full.defined()) {
      b.grad_full = Tensor::empty({g.ranks * b.layout.region_numel()}, b.reduce_dtype, b.device);
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
    TraceSpan launch("fsdp_reduce_scatter", "comm");
    Context::Reduction r{gp, bi, Tensor::empty({b.layout.region_numel()}, b.reduce_dtype, b.device), Work(), false};
    r.work = reduce_scatter_async(g.shard_group(), b.grad_full, r.out, ReduceOp::Sum);
    ++ctx.stats.reduce_scatters;
    ctx.reductions.push_back(std::move(r));
    b.send_stale = true;  // the optimizer updates the shards after this backward
  }
}

void pre_backward(const std::shared_ptr<ParamGroup>& gp) {
  ParamGroup& g = *gp;
  Context& ctx = *g.context;
  ensure_end_of_backward(g.context);
  if (!ctx.order_frozen) record_order(ctx.backward_order, &g);
  g.unshard();
  if (ctx.order_frozen) prefetch_after(ctx.backward_order, &g, g.options.prefetch);
}

void refresh_device_shards(ParamGroup& group) {
  for (const std::weak_ptr<ParamGroup>& weak : group.subtree) {
    const std::shared_ptr<ParamGroup> member = weak.lock();
    if (!member || !member->offloaded()) continue;
    for (ParamGroup::Bucket& b : member->buckets) {
      TraceSpan copy("fsdp_shard_to_device", "comm");
      if (!b.send.defined()) b.send = Tensor::empty({b.layout.region_numel()}, b.param_dtype, b.device);
      b.send.copy_(b.shard);
      b.send_stale = false;
    }
  }
}

void mark_shards_changed(ParamGroup& group) {
  await_shard_writer(*group.context);
  for (const std::weak_ptr<ParamGroup>& weak : group.subtree) {
    if (const std::shared_ptr<ParamGroup> member = weak.lock()) {
      member->reshard();
      member->state = ParamGroup::State::Sharded;
      for (ParamGroup::Bucket& b : member->buckets) b.send_stale = true;
    }
  }
}

void pre_forward(const std::shared_ptr<ParamGroup>& gp) {
  ParamGroup& g = *gp;
  Context& ctx = *g.context;
  // Activation checkpointing recomputes forward inside backward: no order, no forward prefetch.
  const bool recompute = autograd::in_backward();
  if (!ctx.order_frozen && !recompute) record_order(ctx.forward_order, &g);
  g.unshard();
  if (ctx.order_frozen && !recompute) prefetch_after(ctx.forward_order, &g, g.options.prefetch);
  std::vector<DistTensor> gathered = g.gathered_params();
  const std::vector<DistTensor> sharded = g.sharded_params();
  autograd::record("fsdp_all_gather", sharded, gathered,
                   [weak = std::weak_ptr<ParamGroup>(gp)](const std::vector<DistTensor>& grads) {
                     if (auto group = weak.lock()) reduce_gradients(group, grads);
                     return std::vector<DistTensor>();
                   });
  for (size_t i = 0; i < g.params.size(); ++i) {
    const DistTensor previous = g.module->swap_parameter(g.params[i].name, gathered[i]);
    if (previous.impl() == g.params[i].sharded.impl()) continue;
    // Someone put another tensor in the shard's place (set_parameter, Module::to) after
    // fully_shard: the optimizer and this group still hold the shard.
    for (size_t k = 0; k <= i; ++k) {
      g.module->swap_parameter(g.params[k].name, k == i ? previous : g.params[k].sharded);
    }
    const std::string path = g.module->path();
    throw std::invalid_argument("[fully_shard] " + g.label + ": parameter '" +
                                (path.empty() ? g.params[i].name : path + "." + g.params[i].name) +
                                "' was replaced after fully_shard took it; change parameters (parallelize_module, "
                                "Module::to, set_parameter) before fully_shard");
  }
}

std::optional<DistTensor> post_forward(const std::shared_ptr<ParamGroup>& gp, const DistTensor& output) {
  ParamGroup& g = *gp;
  for (const ParamGroup::Param& p : g.params) g.module->swap_parameter(p.name, p.sharded);
  // Recomputation inside backward: the module's backward follows at once.
  if (!autograd::in_backward() && g.reshard_after_forward()) g.reshard();
  if (!output.defined() || !autograd::needs_grad({output})) return std::nullopt;
  std::vector<DistTensor> outs{
      DistTensor::from_local(output.to_local(), output.mesh(), output.placements(), output.shape())};
  autograd::record("fsdp_pre_backward", {output}, outs,
                   [weak = std::weak_ptr<ParamGroup>(gp)](const std::vector<DistTensor>& grads) {
                     if (auto group = weak.lock()) pre_backward(group);
                     return std::vector<DistTensor>{grads[0]};
                   });
  return outs[0];
}

}  // namespace detail

using detail::Context;
using detail::ParamGroup;

bool ParamGroup::is_root() const {
  std::shared_ptr<ParamGroup> root = context->root.lock();
  return root.get() == this;
}

void ParamGroup::start_gather(bool prefetch) {
  if (state != State::Sharded) return;
  TraceSpan span("fsdp_all_gather", "comm");
  for (Bucket& b : buckets) {
    Tensor send = b.shard;
    if (b.param_dtype != b.dtype || offloaded()) {
      // The shards cast to param_dtype on the device (offloaded: the host-to-device copy
      // of the updated shard). Stage 3 keeps it (forward and backward gather the same
      // one), refreshed in the first gather after each step; stages 1 and 2 drop it when
      // the gather finishes.
      if (b.send_stale || !b.send.defined()) {
        TraceSpan copy("fsdp_shard_to_device", "comm");
        detail::await_shard_writer(*context);
        if (!b.send.defined()) b.send = Tensor::empty({b.layout.region_numel()}, b.param_dtype, b.device);
        b.send.copy_(b.shard);
        b.send_stale = false;
      }
      send = b.send;
    } else {
      detail::await_shard_writer(*context);
    }
    b.gathered = Tensor::empty({ranks * b.layout.region_numel()}, b.param_dtype, b.device);
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
      context->stats.all_gather_wait_seconds += detail::seconds_since(t0);
    }
    TraceSpan span("fsdp_unpack_parameters", "compute");
    // The gathered parameters' memory comes back only now, so a prefetched module
    // holds one copy (the all-gather's output) until its turn, not two.
    if (!b.unsharded.defined()) {
      b.unsharded = Tensor::empty({b.layout.unsharded_numel()}, b.param_dtype, b.device);
    } else {
      b.unsharded.storage()->restore_memory();
    }
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
    out.push_back(
        DistTensor::from_local(b.layout.unsharded_view(b.unsharded, p.slot), mesh, p.unsharded, p.sharded.shape()));
  }
  return out;
}

}  // namespace dtensor::parallel
