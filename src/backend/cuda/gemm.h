// Batched GEMM on the GPU (internal): gemm_cublaslt.cpp.
#pragma once

#include "backend/gemm_layout.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

// out = a @ b as `plan` maps it (backend/gemm_layout.h), on the current stream of
// `device`. Throws std::runtime_error for a dtype cuBLASLt does not take.
void gemm(const GemmPlan& plan, DType dtype, const void* a, const void* b, void* out, int device);

}  // namespace dtensor::backend::cuda
