// Activation checkpointing through a recording node whose backward recomputes.
#include "dtensor/nn/checkpoint.h"

#include "dtensor/autograd.h"
#include "dtensor/nn/layers.h"
#include "dtensor/ops.h"

namespace dtensor::nn {
namespace {

// The dropout counters inside `module`, to replay the same masks.
std::vector<std::pair<Dropout*, uint64_t>> dropout_state(Module& module) {
  std::vector<std::pair<Dropout*, uint64_t>> state;
  for (auto& [_, m] : module.named_modules()) {
    if (auto* d = dynamic_cast<Dropout*>(m)) state.emplace_back(d, d->calls());
  }
  return state;
}

}  // namespace

DistTensor checkpoint(Module& module, const DistTensor& x) {
  std::vector<DistTensor> inputs{x};
  for (const DistTensor& p : module.parameters()) inputs.push_back(p);
  if (!autograd::needs_grad(inputs)) return module(x);

  const auto rng = dropout_state(module);
  // The recomputation runs in backward, outside the caller's mixed-precision and
  // context-parallel scopes.
  const std::optional<DType> compute = ComputeDtype::current();
  const std::optional<ContextParallelOptions> context = ContextParallelScope::current();
  DistTensor out;
  {
    NoGradGuard no_grad;  // nothing inside the module is saved
    out = module(x);
  }
  const DistTensor saved_x = x.detach();
  const bool x_needs_grad = x.requires_grad();
  const size_t num_params = inputs.size() - 1;
  std::vector<DistTensor> outs{out};
  autograd::record(
      "checkpoint", inputs, outs,
      [&module, saved_x, x_needs_grad, rng, num_params, compute, context](const std::vector<DistTensor>& g) {
        for (const auto& [dropout, calls] : rng) dropout->set_calls(calls);
        DistTensor x_again = saved_x.detach();
        if (x_needs_grad) x_again.set_requires_grad();
        // Recompute with recording on, then run the inner backward: the parameters'
        // gradients accumulate (and their hooks fire) there.
        GradModeGuard recording(true);
        std::optional<ComputeDtype> precision;
        if (compute) precision.emplace(*compute);
        std::optional<ContextParallelScope> sequence_order;
        if (context) sequence_order.emplace(*context);
        DistTensor y = module(x_again);
        backward(y, g[0]);
        std::vector<DistTensor> grads{x_needs_grad ? x_again.grad() : DistTensor()};
        grads.resize(1 + num_params);
        return grads;
      });
  return outs[0];
}

}  // namespace dtensor::nn
