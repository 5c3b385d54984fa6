// cross_entropy on DistTensors: logits [N..., C], integer targets [N...] (any number
// of leading dims: [B, T, V] logits need no reshape, which would move them when both
// B and T are sharded, as under data x context parallelism).
//
// Two paths, chosen so that the logits never move:
// - class dim unsharded: the fused local kernel per row (rows may be sharded),
//   rule "nc,n->n" with c unshardable; backward: the fused local backward kernel
//   (softmax - onehot, scaled by the row's upstream gradient).
// - class dim sharded (Megatron's vocab-parallel loss), never gathering the
//   logits: the global row max via amax (Partial(max), all-reduced by sub), the
//   sum of exponentials via sum (Partial(sum), all-reduced by log), and the target
//   logit picked by the rank that owns its class (a masked local pick ->
//   Partial(sum)). Autograd comes from the composite; the pick's backward scatters
//   the gradient into the owner's shard, so the logits' gradient is
//   softmax - onehot in the logits' layout.
// The reduction runs on DistTensors: Mean divides the sum of per-row losses by the
// global number of targets that are not ignore_index.
#include "dist_tensor/step_plan_hooks.h"
#include "ops/nn_helpers.h"
#include "util/check.h"

namespace dtensor {

namespace {

const char* const kOp = "cross_entropy";

Shape rows_shape(const DistTensor& logits) { return Shape(logits.shape().begin(), logits.shape().end() - 1); }

void validate(const DistTensor& logits, const DistTensor& targets) {
  dispatch::common_mesh({logits, targets}, kOp);
  DT_CHECK_ARG(is_floating(logits.dtype()), kOp, "expected floating logits, got ", dtype_name(logits.dtype()));
  DT_CHECK_ARG(targets.dtype() == DType::I64 || targets.dtype() == DType::I32, kOp,
               "expected targets of dtype i64 or i32, got ", dtype_name(targets.dtype()));
  DT_CHECK_ARG(logits.dim() >= 2, kOp, "expected logits [N..., C], got ", logits.shape());
  DT_CHECK_ARG(targets.shape() == rows_shape(logits), kOp, "expected targets ", rows_shape(logits), " for logits ",
               logits.shape(), ", got ", targets.shape());
}

// "abz,ab->ab": logits rows (leading dims) and classes (z), targets rows, one value
// per row.
dispatch::EinsumSpec rows_spec(const DistTensor& logits) {
  const std::string rows = ops::letters(logits.dim() - 1);
  dispatch::EinsumSpec spec;
  spec.inputs = {rows + "z", rows};
  spec.output = rows;
  return spec;
}

// Per-row losses with the fused local kernels (ignored rows give 0).
DistTensor fused_rows(const DistTensor& logits, const DistTensor& targets, int64_t ignore_index) {
  dispatch::EinsumSpec spec = rows_spec(logits);
  spec.unshardable = std::string(1, 'z');
  const ops::Placed placed = ops::place_inputs("cross_entropy_rows", {}, {logits, targets}, spec);
  const Tensor logits_local = placed.locals[0], targets_local = placed.locals[1];
  const Placements out_layout = placed.strategy.output;
  // The local kernels take [rows, C].
  const int64_t classes = logits.size(-1);
  const Tensor logits_2d = logits_local.reshape({-1, classes}), targets_1d = targets_local.reshape({-1});
  DistTensor rows = dispatch::wrap(
      cross_entropy(logits_2d, targets_1d, LossReduction::None, ignore_index).reshape(targets_local.shape()),
      logits.mesh(), out_layout, rows_shape(logits));
  if (!autograd::needs_grad({logits})) return rows;
  const Placements logits_layout = placed.strategy.inputs[0];
  const Shape logits_shape = logits.shape();
  return ops::with_grad(rows, kOp, {logits, targets}, [=](const std::vector<DistTensor>& g) {
    const DistTensor grad = g[0].redistribute(out_layout);  // free when already there
    const Tensor local =
        cross_entropy_backward(grad.to_local().reshape({-1}), logits_2d, targets_1d, LossReduction::None, ignore_index)
            .reshape(logits_local.shape());
    return std::vector<DistTensor>{dispatch::wrap(local, grad.mesh(), logits_layout, logits_shape), DistTensor()};
  });
}

// x[n, targets[n]] (0 where the target is not a class), rule "nc,n->n": with the
// class dim sharded each rank picks only the targets in its class range and the
// result is Partial(sum). Linear in x, so a Partial x passes through.
DistTensor pick(const DistTensor& x, const DistTensor& targets) {
  dispatch::EinsumSpec spec = rows_spec(x);
  spec.partial = dispatch::PartialRule::OneOf;
  spec.partial_inputs = {true, false};
  const ops::Placed placed = ops::place_inputs("cross_entropy_pick", {}, {x, targets}, spec);
  const Tensor& x_local = placed.locals[0];
  const int64_t offset = ops::shard_offset(x.mesh(), x.shape(), placed.strategy.inputs[0], x.dim() - 1);
  const Tensor classes =
      add(Tensor::arange(x_local.size(-1), DType::I64, x_local.device()), static_cast<double>(offset));
  const Tensor hit = eq(placed.locals[1].to(DType::I64).unsqueeze(-1), classes);
  const Tensor zero = Tensor::full({}, 0.0, x_local.dtype(), x_local.device());
  const Placements out_layout = placed.strategy.output;
  DistTensor out = dispatch::wrap(sum(where(hit, x_local, zero), {-1}), x.mesh(), out_layout, rows_shape(x));
  if (!autograd::needs_grad({x})) return out;
  const Placements grad_layout = ops::partials_replicated(out_layout);
  const Placements x_grad_layout = ops::partials_replicated(placed.strategy.inputs[0]);
  const Shape x_shape = x.shape();
  return ops::with_grad(out, "cross_entropy_pick", {x, targets}, [=](const std::vector<DistTensor>& g) {
    const DistTensor grad = g[0].redistribute(grad_layout);  // free when already there
    const Tensor local = where(hit, grad.to_local().unsqueeze(-1), zero);
    return std::vector<DistTensor>{dispatch::wrap(local, grad.mesh(), x_grad_layout, x_shape), DistTensor()};
  });
}

// The vocab-parallel per-row losses (0 on ignored rows).
DistTensor vocab_parallel_rows(const DistTensor& logits_in, const DistTensor& targets, int64_t ignore_index) {
  // The fused kernel checks targets; the composite checks each rank's own ones (a
  // target outside [0, C) would otherwise be picked by no rank and go unnoticed).
  const Tensor t = targets.to_local().to(DType::I64);
  if (t.numel() > 0) {
    const Tensor zero = Tensor::full({}, 0.0, DType::I64, t.device());
    const Tensor counted = where(binary(BinaryOp::Ne, t, static_cast<double>(ignore_index)), t, zero);
    const int64_t low = amin(counted).item<int64_t>(), high = amax(counted).item<int64_t>();
    DT_CHECK_ARG(low >= 0 && high < logits_in.size(-1), kOp, "expected targets in [0, ", logits_in.size(-1),
                 ") or equal to ignore_index ", ignore_index, ", got targets in [", low, ", ", high, "]");
  }
  const DistTensor x = ops::without_partials(logits_in);
  // log-sum-exp is shift invariant: the max is a constant for autograd (exact
  // gradient, and no backward through amax).
  // Three all-reduces of [N]-sized values, issued explicitly (Megatron's pattern)
  // rather than left to each op's greedy choice, which may split one into a
  // reduce-scatter and an all-gather.
  const DistTensor shifted = sub(x, ops::without_partials(amax(x.detach(), {-1}, true)));
  const DistTensor log_sum_exp = log(ops::without_partials(sum(exp(shifted), {-1})));
  const DistTensor rows = sub(log_sum_exp, ops::without_partials(pick(shifted, targets)));
  return mul(rows, ops::cast(binary(BinaryOp::Ne, targets, static_cast<double>(ignore_index)), rows.dtype()));
}

}  // namespace

DistTensor cross_entropy(const DistTensor& logits, const DistTensor& targets, LossReduction reduction,
                         int64_t ignore_index) {
  validate(logits, targets);
  step_plan::keep_decision(logits, [last = logits.dim() - 1](const Placements& p) {  // the path: a plan keeps to it
    return ops::is_sharded_on(p, last);
  });
  const DistTensor rows = ops::is_sharded_on(logits.placements(), logits.dim() - 1)
                              ? vocab_parallel_rows(logits, targets, ignore_index)
                              : fused_rows(logits, targets, ignore_index);
  switch (reduction) {
    case LossReduction::None: return rows;
    case LossReduction::Sum: return sum(rows);
    case LossReduction::Mean: break;
  }
  // All rows ignored gives 0/0 = NaN, as the local op and PyTorch.
  const DistTensor counted = sum(ops::cast(binary(BinaryOp::Ne, targets, static_cast<double>(ignore_index)), rows.dtype()));
  return div(sum(rows), counted);
}

}  // namespace dtensor
