// The CUDA runtime pieces the core needs (internal): device memory and copies.
// cuda_runtime.cpp implements them with the CUDA runtime API when the build has
// CUDA (DTENSOR_WITH_CUDA); cuda_runtime_stub.cpp otherwise, where each throws a
// std::runtime_error that says how to get a CUDA build.
#pragma once

#include <cstddef>

namespace dtensor::backend::cuda {

int device_count();  // 0 when there is no driver or no GPU; never throws
void* allocate(int device, size_t bytes);
void free(int device, void* ptr);
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind);

}  // namespace dtensor::backend::cuda
