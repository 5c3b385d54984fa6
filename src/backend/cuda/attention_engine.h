// Which attention runs a call on CUDA tensors (internal): cuDNN's fused attention
// (cudnn_attention.h) where DTENSOR_ATTENTION allows it and cuDNN takes the call,
// else the own kernels (attention.cu). cuda_kernels.cpp asks here first.
#pragma once

#include <optional>
#include <vector>

#include "backend/cudnn_attention.h"
#include "dtensor/tensor.h"

namespace dtensor::backend::cuda {

// cuDNN's graph for the call whose operands are q, k, v, out (forward) or q, k, v,
// out, grad_out, grad_q, grad_k, grad_v (backward), or nullopt: DTENSOR_ATTENTION=own,
// F32 or F64 operands (the own kernels' without a word), or a call cuDNN refuses,
// whose reason is said once per reason on stderr (an error under
// DTENSOR_ATTENTION=cudnn).
std::optional<cudnn::Prepared> cudnn_attention_graph(const std::vector<const Tensor*>& operands, bool causal,
                                                     double scale, bool backward);

// `bytes` of device memory for a graph's workspace, from the caching allocator on
// the current stream (at least one word).
Tensor cudnn_workspace(int64_t bytes, Device device);

}  // namespace dtensor::backend::cuda
