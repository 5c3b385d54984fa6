// CUDA reductions: sum, mean, max, min and var over any set of dims of a strided
// input, argmax along one dim.
//
// One block per output element (grid-stride over outputs): its threads stride over
// the reduced elements, accumulate as the CPU does (double for float inputs, int64
// for integers; the running max/min is scalar_ops.h's, NaN winning), and combine
// through shared memory. var takes the CPU's two passes (mean, then squared
// deviations, both in double); argmax keeps (value, index) pairs combined by
// scalar_ops.h's argmax_prefers (first maximum, NaN wins), the CPU's rule. The index plan is offset_calc.h's ReducePlan, tested on
// the CPU. Simple and exact first; many short rows would want a warp per output.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/store.cuh"
#include "backend/scalar_ops.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ auto load_acc(const T* p, int64_t i) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(p[i]);
  } else {
    return static_cast<int64_t>(p[i]);
  }
}

// The input's elements as the accumulator type; `kind` tells 16-bit patterns apart.
enum class Half : uint8_t { None, BF16, F16 };

template <class T, Half kind>
__device__ __forceinline__ auto load_value(const T* p, int64_t i) {
  if constexpr (kind == Half::BF16) {
    return static_cast<double>(scalar::bf16_bits_to_f32(p[i]));
  } else if constexpr (kind == Half::F16) {
    return static_cast<double>(__half2float(__ushort_as_half(p[i])));
  } else {
    return load_acc(p, i);
  }
}

template <class A>
__device__ __forceinline__ A combine(ReduceOp op, A s, A v) {
  switch (op) {
    case ReduceOp::Max: return scalar::reduce_max(s, v);
    case ReduceOp::Min: return scalar::reduce_min(s, v);
    default: return s + v;
  }
}

template <class A>
__device__ __forceinline__ A identity(ReduceOp op) {
  if constexpr (std::is_floating_point_v<A>) {
    return op == ReduceOp::Max ? -INFINITY : op == ReduceOp::Min ? INFINITY : 0.0;
  } else {
    return op == ReduceOp::Max ? INT64_MIN : op == ReduceOp::Min ? INT64_MAX : 0;
  }
}

template <class T, Half kind>
__global__ void reduce_kernel(ReduceOp op, ReducePlan plan, DType out_dtype, void* out, const T* in) {
  using A = decltype(load_value<T, kind>(in, 0));
  __shared__ A partial[kThreads];
  for (int64_t o = blockIdx.x; o < plan.kept_numel; o += gridDim.x) {
    int64_t base[1];
    plan.kept.offsets(o, base);
    A acc = identity<A>(op);
    for (int64_t r = threadIdx.x; r < plan.reduced_numel; r += blockDim.x) {
      int64_t off[1];
      plan.reduced.offsets(r, off);
      acc = combine(op, acc, load_value<T, kind>(in, base[0] + off[0]));
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = kThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) partial[threadIdx.x] = combine(op, partial[threadIdx.x], partial[threadIdx.x + width]);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      A total = partial[0];
      if (op == ReduceOp::Mean) {
        store_as(out_dtype, out, o, static_cast<double>(total) / static_cast<double>(plan.reduced_numel));
      } else {
        store_as(out_dtype, out, o, total);
      }
    }
    __syncthreads();
  }
}

// The sum of every thread's v, returned to all threads of the block; `partial` is
// kThreads doubles of shared memory.
__device__ double block_sum(double v, double* partial) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();  // partial is reused by the next call
  return total;
}

template <class T, Half kind>
__global__ void var_kernel(ReducePlan plan, int64_t correction, DType out_dtype, void* out, const T* in) {
  __shared__ double partial[kThreads];
  const double n = static_cast<double>(plan.reduced_numel);
  for (int64_t o = blockIdx.x; o < plan.kept_numel; o += gridDim.x) {
    int64_t base[1];
    plan.kept.offsets(o, base);
    double sum = 0;
    for (int64_t r = threadIdx.x; r < plan.reduced_numel; r += blockDim.x) {
      int64_t off[1];
      plan.reduced.offsets(r, off);
      sum += static_cast<double>(load_value<T, kind>(in, base[0] + off[0]));
    }
    const double mean = block_sum(sum, partial) / n;
    double squares = 0;
    for (int64_t r = threadIdx.x; r < plan.reduced_numel; r += blockDim.x) {
      int64_t off[1];
      plan.reduced.offsets(r, off);
      const double d = static_cast<double>(load_value<T, kind>(in, base[0] + off[0])) - mean;
      squares += d * d;
    }
    const double total = block_sum(squares, partial);
    if (threadIdx.x == 0) store_as(out_dtype, out, o, scalar::variance_from_squares(total, n, correction));
  }
}

template <class T, Half kind>
__global__ void argmax_kernel(ReducePlan plan, int64_t* out, const T* in) {
  using A = decltype(load_value<T, kind>(in, 0));
  __shared__ A best_value[kThreads];
  __shared__ int64_t best_index[kThreads];  // -1: this thread saw no element
  for (int64_t o = blockIdx.x; o < plan.kept_numel; o += gridDim.x) {
    int64_t base[1];
    plan.kept.offsets(o, base);
    A value{};
    int64_t index = -1;
    for (int64_t r = threadIdx.x; r < plan.reduced_numel; r += blockDim.x) {
      int64_t off[1];
      plan.reduced.offsets(r, off);
      const A v = load_value<T, kind>(in, base[0] + off[0]);
      if (index < 0 || scalar::argmax_prefers(v, r, value, index)) {
        value = v;
        index = r;
      }
      if (value != value) break;  // a NaN: no later element of this thread can win
    }
    best_value[threadIdx.x] = value;
    best_index[threadIdx.x] = index;
    __syncthreads();
    for (int width = kThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) {
        const int other = threadIdx.x + width;
        const int64_t k = best_index[other];
        if (k >= 0 && (best_index[threadIdx.x] < 0 ||
                       scalar::argmax_prefers(best_value[other], k, best_value[threadIdx.x], best_index[threadIdx.x]))) {
          best_value[threadIdx.x] = best_value[other];
          best_index[threadIdx.x] = k;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = best_index[0];
    __syncthreads();
  }
}

// Calls fn(T{}, Kind{}) with the kernel's storage type of `dtype` and its Half kind.
template <class Fn>
void visit_input(DType dtype, Fn&& fn) {
  using std::integral_constant;
  switch (dtype) {
    case DType::F32: return fn(float{}, integral_constant<Half, Half::None>{});
    case DType::F64: return fn(double{}, integral_constant<Half, Half::None>{});
    case DType::BF16: return fn(uint16_t{}, integral_constant<Half, Half::BF16>{});
    case DType::F16: return fn(uint16_t{}, integral_constant<Half, Half::F16>{});
    case DType::I64: return fn(int64_t{}, integral_constant<Half, Half::None>{});
    case DType::I32: return fn(int32_t{}, integral_constant<Half, Half::None>{});
    case DType::Bool: return fn(bool{}, integral_constant<Half, Half::None>{});
  }
}

unsigned blocks_for(const ReducePlan& plan) {
  return static_cast<unsigned>(std::min<int64_t>(plan.kept_numel, int64_t{1} << 16));
}

}  // namespace

void launch_reduce(ReduceOp op, DType in_dtype, DType out_dtype, const ReducePlan& plan, void* out, const void* in,
                   void* stream) {
  if (plan.kept_numel == 0) return;
  visit_input(in_dtype, [&](auto tag, auto kind) {
    using T = decltype(tag);
    reduce_kernel<T, decltype(kind)::value><<<blocks_for(plan), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        op, plan, out_dtype, out, static_cast<const T*>(in));
  });
  check(cudaGetLastError(), "reduce kernel launch");
}

void launch_var(DType in_dtype, DType out_dtype, const ReducePlan& plan, int64_t correction, void* out, const void* in,
                void* stream) {
  if (plan.kept_numel == 0) return;
  visit_input(in_dtype, [&](auto tag, auto kind) {
    using T = decltype(tag);
    var_kernel<T, decltype(kind)::value><<<blocks_for(plan), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        plan, correction, out_dtype, out, static_cast<const T*>(in));
  });
  check(cudaGetLastError(), "var kernel launch");
}

void launch_argmax(DType in_dtype, const ReducePlan& plan, int64_t* out, const void* in, void* stream) {
  if (plan.kept_numel == 0) return;
  visit_input(in_dtype, [&](auto tag, auto kind) {
    using T = decltype(tag);
    argmax_kernel<T, decltype(kind)::value><<<blocks_for(plan), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        plan, out, static_cast<const T*>(in));
  });
  check(cudaGetLastError(), "argmax kernel launch");
}

}  // namespace dtensor::backend::cuda
