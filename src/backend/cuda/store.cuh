// Device-side stores of one computed value as an element of a run-time dtype, with
// the CPU's conversions (internal; reduce.cu, factories.cu): 16-bit floats round
// from F32 to nearest even, integers truncate, Bool is "nonzero".
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/scalar_ops.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

// out[o] = v as an element of `dtype` (out contiguous of that dtype).
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

}  // namespace dtensor::backend::cuda
