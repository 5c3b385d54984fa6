// The fused AdamW step's per-element math (internal), shared by the CUDA kernel
// (cuda/optim.cu) and the CPU tests, which check it against the CPU's vector kernel
// (cpu/vec_impl.h adamw, whose SIMD lines are this sequence of float operations: an
// ISA-flagged translation unit must not call shared inline functions, see
// cpu/vec_math.h). The constants are derived once per step on the host as
// cpu/optim.cpp does: in double, then rounded to float.
#pragma once

#include <cmath>

#include "backend/kernels.h"
#include "backend/scalar_ops.h"

namespace dtensor::backend {

// Whether the fused kernels take these operands (else the caller composes the update):
// param, exp_avg, exp_avg_sq contiguous F32 of one shape, grad contiguous F32 or BF16
// of that shape.
inline bool adamw_fusable(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  for (const Tensor* t : {&param, &exp_avg, &exp_avg_sq}) {
    if (t->dtype() != DType::F32 || !t->is_contiguous() || t->shape() != param.shape()) return false;
  }
  return (grad.dtype() == DType::F32 || grad.dtype() == DType::BF16) && grad.is_contiguous() &&
         grad.shape() == param.shape();
}

// The float constants of one AdamW step.
struct AdamWFactors {
  float beta1 = 0, beta2 = 0, eps = 0;
  float decay = 1;                      // 1 - lr * weight_decay
  float step_size = 0;                  // lr / (1 - beta1^t)
  float inv_sqrt_bias_correction2 = 1;  // 1 / sqrt(1 - beta2^t)
};

inline AdamWFactors adamw_factors(const AdamWStep& step) {
  const double t = static_cast<double>(step.step);
  const float lr = static_cast<float>(step.lr), weight_decay = static_cast<float>(step.weight_decay);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(step.beta1, t));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(step.beta2, t));
  AdamWFactors f;
  f.beta1 = static_cast<float>(step.beta1);
  f.beta2 = static_cast<float>(step.beta2);
  f.eps = static_cast<float>(step.eps);
  f.decay = 1.0f - lr * weight_decay;
  f.step_size = lr / bias_correction1;
  f.inv_sqrt_bias_correction2 = 1.0f / std::sqrt(bias_correction2);
  return f;
}

// One element of torch.optim.AdamW (decoupled weight decay) in place: the moments
// first, then p = p * decay - step_size * m / (sqrt(v) / sqrt(bc2) + eps).
DT_HOST_DEVICE inline void adamw_update(const AdamWFactors& f, float& p, float g, float& m, float& v) {
  using std::sqrt;
  m = f.beta1 * m + (1.0f - f.beta1) * g;
  v = f.beta2 * v + (1.0f - f.beta2) * (g * g);
  const float denom = sqrt(v) * f.inv_sqrt_bias_correction2 + f.eps;
  p = p * f.decay - f.step_size * (m / denom);
}

}  // namespace dtensor::backend
