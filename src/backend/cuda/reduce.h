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

// out[o] = the variance over r of in[plan.kept(o) + plan.reduced(r)] with `correction`
// (the CPU's two passes in double), written as `out_dtype`; out contiguous.
void launch_var(DType in_dtype, DType out_dtype, const ReducePlan& plan, int64_t correction, void* out, const void* in,
                void* stream);
// out[o] = the index r of the maximum of in[plan.kept(o) + plan.reduced(r)], the CPU's
// rule (first maximum, NaN wins); plan has one reduced dim, reduced_numel > 0.
void launch_argmax(DType in_dtype, const ReducePlan& plan, int64_t* out, const void* in, void* stream);

}  // namespace dtensor::backend::cuda
