// CUDA reductions: sum, mean, max, min over any set of dims of a strided input.
//
// One block per output element (grid-stride over outputs): its threads stride over
// the reduced elements, accumulate as the CPU does (double for float inputs, int64
// for integers; the running max/min is scalar_ops.h's, NaN winning), and combine
// through shared memory. The index plan is offset_calc.h's ReducePlan, tested on
// the CPU. Simple and exact first; many short rows would want a warp per output.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/reduce.h"
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

// Stores v (the finished accumulator) as one element of `dtype`, the CPU's conversions.
template <class A>
__device__ __forceinline__ void store_as(DType dtype, void* out, int64_t o, A v) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(out)[o] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(out)[o] = static_cast<double>(v); break;
    case DType::BF16: static_cast<uint16_t*>(out)[o] = scalar::f32_to_bf16_bits(static_cast<float>(v)); break;
    case DType::F16: static_cast<uint16_t*>(out)[o] = __half_as_ushort(__float2half_rn(static_cast<float>(v))); break;
    case DType::I64: static_cast<int64_t*>(out)[o] = static_cast<int64_t>(v); break;
    case DType::I32: static_cast<int32_t*>(out)[o] = static_cast<int32_t>(v); break;
    case DType::Bool: static_cast<bool*>(out)[o] = v != A(0); break;
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

template <class T, Half kind = Half::None>
void launch(ReduceOp op, DType out_dtype, const ReducePlan& plan, void* out, const void* in, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(plan.kept_numel, int64_t{1} << 16));
  reduce_kernel<T, kind><<<blocks, kThreads, 0, stream>>>(op, plan, out_dtype, out, static_cast<const T*>(in));
}

}  // namespace

void launch_reduce(ReduceOp op, DType in_dtype, DType out_dtype, const ReducePlan& plan, void* out, const void* in,
                   void* stream) {
  if (plan.kept_numel == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (in_dtype) {
    case DType::F32: launch<float>(op, out_dtype, plan, out, in, s); break;
    case DType::F64: launch<double>(op, out_dtype, plan, out, in, s); break;
    case DType::BF16: launch<uint16_t, Half::BF16>(op, out_dtype, plan, out, in, s); break;
    case DType::F16: launch<uint16_t, Half::F16>(op, out_dtype, plan, out, in, s); break;
    case DType::I64: launch<int64_t>(op, out_dtype, plan, out, in, s); break;
    case DType::I32: launch<int32_t>(op, out_dtype, plan, out, in, s); break;
    case DType::Bool: launch<bool>(op, out_dtype, plan, out, in, s); break;
  }
  check(cudaGetLastError(), "reduce kernel launch");
}

}  // namespace dtensor::backend::cuda
