// layer_norm and rms_norm on DistTensors.
//
// Two paths, chosen so that x itself never moves:
// - normalized dims unsharded: the fused local kernel. Rule: pointwise over x's
//   letters with the normalized letters unshardable; weight and bias (those letters
//   only) are replicated. Backward: the fused local backward kernel; the weight and
//   bias gradients are sums over the local leading rows, so on mesh dims that shard
//   a leading dim of x they come out Partial(sum) (data / sequence parallelism's
//   gradient all-reduce then falls out of the ordinary rules), elsewhere Replicate.
// - a normalized dim sharded: distributed statistics from composite ops (mean over
//   the normalized dims -> Partial(sum), reduced by the rules of sub and add), so
//   x is never gathered; autograd comes from the composite.
#include "dist_tensor/step_plan_hooks.h"
#include "ops/nn_helpers.h"
#include "util/check.h"

namespace dtensor {

namespace {

struct NormSpec {
  const char* op;
  bool rms;
  Shape normalized_shape;
  std::optional<DistTensor> weight, bias;
  double eps;
};

// The checks of the local versions, on global shapes.
void validate(const DistTensor& x, const NormSpec& n) {
  DT_CHECK_ARG(x.defined(), n.op, "expected a defined input, got an undefined one");
  DT_CHECK_ARG(is_floating(x.dtype()), n.op, "expected a floating dtype for input, got ", dtype_name(x.dtype()));
  const int64_t k = static_cast<int64_t>(n.normalized_shape.size());
  DT_CHECK_ARG(k >= 1, n.op, "expected a non-empty normalized_shape, got ", n.normalized_shape);
  DT_CHECK_ARG(x.dim() >= k && Shape(x.shape().end() - k, x.shape().end()) == n.normalized_shape, n.op,
               "normalized_shape ", n.normalized_shape, " does not match the trailing dims of the input ",
               x.shape());
  for (const auto& [p, what] : {std::pair{&n.weight, "weight"}, std::pair{&n.bias, "bias"}}) {
    if (!*p) continue;
    DT_CHECK_ARG((*p)->defined() && is_floating((*p)->dtype()), n.op, "expected a defined floating ", what);
    DT_CHECK_ARG((*p)->shape() == n.normalized_shape, n.op, "expected ", what, " of shape ", n.normalized_shape,
                 ", got ", (*p)->shape());
    dispatch::common_mesh({x, **p}, n.op);
  }
}

DistTensor fused(const DistTensor& x, const NormSpec& n) {
  const int64_t lead = x.dim() - static_cast<int64_t>(n.normalized_shape.size());
  const std::string in = ops::letters(x.dim());
  dispatch::EinsumSpec spec;
  spec.inputs = {in};
  spec.output = in;
  spec.unshardable = in.substr(static_cast<size_t>(lead));
  std::vector<DistTensor> inputs{x};
  for (const auto* p : {&n.weight, &n.bias}) {
    if (!*p) continue;
    inputs.push_back(**p);
    spec.inputs.push_back(spec.unshardable);
  }
  // The strategy depends only on the layouts (the cache key has them), not on eps.
  const ops::Placed placed = ops::place_inputs(n.op, {}, inputs, spec);
  const Tensor& x_local = placed.locals[0];
  const std::optional<Tensor> w_local = n.weight ? std::optional<Tensor>(placed.locals[1]) : std::nullopt;
  const std::optional<Tensor> b_local =
      n.bias ? std::optional<Tensor>(placed.locals.back()) : std::nullopt;
  NormResult saved = n.rms ? rms_norm(x_local, n.normalized_shape, w_local, n.eps)
                           : layer_norm(x_local, n.normalized_shape, w_local, b_local, n.eps);
  const Placements out_placements = placed.strategy.output;
  DistTensor out = dispatch::wrap(saved.out, x.mesh(), out_placements, x.shape());
  if (!autograd::needs_grad(inputs)) return out;
  saved.out = Tensor();  // the backward kernels read only the statistics
  // Parameter gradients sum the local rows: Partial(sum) where the rows are split.
  Placements parameter_placements(out_placements.size(), Replicate());
  for (size_t m = 0; m < out_placements.size(); ++m) {
    if (out_placements[m].is_shard()) parameter_placements[m] = Partial();
  }
  const NormSpec spec_copy{n.op, n.rms, n.normalized_shape, std::nullopt, std::nullopt, n.eps};
  const bool has_weight = n.weight.has_value(), has_bias = n.bias.has_value();
  return ops::with_grad(out, n.op, inputs, [=](const std::vector<DistTensor>& g) {
    const DistTensor grad = g[0].redistribute(out_placements);  // free when already there
    const NormGrads r = spec_copy.rms
                            ? rms_norm_backward(grad.to_local(), x_local, saved, spec_copy.normalized_shape, w_local)
                            : layer_norm_backward(grad.to_local(), x_local, saved, spec_copy.normalized_shape,
                                                  w_local, has_bias);
    const DeviceMesh& mesh = grad.mesh();
    std::vector<DistTensor> grads{dispatch::wrap(r.grad_input, mesh, out_placements, grad.shape())};
    if (has_weight)
      grads.push_back(dispatch::wrap(r.grad_weight, mesh, parameter_placements, spec_copy.normalized_shape));
    if (has_bias) grads.push_back(dispatch::wrap(r.grad_bias, mesh, parameter_placements, spec_copy.normalized_shape));
    return grads;
  });
}

// Statistics over the normalized dims from composite ops (each mean is one
// all-reduce of the leading-dims-sized sums; x keeps its layout).
DistTensor distributed(const DistTensor& x_in, const NormSpec& n) {
  const DistTensor x = ops::without_partials(x_in);
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - static_cast<int64_t>(n.normalized_shape.size()); d < x.dim(); ++d) dims.push_back(d);
  // Each statistic is all-reduced explicitly rather than left to the greedy
  // per-op choice (which may split it into a reduce-scatter and an all-gather).
  auto statistic = [&](const DistTensor& t) { return ops::without_partials(mean(t, dims, true)); };
  DistTensor out;
  if (n.rms) {
    out = mul(x, rsqrt(add(statistic(square(x)), n.eps)));
  } else {
    const DistTensor centered = sub(x, statistic(x));
    out = mul(centered, rsqrt(add(statistic(square(centered)), n.eps)));
  }
  if (n.weight) out = mul(out, *n.weight);
  if (n.bias) out = add(out, *n.bias);
  return out;
}

DistTensor normalize(const DistTensor& x, const NormSpec& n) {
  validate(x, n);
  const int64_t lead = x.dim() - static_cast<int64_t>(n.normalized_shape.size());
  step_plan::keep_decision(x, [lead, dim = x.dim()](const Placements& p) {  // the path: a plan keeps to it
    for (int64_t d = lead; d < dim; ++d) {
      if (ops::is_sharded_on(p, d)) return true;
    }
    return false;
  });
  for (int64_t d = lead; d < x.dim(); ++d) {
    if (ops::is_sharded_on(x.placements(), d)) return distributed(x, n);
  }
  return fused(x, n);
}

}  // namespace

DistTensor layer_norm(const DistTensor& x, const Shape& normalized_shape, const std::optional<DistTensor>& weight,
                      const std::optional<DistTensor>& bias, double eps) {
  return normalize(x, NormSpec{"layer_norm", false, normalized_shape, weight, bias, eps});
}

DistTensor rms_norm(const DistTensor& x, const Shape& normalized_shape, const std::optional<DistTensor>& weight,
                    double eps) {
  return normalize(x, NormSpec{"rms_norm", true, normalized_shape, weight, std::nullopt, eps});
}

}  // namespace dtensor
