// CUDA factories: randn, rand and arange written on the device.
//
// Element i of a random fill is dtensor/random.h's normal/uniform(seed,
// index_offset + i), the very functions the CPU calls (__host__ __device__), so a
// seed gives the CPU's numbers; arange is scalar_ops.h's arange_value, the CPU's too,
// converted to the dtype as the CPU converts.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/factories.h"
#include "backend/cuda/store.cuh"
#include "backend/scalar_ops.h"
#include "dtensor/random.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 16));
}

// kind: 0 normal, 1 uniform.
__global__ void random_kernel(int kind, uint64_t seed, uint64_t index_offset, int64_t n, DType dtype, void* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t index = index_offset + static_cast<uint64_t>(i);
    const float v = kind == 0 ? random::normal(seed, index) : random::uniform(seed, index);
    store_as(dtype, out, i, v);
  }
}

__global__ void arange_kernel(double start, double step, int64_t n, DType dtype, void* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    store_as(dtype, out, i, scalar::arange_value(start, step, i));
  }
}

}  // namespace

void launch_random(RandomKind kind, uint64_t seed, uint64_t index_offset, int64_t n, DType dtype, void* out,
                   void* stream) {
  if (n == 0) return;
  random_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(kind == RandomKind::Normal ? 0 : 1,
                                                                                   seed, index_offset, n, dtype, out);
  check(cudaGetLastError(), "random kernel launch");
}

void launch_arange(double start, double step, int64_t n, DType dtype, void* out, void* stream) {
  if (n == 0) return;
  arange_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(start, step, n, dtype, out);
  check(cudaGetLastError(), "arange kernel launch");
}

}  // namespace dtensor::backend::cuda
