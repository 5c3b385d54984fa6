// SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD).
#include <cmath>

#include "dtensor/optim.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {

namespace {

const SGDOptions& checked(const SGDOptions& o) {
  DT_CHECK_ARG(o.momentum >= 0, "SGD", "expected momentum >= 0, got ", o.momentum);
  DT_CHECK_ARG(o.weight_decay >= 0, "SGD", "expected weight_decay >= 0, got ", o.weight_decay);
  DT_CHECK_ARG(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD",
               "nesterov needs momentum > 0 and dampening == 0, got momentum ", o.momentum,
               " and dampening ", o.dampening);
  return o;
}

}  // namespace

SGD::SGD(std::vector<DistTensor> params, double lr, double momentum, double weight_decay, bool nesterov)
    : SGD(std::move(params),
          SGDOptions{.lr = lr, .momentum = momentum, .weight_decay = weight_decay, .nesterov = nesterov}) {}

SGD::SGD(std::vector<DistTensor> params, const SGDOptions& options)
    : Optimizer(std::move(params), options.lr, options.master_weights, "SGD"), options_(checked(options)) {}

std::vector<std::string> SGD::created_state_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

Tensor SGD::update(const Tensor& param, const Tensor& grad, const ParamState& state,
                   std::map<std::string, Tensor>& local_state) {
  Tensor d_p = options_.weight_decay != 0 ? add(grad, mul(param, options_.weight_decay)) : grad;
  if (options_.momentum != 0) {
    auto it = local_state.find("momentum_buffer");
    Tensor buf;
    if (it == local_state.end()) {
      // PyTorch starts the buffer at the first gradient, without dampening.
      buf = d_p.clone();
      local_state["momentum_buffer"] = buf;
    } else {
      buf = it->second;
      buf.copy_(add(mul(buf, options_.momentum), mul(d_p, 1.0 - options_.dampening)));
    }
    d_p = options_.nesterov ? add(d_p, mul(buf, options_.momentum)) : buf;
  }
  return sub(param, mul(d_p, lr()));
}

}  // namespace dtensor
