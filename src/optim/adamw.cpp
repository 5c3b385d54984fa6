// AdamW: Adam with decoupled weight decay and bias correction (torch.optim.AdamW).
#include <cmath>

#include "backend/kernels.h"
#include "dtensor/optim.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {

namespace {

const AdamWOptions& checked(const AdamWOptions& o) {
  DT_CHECK_ARG(o.beta1 >= 0 && o.beta1 < 1, "AdamW", "expected 0 <= beta1 < 1, got ", o.beta1);
  DT_CHECK_ARG(o.beta2 >= 0 && o.beta2 < 1, "AdamW", "expected 0 <= beta2 < 1, got ", o.beta2);
  DT_CHECK_ARG(o.eps >= 0, "AdamW", "expected eps >= 0, got ", o.eps);
  DT_CHECK_ARG(o.weight_decay >= 0, "AdamW", "expected weight_decay >= 0, got ", o.weight_decay);
  return o;
}


}  // namespace

AdamW::AdamW(std::vector<DistTensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : AdamW(std::move(params), AdamWOptions{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                                             .weight_decay = weight_decay}) {}

AdamW::AdamW(std::vector<DistTensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr, options.master_weights, "AdamW"),
      options_(checked(options)) {}

std::vector<std::string> AdamW::zero_state_names() const { return {"exp_avg", "exp_avg_sq"}; }

Tensor AdamW::update(const Tensor& param, const Tensor& grad, const ParamState& state,
                     std::map<std::string, Tensor>& local_state) {
  const AdamWOptions& o = options_;
  Tensor m = local_state.at("exp_avg");
  Tensor v = local_state.at("exp_avg_sq");
  // The fused kernel updates param, m and v in place in one pass (F32 state, the
  // usual case, master weights included); returning param makes the caller's copy a
  // no-op. Other dtypes and layouts compose the same formulas from ops below.
  // A strided gradient (a transposed weight's, say) is made contiguous so that every
  // F32 parameter takes the one fused formula: mixing it with the composed one
  // below would round differently per layout.
  Tensor p = param;
  const backend::AdamWStep fused{lr(), o.beta1, o.beta2, o.eps, o.weight_decay, state.step};
  if (backend::kernels_for(param.device()).adamw_step(fused, p, grad.contiguous(), m, v)) return param;
  // Decoupled decay acts on the parameter before the Adam step, as PyTorch does.
  const Tensor decayed = o.weight_decay != 0 ? mul(param, 1.0 - lr() * o.weight_decay) : param;
  m.copy_(add(mul(m, o.beta1), mul(grad, 1.0 - o.beta1)));
  v.copy_(add(mul(v, o.beta2), mul(square(grad), 1.0 - o.beta2)));
  const double t = static_cast<double>(state.step);
  const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
  const double step_size = lr() / bias_correction1;
  const Tensor denom = add(div(sqrt(v), std::sqrt(bias_correction2)), o.eps);
  return sub(decayed, mul(div(m, denom), step_size));
}

}  // namespace dtensor
