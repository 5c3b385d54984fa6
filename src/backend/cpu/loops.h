// Strided N-D iteration for the CPU kernels (internal).
//
// A pointwise kernel walks several tensors of one shape, each with its own strides
// and offset. `for_each_row` reduces that walk to calls on 1-D rows: size-1 dims are
// dropped, dims are ordered by the first operand's strides (so it is walked in memory
// order) and neighbouring dims that are contiguous in every operand are merged. Fully
// contiguous operands therefore collapse into one row of numel elements, which is
// where the compiler's auto-vectorisation does its work.
//
// `map` builds on it: out[i] = f(in[i]...) with values loaded in their compute type
// (F32 for BF16/F16) and converted to the output type.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/parallel.h"
#include "dtensor/tensor.h"

namespace dtensor::backend::cpu {

// The type a stored element is computed in: the 16-bit floats compute in F32.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <>
struct compute_type<f16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_half_v<T>;

// BF16 <-> F32 inline, so that loops over BF16 data vectorise (the out-of-line
// conversions of dtype.h cost a call per element). Same rounding as dtype.cpp:
// nearest even, NaN kept quiet.
inline float bf16_to_float(bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  bf16 r;
  r.bits = (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((u >> 16) | 0x40u)
                                           : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return r;
}

// Converts between any two element types: C++ conversion for the built-in types
// (float -> int truncates toward zero), "nonzero" for bool, through F32 for halves.
template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, bf16>) {
    return convert<To>(bf16_to_float(v));
  } else if constexpr (std::is_same_v<To, bf16>) {
    return float_to_bf16(static_cast<float>(v));
  } else if constexpr (is_half_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (is_half_v<To>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// Loads a stored element as its compute type.
template <class T>
inline compute_t<T> load(T v) {
  return convert<compute_t<T>>(v);
}

namespace detail {

template <size_t N>
struct RowDim {
  int64_t size;
  std::array<int64_t, N> stride;
};

// The dims for_each_row walks: size-1 dims dropped, outermost first by operand 0's
// stride, neighbours that every operand steps over evenly merged. False for an
// empty shape. Depends on N only, not on the row function, so that each kernel's
// lambda does not instantiate its own sort (the compile time of pointwise.cpp).
template <size_t N>
bool row_dims(const Shape& shape, const std::array<const int64_t*, N>& strides, std::vector<RowDim<N>>& merged) {
  using Dim = RowDim<N>;
  std::vector<Dim> dims;
  dims.reserve(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return false;
    if (shape[d] == 1) continue;
    Dim dim{shape[d], {}};
    for (size_t k = 0; k < N; ++k) dim.stride[k] = strides[k][d];
    dims.push_back(dim);
  }
  // Outermost first by operand 0's stride, so operand 0 (the output of a pointwise
  // op, the input of a reduction) is walked in memory order.
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) {
    return std::abs(a.stride[0]) > std::abs(b.stride[0]);
  });
  // Merge dim i into the next-inner one when every operand steps over it evenly.
  merged.clear();
  for (const Dim& dim : dims) {
    if (!merged.empty()) {
      Dim& inner = merged.back();
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) {
        mergeable = mergeable && inner.stride[k] == dim.stride[k] * dim.size;
      }
      if (mergeable) {
        inner.stride = dim.stride;
        inner.size *= dim.size;
        continue;
      }
    }
    merged.push_back(dim);
  }
  return true;
}

}  // namespace detail

// Walks `shape` for N operands with the given element strides and calls
// row(offsets, strides, n) for each innermost row: operand k's row starts at element
// offsets[k] (relative to its element 0) and steps by strides[k]. Nothing is called
// for an empty shape; a 0-d shape gives one row of one element.
template <size_t N, class RowFn>
void for_each_row(const Shape& shape, const std::array<const int64_t*, N>& strides, RowFn&& row) {
  using Dim = detail::RowDim<N>;
  std::vector<Dim> merged;
  if (!detail::row_dims<N>(shape, strides, merged)) return;
  std::array<int64_t, N> offsets{};
  if (merged.empty()) {
    std::array<int64_t, N> unit{};
    row(offsets, unit, int64_t{1});
    return;
  }
  const Dim inner = merged.back();
  const size_t outer_dims = merged.size() - 1;
  std::vector<int64_t> counter(outer_dims, 0);
  while (true) {
    row(offsets, inner.stride, inner.size);
    // Odometer increment over the outer dims, innermost outer dim fastest.
    size_t d = outer_dims;
    while (d > 0) {
      --d;
      const Dim& dim = merged[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += dim.stride[k];
      if (++counter[d] < dim.size) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= dim.stride[k] * dim.size;
      counter[d] = 0;
      if (d == 0) return;
    }
    if (outer_dims == 0) return;
  }
}

// Calls line(offsets, steps) for every 1-D line along `dim` of the tensors (all of one
// shape): tensor k's line starts at element offsets[k] (relative to its element 0) and
// steps by steps[k]. For ops that work on whole lines: softmax, argmax, losses.
template <size_t N, class LineFn>
void for_each_line(const std::array<const Tensor*, N>& tensors, int64_t dim, LineFn&& line) {
  const Shape& shape = tensors[0]->shape();
  Shape outer_shape;
  std::array<Strides, N> outer_strides;
  std::array<int64_t, N> steps{};
  for (size_t k = 0; k < N; ++k) {
    assert(tensors[k]->shape() == shape);
    steps[k] = tensors[k]->stride(dim);
  }
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d == dim) continue;
    outer_shape.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) outer_strides[k].push_back(tensors[k]->stride(d));
  }
  std::array<const int64_t*, N> stride_ptrs{};
  for (size_t k = 0; k < N; ++k) stride_ptrs[k] = outer_strides[k].data();
  for_each_row<N>(outer_shape, stride_ptrs,
                  [&](const std::array<int64_t, N>& off, const std::array<int64_t, N>& st,
                      int64_t n) {
                    std::array<int64_t, N> at = off;
                    for (int64_t i = 0; i < n; ++i) {
                      line(at, steps);
                      for (size_t k = 0; k < N; ++k) at[k] += st[k];
                    }
                  });
}

namespace detail {

template <class Out, class... In, class F, size_t... I>
void map_row(F& f, Out* out, const std::tuple<const In*...>& in, const int64_t* offsets,
             const int64_t* strides, int64_t n, std::index_sequence<I...>) {
  Out* o = out + offsets[0];
  const std::tuple<const In*...> p{(std::get<I>(in) + offsets[I + 1])...};
  if (strides[0] == 1 && ((strides[I + 1] == 1) && ...)) {
    // The contiguous case: a plain loop the compiler vectorises.
    for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(f(load(std::get<I>(p)[i])...));
  } else {
    const int64_t so = strides[0];
    for (int64_t i = 0; i < n; ++i) {
      o[i * so] = convert<Out>(f(load(std::get<I>(p)[i * strides[I + 1]])...));
    }
  }
}

}  // namespace detail

// out[i] = f(in[i]...) over out's shape. Out and In... are the stored element types
// (given explicitly); f receives compute types. Inputs must have out's shape (broadcast
// inputs carry zero strides). Any of the tensors may be strided.
template <class Out, class... In, class F, class... Ts>
void map(F&& f, Tensor& out, const Ts&... in) {
  static_assert(sizeof...(In) == sizeof...(Ts), "one element type per input tensor");
  constexpr size_t N = 1 + sizeof...(In);
  assert(((in.shape() == out.shape()) && ...));
  Out* out_ptr = static_cast<Out*>(out.data_ptr());
  const std::tuple<const In*...> in_ptrs{static_cast<const In*>(in.data_ptr())...};
  const std::array<const int64_t*, N> strides{out.strides().data(), in.strides().data()...};
  for_each_row<N>(out.shape(), strides,
                  [&](const std::array<int64_t, N>& offsets, const std::array<int64_t, N>& row_strides,
                      int64_t n) {
                    detail::map_row<Out, In...>(f, out_ptr, in_ptrs, offsets.data(),
                                                row_strides.data(), n,
                                                std::index_sequence_for<In...>{});
                  });
}

// Runs fn(pieces) on the rank's threads (parallel.h), where pieces are views of the
// tensors (all of one shape) cut along one dim into chunks of about `grain`
// elements or more; fn receives std::array<Tensor, N>. The cut dim is the first with
// at least as many entries as chunks, so outputs are written in disjoint pieces.
// Small tensors run as one piece on the caller.
template <size_t N, class Fn>
void parallel_pieces(const std::array<const Tensor*, N>& tensors, int64_t grain, Fn&& fn) {
  const Tensor& first = *tensors[0];
  int chunks = parallel_chunks(first.numel(), grain);
  int64_t dim = -1;
  for (int64_t d = 0; chunks > 1 && d < first.dim(); ++d) {
    if (first.size(d) >= chunks) {
      dim = d;
      break;
    }
  }
  if (dim < 0) chunks = 1;
  std::array<Tensor, N> whole;
  for (size_t k = 0; k < N; ++k) whole[k] = *tensors[k];
  if (chunks == 1) return fn(whole);
  const int64_t extent = first.size(dim);
  parallel_run(chunks, [&](int c) {
    const int64_t begin = c * extent / chunks, end = (c + 1) * extent / chunks;
    std::array<Tensor, N> piece;
    for (size_t k = 0; k < N; ++k) piece[k] = whole[k].narrow(dim, begin, end - begin);
    fn(piece);
  });
}

// Calls fn(T{}) for the floating dtypes only; the caller has checked the dtype.
template <class Fn>
decltype(auto) visit_float_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::F64: return fn(double{});
    case DType::BF16: return fn(bf16{});
    case DType::F16: return fn(f16{});
    default: assert(t == DType::F32); return fn(float{});
  }
}

}  // namespace dtensor::backend::cpu
