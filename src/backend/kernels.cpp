// Kernel tables and memory primitives by device.
#include "backend/kernels.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "backend/cpu/block_cache.h"
#include "backend/cuda/cuda_runtime.h"

namespace dtensor {

std::string Device::to_string() const {
  if (is_cpu()) return index == 0 ? std::string("cpu") : "cpu:" + std::to_string(index);
  return "cuda:" + std::to_string(index);
}
int cuda_device_count() { return backend::cuda::device_count(); }
bool cuda_is_available() { return cuda_device_count() > 0; }

namespace backend {

Kernels& cpu_kernels();  // cpu/cpu_kernels.cpp
namespace cuda {
Kernels& kernels();  // cuda/cuda_kernels.cpp (cuda/cuda_runtime_stub.cpp throws)
}

namespace {
std::atomic<Kernels*> cpu_replacement{nullptr};  // ScopedCpuKernels
}  // namespace

Kernels& kernels_for(Device device) {
  if (device.is_cpu()) {
    Kernels* replaced = cpu_replacement.load(std::memory_order_acquire);
    return replaced ? *replaced : cpu_kernels();
  }
  return cuda::kernels();
}

ScopedCpuKernels::ScopedCpuKernels(Kernels& replacement) {
  Kernels* expected = nullptr;
  if (!cpu_replacement.compare_exchange_strong(expected, &replacement)) {
    throw std::logic_error("[kernels] a ScopedCpuKernels is already active");
  }
}
ScopedCpuKernels::~ScopedCpuKernels() { cpu_replacement.store(nullptr, std::memory_order_release); }

void* device_allocate(Device device, size_t bytes) {
  if (device.is_cuda()) return cuda::allocate(device.index, bytes);
  return cpu::cached_allocate(bytes);
}

void device_free(Device device, void* ptr, size_t bytes) {
  if (device.is_cuda()) {
    cuda::free(device.index, ptr);
  } else {
    cpu::cached_free(ptr, bytes);
  }
}

void device_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const cuda::CopyKind kind = src_device.is_cpu()   ? cuda::CopyKind::HostToDevice
                              : dst_device.is_cpu() ? cuda::CopyKind::DeviceToHost
                                                    : cuda::CopyKind::DeviceToDevice;
  cuda::memcpy(dst, src, bytes, kind, dst_device.is_cuda() ? dst_device.index : src_device.index);
}

}  // namespace backend
}  // namespace dtensor
