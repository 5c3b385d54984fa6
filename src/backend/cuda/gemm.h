// Batched GEMM on the GPU (internal): gemm_cublaslt.cpp.
#pragma once

#include "backend/gemm_layout.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

// out = a @ b as `plan` maps it (backend/gemm_layout.h), on the current stream of
// `device`. Throws std::runtime_error for a dtype cuBLASLt does not take.
void gemm(const GemmPlan& plan, DType dtype, const void* a, const void* b, void* out, int device);

// The same with cuBLASLt's bias epilogue: out[.., i, j] += bias[j] (bias [n],
// contiguous, out's dtype) in the GEMM's own epilogue. Returns false, having run
// nothing, where cuBLASLt has no such algorithm for these operands (F64, say): the
// caller then adds the bias itself.
bool gemm_bias(const GemmPlan& plan, DType dtype, const void* a, const void* b, const void* bias, void* out,
               int device);

// The same with cuBLASLt's GELU_AUX_BIAS epilogue (GELU_AUX without a bias): pre
// (out's layout and dtype) = a @ b [+ bias], out = gelu(pre) in the tanh form, both
// from the F32 accumulator. False, having run nothing, where cuBLASLt has no such
// algorithm or the operands break its rules (F64; pre's leading dimension, the
// output features, and batch stride must be multiples of 8).
bool gemm_bias_gelu(const GemmPlan& plan, DType dtype, const void* a, const void* b, const void* bias, void* out,
                    void* pre, int device);

}  // namespace dtensor::backend::cuda
