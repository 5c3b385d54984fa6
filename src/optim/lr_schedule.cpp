// Learning-rate schedules: constant, and linear warmup followed by cosine decay.
#include <cmath>
#include <numbers>

#include "dtensor/optim.h"
#include "util/check.h"

namespace dtensor {

double LRSchedule::apply(Optimizer& optimizer, int64_t step) const {
  const double lr = lr_at(step);
  optimizer.set_lr(lr);
  return lr;
}

ConstantLR::ConstantLR(double lr) : lr_(lr) {
  DT_CHECK_ARG(std::isfinite(lr) && lr >= 0, "ConstantLR", "expected a learning rate >= 0, got ", lr);
}

double ConstantLR::lr_at(int64_t step) const {
  DT_CHECK_ARG(step >= 0, "ConstantLR", "expected step >= 0, got ", step);
  return lr_;
}

WarmupCosine::WarmupCosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : base_lr_(base_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  DT_CHECK_ARG(std::isfinite(base_lr) && base_lr >= 0, "WarmupCosine",
               "expected base_lr >= 0, got ", base_lr);
  DT_CHECK_ARG(min_lr >= 0 && min_lr <= base_lr, "WarmupCosine",
               "expected 0 <= min_lr <= base_lr (", base_lr, "), got ", min_lr);
  DT_CHECK_ARG(warmup_steps >= 0 && total_steps >= warmup_steps, "WarmupCosine",
               "expected 0 <= warmup_steps <= total_steps, got warmup_steps ", warmup_steps,
               " and total_steps ", total_steps);
}

double WarmupCosine::lr_at(int64_t step) const {
  DT_CHECK_ARG(step >= 0, "WarmupCosine", "expected step >= 0, got ", step);
  if (step < warmup_steps_) {
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  if (step >= total_steps_) return min_lr_;
  const double progress = static_cast<double>(step - warmup_steps_) /
                          static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ + 0.5 * (base_lr_ - min_lr_) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace dtensor
