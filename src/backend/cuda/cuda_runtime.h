// The CUDA runtime pieces the core needs (internal): device memory through the
// caching allocator, copies on the current stream, the current stream itself.
// cuda_runtime.cpp implements them with the CUDA runtime API when the build has
// CUDA (DTENSOR_WITH_CUDA); cuda_runtime_stub.cpp otherwise, where each throws a
// std::runtime_error that says how to get a CUDA build.
#pragma once

#include <cstddef>

namespace dtensor::backend::cuda {

int device_count();  // 0 when there is no driver or no GPU; never throws
// From the caching allocator, for use on the calling thread's current stream.
void* allocate(int device, size_t bytes);
void free(int device, void* ptr);
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
// Queued on the current stream of the device involved (of dst for device to
// device); returns once the host may reuse (HostToDevice) or read (DeviceToHost)
// its buffer. Large host copies go through pinned staging buffers in pieces, so
// that the host's memcpy and the DMA overlap.
void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, int device);
// The calling thread's current stream of `device` (a cudaStream_t), made current
// on the calling thread's CUDA context.
void* current_stream(int device);

}  // namespace dtensor::backend::cuda
