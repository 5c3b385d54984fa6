// The fused optimizer steps on CUDA (internal): optim.cu.
#pragma once

#include <cstdint>

#include "backend/kernels.h"

namespace dtensor::backend::cuda {

// One AdamW step in place over n contiguous elements: param, exp_avg, exp_avg_sq F32,
// grad F32 or (bf16_grad) BF16 bit patterns. On `stream` (a cudaStream_t).
void launch_adamw(const AdamWStep& step, bool bf16_grad, int64_t n, float* param, const void* grad, float* exp_avg,
                  float* exp_avg_sq, void* stream);

}  // namespace dtensor::backend::cuda
