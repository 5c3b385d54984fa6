// Built instead of cuda_runtime.cpp when DTENSOR_WITH_CUDA is off.
#include <stdexcept>

#include "backend/cuda/cuda_runtime.h"

namespace dtensor::backend::cuda {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw std::runtime_error(std::string("[") + op +
                           "] this dtensor was built without CUDA; reconfigure with "
                           "-DDTENSOR_WITH_CUDA=ON on a machine with the CUDA toolkit");
}
}  // namespace

int device_count() { return 0; }
void* allocate(int, size_t) { no_cuda("cuda_allocate"); }
void free(int, void*) {}
void memcpy(void*, const void*, size_t, CopyKind) { no_cuda("cuda_memcpy"); }

}  // namespace dtensor::backend::cuda
