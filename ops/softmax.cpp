// softmax and log_softmax on DistTensors.
//
// Two paths, chosen so that x itself never moves:
// - dim unsharded on every mesh dim: the fused local kernel. Rule: pointwise with
//   the softmax letter unshardable (other dims keep their sharding; a Partial input
//   is reduced first, softmax is not linear). Backward: the fused local backward
//   kernel run as a pointwise op of (grad, out).
// - dim sharded: a composite that never gathers x: m = amax(x) (Partial(max),
//   all-reduced by the rule of sub), e = exp(x - m), s = sum(e) (Partial(sum),
//   all-reduced by the rule of div or log), out = e / s or x - m - log(s). Two
//   all-reduces of the reduced-size statistics; autograd comes from the composite.
#include "ops/nn_helpers.h"
#include "util/check.h"

namespace dtensor {

namespace {

dispatch::EinsumSpec along_dim_spec(int64_t ndim, int64_t dim, size_t inputs) {
  const std::string in = ops::letters(ndim);
  dispatch::EinsumSpec spec;
  spec.inputs.assign(inputs, in);
  spec.output = in;
  if (ndim > 0) spec.unshardable = std::string(1, in[static_cast<size_t>(dim)]);
  return spec;
}

DistTensor fused_backward(bool log_form, const DistTensor& grad, const DistTensor& out, int64_t dim) {
  // Both backward kernels are linear in the incoming gradient: a Partial one passes
  // through (reduced later, if at all).
  dispatch::EinsumSpec spec = along_dim_spec(out.dim(), dim, 2);
  spec.partial = dispatch::PartialRule::OneOf;
  spec.partial_inputs = {true, false};
  return ops::run_einsum(log_form ? "log_softmax_backward" : "softmax_backward", {dim}, {grad, out}, spec,
                         out.shape(),
                         [log_form, dim](const std::vector<Tensor>& l) {
                           return log_form ? log_softmax_backward(l[0], l[1], dim) : softmax_backward(l[0], l[1], dim);
                         });
}

DistTensor fused(bool log_form, const DistTensor& a, int64_t dim) {
  const char* op = log_form ? "log_softmax" : "softmax";
  DistTensor out = ops::run_einsum(op, {dim}, {a}, along_dim_spec(a.dim(), dim, 1), a.shape(),
                                   [log_form, dim](const std::vector<Tensor>& l) {
                                     return log_form ? log_softmax(l[0], dim) : softmax(l[0], dim);
                                   });
  if (!autograd::needs_grad({a})) return out;
  const DistTensor saved = out.detach();
  return ops::with_grad(out, op, {a}, [log_form, dim, saved](const std::vector<DistTensor>& g) {
    return std::vector<DistTensor>{fused_backward(log_form, g[0], saved, dim)};
  });
}

DistTensor distributed(bool log_form, const DistTensor& a, int64_t dim) {
  const DistTensor x = ops::without_partials(a);
  // softmax(x) = softmax(x - c) for any c constant along dim: the max is only for
  // range, and treating it as a constant gives the exact gradient without amax's
  // backward (and its collectives).
  // The statistics are all-reduced explicitly (Megatron's pattern): left to each
  // op's greedy choice, a Partial input of log may become a reduce-scatter plus an
  // all-gather, the same bytes in twice the collectives.
  const DistTensor m = ops::without_partials(amax(x.detach(), {dim}, true));
  const DistTensor shifted = sub(x, m);
  const DistTensor e = exp(shifted);
  const DistTensor s = ops::without_partials(sum(e, {dim}, true));
  return log_form ? sub(shifted, log(s)) : div(e, s);
}

DistTensor run(bool log_form, const DistTensor& a, int64_t dim_in) {
  const char* op = log_form ? "log_softmax" : "softmax";
  DT_CHECK_ARG(a.defined(), op, "expected a defined DistTensor, got an undefined one");
  DT_CHECK_ARG(is_floating(a.dtype()), op, "expected a floating dtype, got ", dtype_name(a.dtype()));
  const int64_t dim = normalize_dim(dim_in, a.dim(), op);
  if (a.dim() > 0 && ops::is_sharded_on(a.placements(), dim)) return distributed(log_form, a, dim);
  return fused(log_form, a, dim);
}

}  // namespace

DistTensor softmax(const DistTensor& a, int64_t dim) { return run(false, a, dim); }
DistTensor log_softmax(const DistTensor& a, int64_t dim) { return run(true, a, dim); }

}  // namespace dtensor
