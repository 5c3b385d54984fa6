// Device memory through the CUDA runtime API (built when DTENSOR_WITH_CUDA is on).
#include "backend/cuda/cuda_runtime.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::backend::cuda {
namespace {

void check(cudaError_t status, const char* op) {
  if (status != cudaSuccess) {
    throw std::runtime_error(detail::concat("[", op, "] CUDA error: ", cudaGetErrorString(status)));
  }
}

}  // namespace

int device_count() {
  // Without a driver cudaGetDeviceCount fails ("driver version is insufficient"):
  // that means "no GPU", never an error.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return count;
}

void* allocate(int device, size_t bytes) {
  DT_CHECK_SUPPORTED(device >= 0 && device < device_count(), "cuda_allocate", "expected a GPU index in [0, ",
                     device_count(), "), got ", device);
  check(cudaSetDevice(device), "cuda_allocate");
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, bytes), "cuda_allocate");
  return ptr;
}

void free(int device, void* ptr) {
  cudaSetDevice(device);
  cudaFree(ptr);  // never throws from a destructor path
}

void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, bytes, k), "cuda_memcpy");
}

}  // namespace dtensor::backend::cuda
