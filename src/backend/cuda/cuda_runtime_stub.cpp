// Built instead of cuda_runtime.cpp when DTENSOR_WITH_CUDA is off.
#include <atomic>
#include <stdexcept>

#include "backend/cuda/cuda_runtime.h"
#include "backend/kernels.h"
#include "dtensor/cuda.h"

namespace dtensor {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw std::runtime_error(std::string("[") + op +
                           "] this dtensor was built without CUDA; reconfigure with "
                           "-DDTENSOR_WITH_CUDA=ON on a machine with the CUDA toolkit");
}
}  // namespace

namespace backend::cuda {
int device_count() { return 0; }
void* allocate(int, size_t) { no_cuda("cuda_allocate"); }
void free(int, void*) {}
void memcpy(void*, const void*, size_t, CopyKind, int) { no_cuda("cuda_memcpy"); }
void* current_stream(int) { no_cuda("cuda_stream"); }
Kernels& kernels() { no_cuda("kernels"); }
}  // namespace backend::cuda

namespace cuda {
void Stream::synchronize() const { no_cuda("cuda_stream"); }
Stream Stream::from_pool(int) { no_cuda("cuda_stream"); }
Stream current_stream(int) { no_cuda("cuda_stream"); }
void set_current_stream(Stream) { no_cuda("cuda_stream"); }
StreamGuard::StreamGuard(Stream) { no_cuda("cuda_stream"); }
StreamGuard::~StreamGuard() = default;
Event::Event(bool) { no_cuda("cuda_event"); }
Event::~Event() = default;
Event::Event(Event&& other) noexcept : handle_(other.handle_), device_(other.device_), timing_(other.timing_) {}
Event& Event::operator=(Event&& other) noexcept {
  handle_ = other.handle_;
  device_ = other.device_;
  timing_ = other.timing_;
  return *this;
}
void Event::record(Stream) { no_cuda("cuda_event"); }
void Event::wait(Stream) const { no_cuda("cuda_event"); }
void Event::synchronize() const { no_cuda("cuda_event"); }
bool Event::query() const { no_cuda("cuda_event"); }
float Event::elapsed_ms(const Event&) const { no_cuda("cuda_event"); }
void synchronize(int) { no_cuda("cuda_synchronize"); }
MemoryPoolStats memory_pool_stats(int) { return {}; }
namespace {
std::atomic<bool> tf32{false};
}
void set_allow_tf32(bool allow) { tf32 = allow; }
bool allow_tf32() { return tf32; }
void empty_cache() {}
}  // namespace cuda
}  // namespace dtensor
