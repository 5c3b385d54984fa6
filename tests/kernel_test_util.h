// Shared helpers of the kernel tests (test_pointwise, test_reduce, test_nn_kernels):
// inputs in several memory layouts, dtype tolerances, double-precision references,
// finite differences and exception checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dtensor/random.h"
#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"

namespace dtensor::test {

inline const std::vector<DType> kFloatDTypes = {DType::F32, DType::F64, DType::BF16, DType::F16};

// How an input of a given logical shape is laid out in memory.
enum class Layout { Contiguous, Transposed, Sliced, Broadcast };
inline const std::vector<Layout> kLayouts = {Layout::Contiguous, Layout::Transposed, Layout::Sliced,
                                             Layout::Broadcast};

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Transposed: return "transposed";
    case Layout::Sliced: return "sliced";
    case Layout::Broadcast: return "broadcast";
  }
  return "?";
}

// Uniform values in [lo, hi) as a contiguous F64 tensor (Philox, so runs repeat);
// with step > 0 the values are rounded to multiples of step (ties and repeats, for
// comparisons and argmax).
inline Tensor uniform_f64(const Shape& shape, uint64_t seed, double lo, double hi,
                          double step = 0) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = lo + (hi - lo) * random::uniform(seed, i);
    if (step > 0) v[i] = std::round(v[i] / step) * step;
  }
  return Tensor::from_vector(v, shape);
}

// A tensor of logical `shape` (at least 2-D) in `dtype`, values in [lo, hi), laid out
// as asked: Transposed swaps the last two dims of a contiguous buffer, Sliced takes
// every other element of a wider buffer starting at offset 1, Broadcast expands a
// size-1 leading dim (so rows repeat).
inline Tensor make_input(const Shape& shape, DType dtype, Layout layout, uint64_t seed,
                         double lo = -2.0, double hi = 2.0, double step = 0) {
  const size_t n = shape.size();
  switch (layout) {
    case Layout::Contiguous: return uniform_f64(shape, seed, lo, hi, step).to(dtype);
    case Layout::Transposed: {
      Shape swapped = shape;
      std::swap(swapped[n - 1], swapped[n - 2]);
      Tensor t = uniform_f64(swapped, seed, lo, hi, step).to(dtype).transpose(-1, -2);
      EXPECT_FALSE(t.is_contiguous());
      return t;
    }
    case Layout::Sliced: {
      Shape wide = shape;
      wide[n - 1] = 2 * shape[n - 1] + 1;
      return uniform_f64(wide, seed, lo, hi, step).to(dtype).slice(-1, 1, wide[n - 1], 2);
    }
    case Layout::Broadcast: {
      Shape one = shape;
      one[0] = 1;
      return uniform_f64(one, seed, lo, hi, step).to(dtype).expand(shape);
    }
  }
  return Tensor();
}

// Row-major values of any tensor as doubles.
inline std::vector<double> values(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }

// Relative tolerance for one rounding of a result to `dtype` (plus a little slack for
// F32 math library error).
inline double rtol_for(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::F32: return 2e-6;
    case DType::BF16: return 8e-3;
    case DType::F16: return 1e-3;
    default: return 0.0;
  }
}

// Expects `actual` (any dtype) to match `expected` elementwise within
// atol + rtol*|expected|; the tolerances scale with the dtype unless given.
inline void expect_close(const Tensor& actual, const std::vector<double>& expected,
                         const std::string& what, double rtol_scale = 1.0, double atol = -1.0) {
  const double rtol = rtol_for(actual.dtype()) * rtol_scale;
  if (atol < 0) atol = rtol;
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << what;
  const CompareReport r =
      compare(actual.to(DType::F64), Tensor::from_vector(expected, actual.shape()), rtol, atol);
  EXPECT_EQ(r.mismatches, 0) << what << ": " << r.to_string() << " (rtol " << rtol << ", atol "
                             << atol << ", got "
                             << values(actual)[static_cast<size_t>(std::max<int64_t>(0, r.max_abs_index))]
                             << " want "
                             << expected[static_cast<size_t>(std::max<int64_t>(0, r.max_abs_index))]
                             << ")";
}

// d/dx_i of loss(x) by central differences, for an F64 contiguous x.
inline std::vector<double> numerical_gradient(const Tensor& x,
                                              const std::function<double(const Tensor&)>& loss,
                                              double h = 1e-6) {
  std::vector<double> base = values(x), grad(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    std::vector<double> plus = base, minus = base;
    plus[i] += h;
    minus[i] -= h;
    grad[i] = (loss(Tensor::from_vector(plus, x.shape())) -
               loss(Tensor::from_vector(minus, x.shape()))) /
              (2 * h);
  }
  return grad;
}

// sum(weights * t) in double: turns a tensor-valued function into a scalar loss whose
// gradient is the vector-Jacobian product with `weights`.
inline double weighted_sum(const Tensor& t, const std::vector<double>& weights) {
  const std::vector<double> v = values(t);
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * weights[i];
  return s;
}

// Expects fn() to throw std::invalid_argument whose message contains `fragment`.
template <class Fn>
void expect_invalid(Fn&& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected std::invalid_argument containing \"" << fragment << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << fragment << "\"";
  }
}

}  // namespace dtensor::test
