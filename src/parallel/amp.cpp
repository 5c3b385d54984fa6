// Dynamic loss scaling.
#include <algorithm>
#include <cmath>

#include "dtensor/amp.h"
#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor {

DistTensor LossScaler::scale(const DistTensor& loss) const { return mul(loss, scale_); }

bool LossScaler::unscale_and_check(const std::vector<DistTensor>& params, const Group* group) {
  bool local_inf = false;
  const DeviceMesh* mesh = nullptr;
  for (const DistTensor& p : params) {
    const DistTensor g = p.grad();
    if (!g.defined()) continue;
    mesh = &p.mesh();
    Tensor local = g.to_local();
    local.copy_(mul(local, 1.0 / scale_));
    // The largest and smallest are finite exactly when every element is (a NaN wins
    // both, as in torch.amax): no copy (an FP64 copy of every gradient doubled its
    // memory), and no sum to overflow on finite values.
    if (local.numel() == 0) continue;
    local_inf |= !std::isfinite(amax(local).item<double>()) || !std::isfinite(amin(local).item<double>());
  }
  found_inf_ = local_inf;
  if (group || mesh) {
    Tensor flag = Tensor::full({1}, local_inf ? 1.0 : 0.0);
    all_reduce_(group ? *group : mesh->group(), flag, ReduceOp::Max);
    found_inf_ = flag.item<float>() > 0;
  }
  return !found_inf_;
}

void LossScaler::load_state(const LossScalerState& state) {
  DT_CHECK_ARG(std::isfinite(state.scale) && state.scale > 0 && state.clean_steps >= 0 && state.skipped_steps >= 0,
               "LossScaler::load_state", "expected a finite scale > 0 and counts >= 0, got scale ", state.scale,
               ", clean_steps ", state.clean_steps, ", skipped_steps ", state.skipped_steps);
  scale_ = state.scale;
  clean_steps_ = state.clean_steps;
  skipped_ = state.skipped_steps;
  found_inf_ = false;
}

void LossScaler::update() {
  if (found_inf_) {
    scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    clean_steps_ = 0;
    ++skipped_;
  } else if (++clean_steps_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_steps_ = 0;
  }
  found_inf_ = false;
}

}  // namespace dtensor
