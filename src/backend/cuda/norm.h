// CUDA layer_norm and rms_norm, forward and backward (internal): norm.cu. x is a
// contiguous [rows, cols] matrix; weight/bias [cols] or null; the saved statistics
// are [rows] in the compute type (F32 for BF16/F16), as on the CPU.
#pragma once

#include <cstdint>

#include "backend/line_plan.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

struct NormShape {
  int64_t rows = 0, cols = 0;
  bool centered = true;  // layer_norm; rms_norm is without centring (and bias)
};

// The chunks of the weight/bias gradients' first pass: one F64 partial per chunk and
// column, then one pass adding each column's partials in chunk order.
RowChunks norm_gradient_chunks(int64_t rows);

void launch_norm(DType dtype, const NormShape& shape, double eps, const void* x, const void* weight, const void* bias,
                 void* out, void* mean, void* rstd, void* stream);

// grad_weight/grad_bias may be null (not wanted); `partials` then holds
// chunks * cols doubles per wanted gradient (weight first, then bias).
void launch_norm_backward(DType dtype, const NormShape& shape, const void* grad_out, const void* x, const void* mean,
                          const void* rstd, const void* weight, void* grad_in, void* grad_weight, void* grad_bias,
                          double* partials, void* stream);

}  // namespace dtensor::backend::cuda
