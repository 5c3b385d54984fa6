// The per-row scalar math of softmax, the norms and cross entropy, shared by the
// CPU's scalar loops (cpu/nn.cpp) and the CUDA row kernels (cuda/softmax.cu,
// norm.cu, cross_entropy.cu), so that the CPU suites test the formulas the GPU runs.
//
// A row kernel reduces its row to a few statistics (maximum, sums accumulated in
// double) and then maps each element through one of these functions. C is the
// compute type: float for F32/BF16/F16 storage, double for F64; the statistics are
// rounded to C once, exactly where the CPU rounds them.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/scalar_ops.h"  // DT_HOST_DEVICE, scalar::reduce_max

namespace dtensor::backend::row {

// ---- softmax / log_softmax ----------------------------------------------------------
// With m the row maximum (NaN wins: scalar::reduce_max) and total = sum exp(x - m)
// in double: softmax = exp(x - m) / total, log_softmax = (x - m) - log(total). A row
// of -inf (m = -inf) or holding +inf gives NaN everywhere (-inf - -inf, inf - inf),
// a NaN anywhere in the row gives NaN everywhere, as on the CPU.

template <class C>
DT_HOST_DEVICE C shifted_exp(C x, C m) {
  using std::exp;
  return exp(C(x - m));
}
template <class C>
DT_HOST_DEVICE C softmax_scale(double total) {
  return static_cast<C>(1.0 / total);
}
template <class C>
DT_HOST_DEVICE C log_softmax_shift(double total) {
  using std::log;
  return static_cast<C>(log(total));
}
template <class C>
DT_HOST_DEVICE C softmax_value(C exp_shifted, C scale) {
  return exp_shifted * scale;
}
template <class C>
DT_HOST_DEVICE C log_softmax_value(C x, C m, C log_total) {
  return C(x - m) - log_total;
}

// Backward of y = softmax(x): dx = y * (g - dot), dot = sum g * y (products in C,
// summed in double). Of y = log_softmax(x): dx = g - exp(y) * total, total = sum g.
template <class C>
DT_HOST_DEVICE C softmax_grad(C g, C y, C dot) {
  return y * (g - dot);
}
template <class C>
DT_HOST_DEVICE C log_softmax_grad(C g, C y, C total) {
  using std::exp;
  return g - exp(y) * total;
}

// ---- layer_norm / rms_norm ----------------------------------------------------------
// Over a row of `cols`: mean = sum x / cols (0 for rms_norm), spread = sum (x - mean)^2
// in double; rstd = 1 / sqrt(spread / cols + eps) rounded to C once.

DT_HOST_DEVICE inline double norm_mean(double sum, int64_t cols) { return sum / static_cast<double>(cols); }
DT_HOST_DEVICE inline double norm_deviation_sq(double x, double mean) {
  const double d = x - mean;
  return d * d;
}
template <class C>
DT_HOST_DEVICE C norm_rstd(double spread, int64_t cols, double eps) {
  using std::sqrt;
  return static_cast<C>(1.0 / sqrt(spread / static_cast<double>(cols) + eps));
}
// y = (x - mean) * rstd, times the weight and plus the bias where present.
template <class C>
DT_HOST_DEVICE C norm_value(C x, C mean, C rstd, const C* weight, const C* bias) {
  C v = (x - mean) * rstd;
  if (weight) v *= *weight;
  if (bias) v += *bias;
  return v;
}
// Backward: xhat = (x - mean) * rstd, ghat = g * weight (g without a weight);
// dx = rstd * (ghat - mean(ghat) - xhat * mean(ghat * xhat)), the mean(ghat) term
// coming from centring (0 for rms_norm). Weight gradient: sum over rows of g * xhat;
// bias gradient: sum of g (each term rounded to C, summed in double).
template <class C>
DT_HOST_DEVICE C norm_xhat(C x, C mean, C rstd) {
  return (x - mean) * rstd;
}
template <class C>
DT_HOST_DEVICE C norm_grad(C rstd, C ghat, C mean_ghat, C xhat, C mean_ghat_xhat) {
  return rstd * (ghat - mean_ghat - xhat * mean_ghat_xhat);
}

// ---- cross entropy ------------------------------------------------------------------
// With m the row maximum and lse = log(sum exp(x - m)) rounded to C: the loss of
// target t is lse + m - x[t] (in double), the gradient of class c is
// g * (p - [c == t]) with p = exp(x - m - lse).
template <class C>
DT_HOST_DEVICE double cross_entropy_loss(C lse, C m, C x_target) {
  return static_cast<double>(lse) + m - x_target;
}
template <class C>
DT_HOST_DEVICE C cross_entropy_grad(C g, C x, C m, C lse, bool is_target) {
  using std::exp;
  const C p = exp(x - m - lse);
  return g * (is_target ? p - C(1) : p);
}

}  // namespace dtensor::backend::row
