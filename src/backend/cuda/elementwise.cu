// CUDA elementwise kernels: unary, binary (arithmetic and comparisons), copies
// with dtype conversion, fills, where and the activations' backward, through one
// grid-stride launcher.
//
// The scalar math is backend/scalar_ops.h, the same functions the CPU loops call;
// the index arithmetic is backend/offset_calc.h, tested on the CPU. BF16 and F16
// are stored as 16-bit patterns and computed in F32 as on the CPU (round to nearest
// even on store).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cassert>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise.h"
#include "backend/scalar_ops.h"

namespace dtensor::backend::cuda {
namespace {

// Storage types as the kernels see them: 16-bit floats are bit patterns.
struct Bf16 {
  unsigned short bits;
};
struct F16 {
  unsigned short bits;
};

template <class T>
struct compute {
  using type = T;
};
template <>
struct compute<Bf16> {
  using type = float;
};
template <>
struct compute<F16> {
  using type = float;
};
template <class T>
using compute_t = typename compute<T>::type;

template <class T>
__device__ __forceinline__ compute_t<T> load(const T& v) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return scalar::bf16_bits_to_f32(v.bits);
  } else if constexpr (std::is_same_v<T, F16>) {
    return __half2float(__ushort_as_half(v.bits));
  } else {
    return v;
  }
}

template <class T>
__device__ __forceinline__ T store(compute_t<T> c) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return Bf16{scalar::f32_to_bf16_bits(c)};
  } else if constexpr (std::is_same_v<T, F16>) {
    return F16{__half_as_ushort(__float2half_rn(c))};
  } else {
    return c;
  }
}

// The CPU's conversion between compute types: "nonzero" for bool, C++ otherwise.
template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// Calls fn(T{}) with the kernel storage type of `dtype`.
template <class Fn>
void visit_storage(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn(float{});
    case DType::F64: return fn(double{});
    case DType::BF16: return fn(Bf16{});
    case DType::F16: return fn(F16{});
    case DType::I64: return fn(int64_t{});
    case DType::I32: return fn(int32_t{});
    case DType::Bool: return fn(bool{});
  }
}

constexpr int kThreads = 256;

// One thread per element in a grid-stride loop; body(i, offsets) does the element.
template <int N, class Body>
__device__ __forceinline__ void for_each_element(int64_t n, const OffsetCalc<N>& calc, bool contiguous, Body body) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[N];
    if (contiguous) {
      for (int k = 0; k < N; ++k) off[k] = i;
    } else {
      calc.offsets(i, off);
    }
    body(off);
  }
}

// Blocks for n elements: enough to fill the GPU, the grid-stride loop does the rest.
unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{1} << 16));
}

template <class C>
__device__ __forceinline__ C apply_unary(UnaryOp op, C x) {
  switch (op) {
#define DT_UNARY_CASE(NAME)                                                                   \
  case UnaryOp::NAME:                                                                         \
    if constexpr (scalar::unary_defined<C>(UnaryOp::NAME)) return scalar::unary<UnaryOp::NAME>(x); \
    break;
    DT_UNARY_CASE(Neg)
    DT_UNARY_CASE(Abs)
    DT_UNARY_CASE(Exp)
    DT_UNARY_CASE(Log)
    DT_UNARY_CASE(Sqrt)
    DT_UNARY_CASE(Rsqrt)
    DT_UNARY_CASE(Tanh)
    DT_UNARY_CASE(Sigmoid)
    DT_UNARY_CASE(Relu)
    DT_UNARY_CASE(GeluTanh)
    DT_UNARY_CASE(GeluErf)
    DT_UNARY_CASE(Silu)
    DT_UNARY_CASE(Square)
    DT_UNARY_CASE(Reciprocal)
#undef DT_UNARY_CASE
  }
  return x;  // not reached: the frontend promotes integers for the float-only ops
}

template <class T>
__global__ void unary_kernel(UnaryOp op, int64_t n, OffsetCalc<2> calc, T* out, const T* in) {
  for_each_element<2>(n, calc, calc.contiguous,
                      [&](const int64_t(&off)[2]) { out[off[0]] = store<T>(apply_unary(op, load(in[off[1]]))); });
}

template <class C>
__device__ __forceinline__ C apply_arith(BinaryOp op, C x, C y) {
  switch (op) {
    case BinaryOp::Add: return scalar::binary<BinaryOp::Add>(x, y);
    case BinaryOp::Sub: return scalar::binary<BinaryOp::Sub>(x, y);
    case BinaryOp::Mul: return scalar::binary<BinaryOp::Mul>(x, y);
    case BinaryOp::Div: return scalar::binary<BinaryOp::Div>(x, y);
    case BinaryOp::Pow: return scalar::binary<BinaryOp::Pow>(x, y);
    case BinaryOp::Maximum: return scalar::binary<BinaryOp::Maximum>(x, y);
    case BinaryOp::Minimum: return scalar::binary<BinaryOp::Minimum>(x, y);
    default: return x;  // comparisons go to compare_kernel
  }
}

template <class C>
__device__ __forceinline__ bool apply_compare(BinaryOp op, C x, C y) {
  switch (op) {
    case BinaryOp::Eq: return scalar::binary<BinaryOp::Eq>(x, y);
    case BinaryOp::Ne: return scalar::binary<BinaryOp::Ne>(x, y);
    case BinaryOp::Lt: return scalar::binary<BinaryOp::Lt>(x, y);
    case BinaryOp::Le: return scalar::binary<BinaryOp::Le>(x, y);
    case BinaryOp::Gt: return scalar::binary<BinaryOp::Gt>(x, y);
    default: return scalar::binary<BinaryOp::Ge>(x, y);
  }
}

template <class T>
__global__ void arith_kernel(BinaryOp op, int64_t n, OffsetCalc<3> calc, T* out, const T* a, const T* b) {
  for_each_element<3>(n, calc, calc.contiguous, [&](const int64_t(&off)[3]) {
    out[off[0]] = store<T>(apply_arith(op, load(a[off[1]]), load(b[off[2]])));
  });
}

template <class T>
__global__ void compare_kernel(BinaryOp op, int64_t n, OffsetCalc<3> calc, bool* out, const T* a, const T* b) {
  for_each_element<3>(n, calc, calc.contiguous,
                      [&](const int64_t(&off)[3]) { out[off[0]] = apply_compare(op, load(a[off[1]]), load(b[off[2]])); });
}

// The source dtype is a kernel argument (a uniform switch); the destination a
// template parameter: 7 kernels instead of 49.
template <class Dst>
__global__ void copy_kernel(DType src, int64_t n, OffsetCalc<2> calc, Dst* out, const void* in) {
  using C = compute_t<Dst>;
  for_each_element<2>(n, calc, calc.contiguous, [&](const int64_t(&off)[2]) {
    C v{};
    switch (src) {
      case DType::F32: v = convert<C>(load(static_cast<const float*>(in)[off[1]])); break;
      case DType::F64: v = convert<C>(load(static_cast<const double*>(in)[off[1]])); break;
      case DType::BF16: v = convert<C>(load(static_cast<const Bf16*>(in)[off[1]])); break;
      case DType::F16: v = convert<C>(load(static_cast<const F16*>(in)[off[1]])); break;
      case DType::I64: v = convert<C>(load(static_cast<const int64_t*>(in)[off[1]])); break;
      case DType::I32: v = convert<C>(load(static_cast<const int32_t*>(in)[off[1]])); break;
      case DType::Bool: v = convert<C>(load(static_cast<const bool*>(in)[off[1]])); break;
    }
    out[off[0]] = store<Dst>(v);
  });
}

template <class C>
__device__ __forceinline__ C apply_activation_backward(ActivationGrad op, C g, C x) {
  switch (op) {
    case ActivationGrad::GeluTanh: return scalar::gelu_tanh_backward(g, x);
    case ActivationGrad::GeluErf: return scalar::gelu_erf_backward(g, x);
    default: return scalar::silu_backward(g, x);
  }
}

template <class T>
__global__ void activation_backward_kernel(ActivationGrad op, int64_t n, OffsetCalc<3> calc, T* grad_in,
                                           const T* grad_out, const T* x) {
  for_each_element<3>(n, calc, calc.contiguous, [&](const int64_t(&off)[3]) {
    grad_in[off[0]] = store<T>(apply_activation_backward(op, load(grad_out[off[1]]), load(x[off[2]])));
  });
}

template <class U>
__global__ void fill_kernel(U bits, int64_t n, OffsetCalc<1> calc, U* out) {
  for_each_element<1>(n, calc, calc.contiguous, [&](const int64_t(&off)[1]) { out[off[0]] = bits; });
}

template <class U>
__global__ void where_kernel(int64_t n, OffsetCalc<4> calc, U* out, const bool* cond, const U* a, const U* b) {
  for_each_element<4>(n, calc, calc.contiguous,
                      [&](const int64_t(&off)[4]) { out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]]; });
}

// Calls fn(U{}) with the unsigned type of `size` bytes.
template <class Fn>
void visit_bits(size_t size, Fn&& fn) {
  switch (size) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    default: return fn(uint64_t{});
  }
}

}  // namespace

void launch_unary(UnaryOp op, DType dtype, int64_t n, const OffsetCalc<2>& calc, void* out, const void* in,
                  void* stream) {
  if (n == 0) return;
  visit_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        op, n, calc, static_cast<T*>(out), static_cast<const T*>(in));
  });
  check(cudaGetLastError(), "unary kernel launch");
}

void launch_binary(BinaryOp op, DType dtype, int64_t n, const OffsetCalc<3>& calc, void* out, const void* a,
                   const void* b, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  visit_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (scalar::is_comparison(op)) {
      compare_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, n, calc, static_cast<bool*>(out),
                                                           static_cast<const T*>(a), static_cast<const T*>(b));
    } else {
      arith_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, n, calc, static_cast<T*>(out), static_cast<const T*>(a),
                                                         static_cast<const T*>(b));
    }
  });
  check(cudaGetLastError(), "binary kernel launch");
}

void launch_copy(DType src, DType dst, int64_t n, const OffsetCalc<2>& calc, void* out, const void* in,
                 void* stream) {
  if (n == 0) return;
  visit_storage(dst, [&](auto tag) {
    using T = decltype(tag);
    copy_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, n, calc,
                                                                                     static_cast<T*>(out), in);
  });
  check(cudaGetLastError(), "copy kernel launch");
}

void launch_fill(size_t element_size, uint64_t bits, int64_t n, const OffsetCalc<1>& calc, void* out,
                 void* stream) {
  if (n == 0) return;
  visit_bits(element_size, [&](auto tag) {
    using U = decltype(tag);
    fill_kernel<U><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<U>(bits), n, calc,
                                                                                     static_cast<U*>(out));
  });
  check(cudaGetLastError(), "fill kernel launch");
}

void launch_activation_backward(ActivationGrad op, DType dtype, int64_t n, const OffsetCalc<3>& calc, void* grad_in,
                                const void* grad_out, const void* x, void* stream) {
  if (n == 0) return;
  visit_storage(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      activation_backward_kernel<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          op, n, calc, static_cast<T*>(grad_in), static_cast<const T*>(grad_out), static_cast<const T*>(x));
    } else {
      assert(false && "float dtype expected");  // the frontend takes float dtypes only
    }
  });
  check(cudaGetLastError(), "activation backward kernel launch");
}

void launch_where(size_t element_size, int64_t n, const OffsetCalc<4>& calc, void* out, const void* cond,
                  const void* a, const void* b, void* stream) {
  if (n == 0) return;
  visit_bits(element_size, [&](auto tag) {
    using U = decltype(tag);
    where_kernel<U><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        n, calc, static_cast<U*>(out), static_cast<const bool*>(cond), static_cast<const U*>(a),
        static_cast<const U*>(b));
  });
  check(cudaGetLastError(), "where kernel launch");
}

}  // namespace dtensor::backend::cuda
