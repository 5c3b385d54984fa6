// The scalar math of the pointwise ops, shared by the CPU loops and the CUDA
// kernels (internal). Each function is __host__ __device__ under nvcc and plain
// inline C++ elsewhere, so the CPU tests of every op check the very formulas the
// GPU runs. C is the compute type (float for BF16/F16 storage).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtensor/tensor_ops.h"

#if defined(__CUDACC__)
#define DT_HOST_DEVICE __host__ __device__
#else
#define DT_HOST_DEVICE
#endif

namespace dtensor::backend::scalar {

// Whether an op is defined on compute type C: the transcendental ones need a float
// type (the frontend promotes integers to F32 for them, see tensor_ops.h).
template <class C>
DT_HOST_DEVICE constexpr bool unary_defined(UnaryOp op) {
  if constexpr (std::is_floating_point_v<C>) {
    return true;
  } else {
    return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Square;
  }
}

// Integer power by squaring; a negative exponent truncates toward zero as the
// integer quotient 1/base^|e| does.
template <class C>
DT_HOST_DEVICE C integer_pow(C base, C exponent) {
  if constexpr (std::is_same_v<C, bool>) {
    return base || !exponent;
  } else {
    if (exponent < 0) return (base == 1) ? 1 : (base == -1) ? ((exponent & 1) ? -1 : 1) : 0;
    C result = 1;
    while (exponent > 0) {
      if (exponent & 1) result *= base;
      base *= base;
      exponent >>= 1;
    }
    return result;
  }
}

template <class C>
DT_HOST_DEVICE C gelu_tanh(C x) {
  using std::tanh;
  const C k = C(0.7978845608028654);  // sqrt(2/pi)
  return C(0.5) * x * (C(1) + tanh(k * (x + C(0.044715) * x * x * x)));
}

template <class C>
DT_HOST_DEVICE C gelu_erf(C x) {
  using std::erf;
  return C(0.5) * x * (C(1) + erf(x * C(0.7071067811865476)));
}

// grad_out * f'(x) of the activations (the backward of gelu/silu), computed in C.
// d/dx 0.5 x (1 + tanh(u)), u = k (x + c x^3).
template <class C>
DT_HOST_DEVICE C gelu_tanh_backward(C g, C v) {
  using std::tanh;
  const C k = C(0.7978845608028654), c = C(0.044715);
  const C t = tanh(k * (v + c * v * v * v));
  return g * (C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(3) * c * v * v));
}

// d/dx x Phi(x) = Phi(x) + x phi(x).
template <class C>
DT_HOST_DEVICE C gelu_erf_backward(C g, C v) {
  using std::erf, std::exp;
  const C cdf = C(0.5) * (C(1) + erf(v * C(0.7071067811865476)));
  const C pdf = exp(C(-0.5) * v * v) * C(0.3989422804014327);
  return g * (cdf + v * pdf);
}

// d/dx x s(x) = s (1 + x (1 - s)).
template <class C>
DT_HOST_DEVICE C silu_backward(C g, C v) {
  using std::exp;
  const C s = C(1) / (C(1) + exp(-v));
  return g * s * (C(1) + v * (C(1) - s));
}

template <UnaryOp Op, class C>
DT_HOST_DEVICE C unary(C x) {
  using std::exp, std::log, std::sqrt, std::tanh;
  if constexpr (Op == UnaryOp::Neg) return C(-x);
  if constexpr (Op == UnaryOp::Abs) return x < C(0) ? C(-x) : x;
  if constexpr (Op == UnaryOp::Relu) return x < C(0) ? C(0) : x;
  if constexpr (Op == UnaryOp::Square) return C(x * x);
  if constexpr (Op == UnaryOp::Exp) return exp(x);
  if constexpr (Op == UnaryOp::Log) return log(x);
  if constexpr (Op == UnaryOp::Sqrt) return sqrt(x);
  if constexpr (Op == UnaryOp::Rsqrt) return C(1) / sqrt(x);
  if constexpr (Op == UnaryOp::Tanh) return tanh(x);
  if constexpr (Op == UnaryOp::Sigmoid) return C(1) / (C(1) + exp(-x));
  if constexpr (Op == UnaryOp::GeluTanh) return gelu_tanh(x);
  if constexpr (Op == UnaryOp::GeluErf) return gelu_erf(x);
  if constexpr (Op == UnaryOp::Silu) return x / (C(1) + exp(-x));
  if constexpr (Op == UnaryOp::Reciprocal) return C(1) / x;
}

// Arithmetic ops give C; comparisons give bool.
template <BinaryOp Op, class C>
DT_HOST_DEVICE auto binary(C x, C y) {
  if constexpr (Op == BinaryOp::Add) return C(x + y);
  if constexpr (Op == BinaryOp::Sub) return C(x - y);
  if constexpr (Op == BinaryOp::Mul) return C(x * y);
  if constexpr (Op == BinaryOp::Div) {
    if constexpr (std::is_floating_point_v<C>) {
      return C(x / y);
    } else {
      // The frontend promotes integer division to F32; never divide by zero here.
      return y == C(0) ? C(0) : C(x / y);
    }
  }
  if constexpr (Op == BinaryOp::Pow) {
    if constexpr (std::is_floating_point_v<C>) {
      using std::pow;
      return C(pow(x, y));
    } else {
      return integer_pow(x, y);
    }
  }
  // NaN wins in maximum/minimum, as in torch.maximum.
  if constexpr (Op == BinaryOp::Maximum) return (x != x || x > y) ? x : y;
  if constexpr (Op == BinaryOp::Minimum) return (x != x || x < y) ? x : y;
  if constexpr (Op == BinaryOp::Eq) return x == y;
  if constexpr (Op == BinaryOp::Ne) return x != y;
  if constexpr (Op == BinaryOp::Lt) return x < y;
  if constexpr (Op == BinaryOp::Le) return x <= y;
  if constexpr (Op == BinaryOp::Gt) return x > y;
  if constexpr (Op == BinaryOp::Ge) return x >= y;
}

// The running max/min of a reduction: NaN wins, as in torch.amax/amin.
template <class A>
DT_HOST_DEVICE A reduce_max(A m, A v) {
  return (v > m || v != v) ? v : m;
}
template <class A>
DT_HOST_DEVICE A reduce_min(A m, A v) {
  return (v < m || v != v) ? v : m;
}

// var's last step: the sum of squared deviations from the mean over n - correction
// (never below zero: no deviations left gives inf or NaN, as torch.var).
DT_HOST_DEVICE inline double variance_from_squares(double squares, double n, int64_t correction) {
  const double denominator = n - static_cast<double>(correction);
  return squares / (denominator > 0.0 ? denominator : 0.0);
}

// Whether element k of value v replaces the best so far (best_value at index best)
// of an argmax: the first maximum wins and a NaN counts as the maximum, the first
// NaN among NaNs (torch.argmax). Order-free, so partial results combine in any order.
template <class A>
DT_HOST_DEVICE bool argmax_prefers(A v, int64_t k, A best_value, int64_t best) {
  if (best_value != best_value) return v != v && k < best;
  if (v != v) return true;
  return v > best_value || (v == best_value && k < best);
}

DT_HOST_DEVICE constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

// Element i of arange: start + i * step in double, the product and the sum each
// rounded (start + i*step rather than a running sum, so long ranges do not drift).
// Neither device may contract them into one FMA (nvcc does by default, and so does
// GCC wherever the target has FMA: -march=native, aarch64), so both give the same bits.
DT_HOST_DEVICE inline double arange_value(double start, double step, int64_t i) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(start, __dmul_rn(static_cast<double>(i), step));
#else
  const volatile double product = static_cast<double>(i) * step;  // rounded on its own
  return start + product;
#endif
}

// BF16 <-> F32 on bits: round to nearest even, NaN kept quiet (as dtype.cpp).
DT_HOST_DEVICE inline float bf16_bits_to_f32(unsigned short bits) {
  const unsigned int u = static_cast<unsigned int>(bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
DT_HOST_DEVICE inline unsigned short f32_to_bf16_bits(float f) {
  unsigned int u;
  memcpy(&u, &f, 4);
  return (u & 0x7fffffffu) > 0x7f800000u ? static_cast<unsigned short>((u >> 16) | 0x40u)
                                         : static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace dtensor::backend::scalar
