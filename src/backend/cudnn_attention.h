// cuDNN's fused attention (internal): the graphs of the forward (out and the
// log-sum-exp) and of the backward, built through cuDNN's backend API once per call
// key (cudnn_attention_plan.h) and thread, run on the caller's stream.
// cudnn/cudnn_attention.cpp where the build has cuDNN (DTENSOR_WITH_CUDNN), else
// cudnn/cudnn_attention_stub.cpp, whose prepare() refuses every call with the reason.
// The CUDA kernel table (cuda_kernels.cpp) decides, runs and falls back.
#pragma once

#include <cstdint>
#include <string>

#include "backend/cudnn_attention_plan.h"

namespace dtensor::backend::cudnn {

bool compiled();
// "9.19.0" (the library loaded at run time), or "" without cuDNN.
std::string version();
// What the call needs to know of `device` (compute capability, cuDNN's version).
AttentionTarget target(int device);
// Calls run through cuDNN in this process so far (forward and backward), for the
// tests and gpu_bench to see which engine ran.
int64_t runs();

// A graph ready to run on the calling thread, or why cuDNN does not take the call
// (no engine for it; a build without cuDNN). `workspace_bytes` of device memory go
// with every run (the backward's FP32 dQ accumulator and row sums included).
struct Prepared {
  const void* graph = nullptr;
  int64_t workspace_bytes = 0;
  std::string refusal;
};
// Builds the graph of `key` on the calling thread the first time (cached per thread
// and key, refusals too).
Prepared prepare(const AttentionKey& key);

// out [B, H, Sq, Dv] and stats [B, H, Sq] (the log-sum-exp of the scaled, masked
// scores) from q, k, v, as the graph's key laid them out; `workspace` holds
// prepared.workspace_bytes. Queued on `stream` (a cudaStream_t).
void run_forward(const Prepared& prepared, const void* q, const void* k, const void* v, void* out, float* stats,
                 float scale, void* workspace, void* stream);
// grad_q, grad_k, grad_v from the forward's operands, out, stats and grad_out.
void run_backward(const Prepared& prepared, const void* q, const void* k, const void* v, const void* out,
                  const void* grad_out, const float* stats, void* grad_q, void* grad_k, void* grad_v, float scale,
                  void* workspace, void* stream);

}  // namespace dtensor::backend::cudnn
