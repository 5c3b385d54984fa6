// CUDA runtime errors as exceptions (internal): "[call] CUDA error: <string>".
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace dtensor::backend::cuda {

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so that later calls can succeed
    throw std::runtime_error(std::string("[") + call + "] CUDA error: " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
  }
}

}  // namespace dtensor::backend::cuda
