// Device helpers of the CUDA row kernels (softmax.cu, norm.cu, cross_entropy.cu,
// embedding.cu; internal): the float dtypes as storage/compute type pairs, the dtype
// and index dispatch, and a block-wide reduction.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/row_ops.h"
#include "backend/scalar_ops.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cuda::rows {

// S: the stored element; C: the compute type (as cpu/loops.h's compute_t). The half
// types are stored as bits and convert with the CPU's rounding (nearest even).
struct F32 {
  using S = float;
  using C = float;
  static __device__ __forceinline__ C load(S v) { return v; }
  static __device__ __forceinline__ S store(C v) { return v; }
};
struct F64 {
  using S = double;
  using C = double;
  static __device__ __forceinline__ C load(S v) { return v; }
  static __device__ __forceinline__ S store(C v) { return v; }
};
struct BF16 {
  using S = uint16_t;
  using C = float;
  static __device__ __forceinline__ C load(S v) { return scalar::bf16_bits_to_f32(v); }
  static __device__ __forceinline__ S store(C v) { return scalar::f32_to_bf16_bits(v); }
};
struct F16 {
  using S = uint16_t;
  using C = float;
  static __device__ __forceinline__ C load(S v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ S store(C v) { return __half_as_ushort(__float2half_rn(v)); }
};

// Calls fn(E{}) for a float dtype; the frontend admits no other (tensor_ops.h).
template <class Fn>
void visit_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn(F32{});
    case DType::F64: return fn(F64{});
    case DType::BF16: return fn(BF16{});
    case DType::F16: return fn(F16{});
    default: throw std::runtime_error(std::string("[") + op + "] expected a float dtype");
  }
}

struct Sum {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct Max {  // NaN wins, as the CPU's row maximum
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return scalar::reduce_max(a, b);
  }
};

// Every thread of the block passes its partial and gets the block's total, combined
// in a fixed tree (so a launch of one block size is deterministic). blockDim.x is a
// multiple of 32 (at most 1024); every thread of the block must call it.
template <class A, class Op>
__device__ A block_reduce(A v, Op op, A identity) {
  __shared__ A scratch[32];
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // an earlier call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : identity;
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

// Calls fn(I{}) for the index dtype of ids and targets (I64 or I32).
template <class Fn>
void visit_index(DType dtype, Fn&& fn) {
  if (dtype == DType::I32) {
    fn(int32_t{});
  } else {
    fn(int64_t{});
  }
}

// The maximum m of a line of n elements (step `step`; NaN wins) and the sum of
// exp(x - m) in double, as the CPU's scalar loops, on every thread of the block.
template <class E>
__device__ void line_max_and_exp_sum(const typename E::S* line, int64_t n, int64_t step, typename E::C& m,
                                     double& total) {
  using C = typename E::C;
  C mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = scalar::reduce_max(mx, E::load(line[i * step]));
  m = block_reduce(mx, Max{}, C(-INFINITY));
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sum += static_cast<double>(row::shifted_exp(E::load(line[i * step]), m));
  }
  total = block_reduce(sum, Sum{}, 0.0);
}

}  // namespace dtensor::backend::cuda::rows
