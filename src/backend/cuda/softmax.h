// CUDA softmax and log_softmax along any dim, forward and backward (internal):
// softmax.cu. The lines along the dim are described by line_plan.h.
#pragma once

#include "backend/line_plan.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

// Operands: 0 out, 1 input. On `stream` (a cudaStream_t).
void launch_softmax(DType dtype, const LinePlan<2>& plan, bool log, void* out, const void* in, void* stream);
// Operands: 0 grad_in, 1 grad_out, 2 the forward's output.
void launch_softmax_backward(DType dtype, const LinePlan<3>& plan, bool log, void* grad_in, const void* grad_out,
                             const void* out, void* stream);

}  // namespace dtensor::backend::cuda
