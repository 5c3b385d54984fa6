// CUDA reductions (internal): reduce.cu.
#pragma once

#include <cstdint>

#include "backend/offset_calc.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

enum class ReduceOp : uint8_t { Sum, Mean, Max, Min };

// out[o] = op over r of in[plan.kept(o) + plan.reduced(r)], accumulated as on the CPU
// (double for float inputs, int64 for integers), written as `out_dtype`; out
// contiguous. On `stream` (a cudaStream_t).
void launch_reduce(ReduceOp op, DType in_dtype, DType out_dtype, const ReducePlan& plan, void* out, const void* in,
                   void* stream);

}  // namespace dtensor::backend::cuda
