// The fused AdamW step on CUDA: one grid-stride pass over param, grad, exp_avg and
// exp_avg_sq, the per-element math of backend/optim_math.h (checked on the CPU
// against the CPU's vector kernel). F32 parameters and state; F32 or BF16 gradients.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/optim.h"
#include "backend/optim_math.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load_grad(const float* g, int64_t i) { return g[i]; }
__device__ __forceinline__ float load_grad(const uint16_t* g, int64_t i) { return scalar::bf16_bits_to_f32(g[i]); }

template <class G>
__global__ void adamw_kernel(AdamWFactors f, int64_t n, float* param, const G* grad, float* exp_avg,
                             float* exp_avg_sq) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_update(f, p, load_grad(grad, i), m, v);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

}  // namespace

void launch_adamw(const AdamWStep& step, bool bf16_grad, int64_t n, float* param, const void* grad, float* exp_avg,
                  float* exp_avg_sq, void* stream) {
  if (n == 0) return;
  const AdamWFactors f = adamw_factors(step);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16));
  auto s = static_cast<cudaStream_t>(stream);
  if (bf16_grad) {
    adamw_kernel<<<blocks, kThreads, 0, s>>>(f, n, param, static_cast<const uint16_t*>(grad), exp_avg, exp_avg_sq);
  } else {
    adamw_kernel<<<blocks, kThreads, 0, s>>>(f, n, param, static_cast<const float*>(grad), exp_avg, exp_avg_sq);
  }
  check(cudaGetLastError(), "adamw kernel launch");
}

}  // namespace dtensor::backend::cuda
