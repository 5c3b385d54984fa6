// Index arithmetic of the CUDA elementwise launcher (internal), in host code that
// the CPU tests cover.
//
// A pointwise kernel runs one thread per element of the output, numbered in
// row-major order over the output's shape, and needs the element offset of that
// element in each of N operands (the output and the inputs; a broadcast input has
// zero strides). OffsetCalc<N> is built on the host: size-1 dims dropped,
// neighbouring dims that every operand steps over evenly merged into one, dims
// stored innermost first; offsets() is the division/modulo walk the kernel does. A
// plan whose operands are all contiguous is marked so and the kernel uses the
// linear index directly.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "backend/scalar_ops.h"  // DT_HOST_DEVICE
#include "dtensor/error.h"       // Shape

namespace dtensor::backend {

// Enough for every shape after merging (a tensor with more distinct strided dims
// than this is copied to a contiguous one first).
constexpr int kMaxOffsetDims = 10;

template <int N>
struct OffsetCalc {
  int dims = 0;            // after merging; 0 for a single element
  bool contiguous = true;  // every operand's offset is the linear index
  int64_t sizes[kMaxOffsetDims] = {};
  int64_t strides[kMaxOffsetDims][N] = {};  // elements, innermost dim first

  DT_HOST_DEVICE void offsets(int64_t linear, int64_t (&out)[N]) const {
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = 0; d < dims; ++d) {
      const int64_t size = sizes[d];
      const int64_t i = linear % size;
      linear /= size;
      for (int k = 0; k < N; ++k) out[k] += i * strides[d][k];
    }
  }
};

// The plan for operands of `shape` with the given strides (operand 0 is the output).
// Returns false when more than kMaxOffsetDims dims remain after merging.
template <int N>
bool make_offset_calc(const Shape& shape, const std::array<const int64_t*, N>& operand_strides, OffsetCalc<N>& calc) {
  calc = OffsetCalc<N>{};
  // Innermost first, size-1 dims dropped.
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> strides;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    for (int k = 0; k < N; ++k) s[k] = operand_strides[k][d];
    // Merge into the dim inside it when every operand steps evenly across both:
    // stride(outer) == stride(inner) * size(inner).
    if (!sizes.empty()) {
      bool even = true;
      for (int k = 0; k < N; ++k) even = even && s[k] == strides.back()[k] * sizes.back();
      if (even) {
        sizes.back() *= shape[d];
        continue;
      }
    }
    sizes.push_back(shape[d]);
    strides.push_back(s);
  }
  if (sizes.size() > static_cast<size_t>(kMaxOffsetDims)) return false;
  calc.dims = static_cast<int>(sizes.size());
  for (int d = 0; d < calc.dims; ++d) {
    calc.sizes[d] = sizes[static_cast<size_t>(d)];
    for (int k = 0; k < N; ++k) calc.strides[d][k] = strides[static_cast<size_t>(d)][static_cast<size_t>(k)];
  }
  // Contiguous: one dim of unit strides (or a single element).
  calc.contiguous = calc.dims == 0;
  if (calc.dims == 1) {
    calc.contiguous = true;
    for (int k = 0; k < N; ++k) calc.contiguous = calc.contiguous && calc.strides[0][k] == 1;
  }
  return true;
}

}  // namespace dtensor::backend

namespace dtensor::backend {

// A reduction of `shape` (strides `strides`) over `dims` (sorted, unique): output
// element o (row-major over the kept dims) reads the input at
// kept.offsets(o) + reduced.offsets(r) for r in [0, reduced_numel).
struct ReducePlan {
  OffsetCalc<1> kept, reduced;
  int64_t kept_numel = 1, reduced_numel = 1;
};

inline bool make_reduce_plan(const Shape& shape, const int64_t* strides, const std::vector<int64_t>& dims,
                             ReducePlan& plan) {
  Shape kept_shape, reduced_shape;
  std::vector<int64_t> kept_strides, reduced_strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end();
    (reduced ? reduced_shape : kept_shape).push_back(shape[d]);
    (reduced ? reduced_strides : kept_strides).push_back(strides[d]);
  }
  plan = ReducePlan{};
  for (int64_t s : kept_shape) plan.kept_numel *= s;
  for (int64_t s : reduced_shape) plan.reduced_numel *= s;
  return make_offset_calc<1>(kept_shape, {kept_strides.data()}, plan.kept) &&
         make_offset_calc<1>(reduced_shape, {reduced_strides.data()}, plan.reduced);
}

}  // namespace dtensor::backend
