// CUDA cross entropy over the rows of [N, C] logits, forward and backward
// (internal): cross_entropy.cu. The targets have been checked on the host (every
// target is ignore_index or in [0, C)).
#pragma once

#include <cstdint>

#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

struct CrossEntropyRows {
  int64_t rows = 0, classes = 0;
  int64_t row_stride = 0, class_stride = 0;  // of the logits, in elements
  int64_t target_stride = 0;                 // of the targets (I64 or I32)
  int64_t ignore_index = -100;
};

// losses [N] contiguous in the compute type (F32 for BF16/F16): 0 for ignored rows.
void launch_cross_entropy(DType dtype, DType target_dtype, const CrossEntropyRows& rows, const void* logits,
                          const void* targets, void* losses, void* stream);
// grad_rows [N] contiguous F64; grad_logits [N, C] contiguous, 0 in ignored rows.
void launch_cross_entropy_backward(DType dtype, DType target_dtype, const CrossEntropyRows& rows,
                                   const double* grad_rows, const void* logits, const void* targets, void* grad_logits,
                                   void* stream);

}  // namespace dtensor::backend::cuda
