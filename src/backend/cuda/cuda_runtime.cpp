// Device memory, streams, events and copies through the CUDA runtime API (built
// when DTENSOR_WITH_CUDA is on). The allocator's policy is host code shared with
// the CPU tests (backend/caching_allocator.h); this file provides its raw memory
// and events: cudaMalloc for device memory, cudaHostAlloc for the pinned staging
// buffers of host copies.
#include "backend/cuda/cuda_runtime.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/caching_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "dtensor/cuda.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor {
namespace cuda {
struct StreamAccess {
  static Stream make(int device, cudaStream_t s) { return Stream(device, s); }
};
}  // namespace cuda

namespace backend::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kStreamsPerDevice = 32;  // as PyTorch's stream pool

int checked_device(int device, const char* op) {
  const int n = device_count();
  // No GPU at all is what this machine does not support; a wrong index is the user's.
  DT_CHECK_SUPPORTED(n > 0, op, "cuda:", device, " requested but no GPU is visible (CUDA build, no device or driver)");
  DT_CHECK_ARG(device >= 0 && device < n, op, "expected a GPU index in [0, ", n, "), got cuda:", device);
  return device;
}

// Makes `device` the calling thread's CUDA device (cheap when it already is).
void use_device(int device) {
  thread_local int current = -1;
  if (current == device) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  current = device;
}

// The fixed set of streams per GPU, created on first use and never destroyed (a
// freed block may be queued on them until the process ends).
struct StreamSet {
  std::once_flag once;
  std::array<cudaStream_t, kStreamsPerDevice> streams{};
  std::atomic<unsigned> next{0};
};

StreamSet& stream_set(int device) {
  static std::array<StreamSet, kMaxDevices>* sets = new std::array<StreamSet, kMaxDevices>;
  StreamSet& set = (*sets)[static_cast<size_t>(device)];
  std::call_once(set.once, [&] {
    use_device(device);
    for (auto& s : set.streams) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  });
  return set;
}

cudaStream_t pool_stream(int device) {
  StreamSet& set = stream_set(device);
  return set.streams[set.next.fetch_add(1, std::memory_order_relaxed) % kStreamsPerDevice];
}

// The calling thread's current stream per device; null until first asked for.
std::array<cudaStream_t, kMaxDevices>& thread_streams() {
  thread_local std::array<cudaStream_t, kMaxDevices> streams{};
  return streams;
}

cudaStream_t current(int device) {
  use_device(device);
  cudaStream_t& s = thread_streams()[static_cast<size_t>(device)];
  if (!s) s = pool_stream(device);
  return s;
}

// Events for the allocator: no timing (cheaper to record and query).
class EventsOf : public DeviceMemoryProvider {
 public:
  explicit EventsOf(int device) : device_(device) {}
  void* record_event(StreamId stream) override {
    use_device(device_);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)), "cudaEventRecord");
    return e;
  }
  bool query_event(void* event) override {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(status, "cudaEventQuery");
    return true;
  }
  void synchronize_event(void* event) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
  }
  void destroy_event(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

 protected:
  int device_;
};

class DeviceMemory final : public EventsOf {
 public:
  using EventsOf::EventsOf;
  void* allocate(size_t bytes) override {
    use_device(device_);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: the allocator returns its cache and retries
      return nullptr;
    }
    check(status, "cudaMalloc");
    return ptr;
  }
  void free(void* ptr) override {
    use_device(device_);
    check(cudaFree(ptr), "cudaFree");
  }
  std::string name() const override { return "cuda:" + std::to_string(device_); }
};

class PinnedMemory final : public EventsOf {
 public:
  using EventsOf::EventsOf;
  void* allocate(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    check(status, "cudaHostAlloc");
    return ptr;
  }
  void free(void* ptr) override { check(cudaFreeHost(ptr), "cudaFreeHost"); }
  std::string name() const override { return "pinned host"; }
};

// One allocator per GPU and one for pinned memory, made on first use and never
// destroyed (tensors may be freed during exit, after the CUDA runtime is gone).
CachingAllocator& device_allocator(int device) {
  static std::array<std::once_flag, kMaxDevices>* once = new std::array<std::once_flag, kMaxDevices>;
  static std::array<CachingAllocator*, kMaxDevices>* all = new std::array<CachingAllocator*, kMaxDevices>{};
  std::call_once((*once)[static_cast<size_t>(device)], [&] {
    (*all)[static_cast<size_t>(device)] = new CachingAllocator(std::make_unique<DeviceMemory>(device));
  });
  return *(*all)[static_cast<size_t>(device)];
}

CachingAllocator& pinned_allocator() {
  static CachingAllocator* pinned = new CachingAllocator(std::make_unique<PinnedMemory>(0));
  return *pinned;
}

// Pinned blocks are written by the host, not by a stream: they are allocated on
// this pseudo-stream, and reused only after the streams they were copied on have
// run past the copy (record_stream before free).
constexpr StreamId kHostUse = ~StreamId{0};

constexpr size_t kStagedFrom = size_t{1} << 20;  // smaller copies go directly
constexpr size_t kStagingChunk = size_t{8} << 20;

struct Staging {
  std::array<void*, 2> buffers{};
  std::array<cudaEvent_t, 2> done{};
  cudaStream_t stream;
  explicit Staging(cudaStream_t s) : stream(s) {
    try {
      for (auto& b : buffers) b = pinned_allocator().allocate(kStagingChunk, kHostUse);
      for (auto& e : done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    } catch (...) {
      release();
      throw;
    }
  }
  ~Staging() { release(); }
  // The buffers go back once the stream has run past the copies that read or fill them.
  void release() noexcept {
    for (void*& b : buffers) {
      if (!b) continue;
      try {
        pinned_allocator().record_stream(b, reinterpret_cast<StreamId>(stream));
        pinned_allocator().free(b);
      } catch (...) {
      }
      b = nullptr;
    }
    for (cudaEvent_t& e : done) {
      if (e) cudaEventDestroy(e);
      e = nullptr;
    }
  }
};

// Host to device through pinned buffers: the host fills one while the other is
// copied. Returns once the source has been read.
void staged_to_device(char* dst, const char* src, size_t bytes, cudaStream_t stream) {
  Staging st(stream);
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  for (size_t i = 0; i < chunks; ++i) {
    const size_t k = i % 2, off = i * kStagingChunk, n = std::min(kStagingChunk, bytes - off);
    if (i >= 2) check(cudaEventSynchronize(st.done[k]), "cudaEventSynchronize");
    std::memcpy(st.buffers[k], src + off, n);
    check(cudaMemcpyAsync(dst + off, st.buffers[k], n, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    check(cudaEventRecord(st.done[k], stream), "cudaEventRecord");
  }
}

// Device to host: the next piece is copied into one buffer while the host reads
// the last one out of the other.
void staged_to_host(char* dst, const char* src, size_t bytes, cudaStream_t stream) {
  Staging st(stream);
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  auto issue = [&](size_t i) {
    const size_t k = i % 2, off = i * kStagingChunk, n = std::min(kStagingChunk, bytes - off);
    check(cudaMemcpyAsync(st.buffers[k], src + off, n, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaEventRecord(st.done[k], stream), "cudaEventRecord");
  };
  issue(0);
  for (size_t i = 0; i < chunks; ++i) {
    if (i + 1 < chunks) issue(i + 1);
    const size_t k = i % 2, off = i * kStagingChunk, n = std::min(kStagingChunk, bytes - off);
    check(cudaEventSynchronize(st.done[k]), "cudaEventSynchronize");
    std::memcpy(dst + off, st.buffers[k], n);
  }
}

}  // namespace

int device_count() {
  // Without a driver cudaGetDeviceCount fails ("driver version is insufficient"):
  // that means "no GPU", never an error. Asked once: the answer does not change.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error
      return 0;
    }
    return std::min(n, kMaxDevices);
  }();
  return count;
}

void* current_stream(int device) { return current(checked_device(device, "cuda_stream")); }

void* allocate(int device, size_t bytes) {
  checked_device(device, "cuda_allocate");
  return device_allocator(device).allocate(bytes, reinterpret_cast<StreamId>(current(device)));
}

void free(int device, void* ptr) {
  // Never throws (a destructor path): a pointer from elsewhere is a bug of ours.
  try {
    device_allocator(device).free(ptr);
  } catch (...) {
  }
}

void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, int device) {
  cudaStream_t stream = current(checked_device(device, "cuda_memcpy"));
  switch (kind) {
    case CopyKind::HostToDevice:
      if (bytes >= kStagedFrom)
        return staged_to_device(static_cast<char*>(dst), static_cast<const char*>(src), bytes, stream);
      // CUDA does not promise that a pageable source has been read when cudaMemcpyAsync
      // returns (it "may" stage it), and the caller may free it next: wait, as PyTorch's
      // blocking copy does.
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      return;
    case CopyKind::DeviceToHost:
      if (bytes >= kStagedFrom)
        return staged_to_host(static_cast<char*>(dst), static_cast<const char*>(src), bytes, stream);
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      return;
    case CopyKind::DeviceToDevice:
      // Unified addressing finds both devices (a peer copy when they differ).
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
      return;
  }
}

}  // namespace backend::cuda

// ---- the public API (dtensor/cuda.h) ----------------------------------------------
namespace cuda {
namespace bc = backend::cuda;
using bc::check;

void Stream::synchronize() const {
  DT_CHECK_ARG(valid(), "cuda_stream", "expected a stream, got none");
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)), "cudaStreamSynchronize");
}

Stream Stream::from_pool(int device) {
  bc::checked_device(device, "cuda_stream");
  return StreamAccess::make(device, bc::pool_stream(device));
}

Stream current_stream(int device) {
  return StreamAccess::make(device, static_cast<cudaStream_t>(bc::current_stream(device)));
}

void set_current_stream(Stream stream) {
  DT_CHECK_ARG(stream.valid(), "cuda_stream", "expected a stream, got none");
  bc::thread_streams()[static_cast<size_t>(bc::checked_device(stream.device(), "cuda_stream"))] =
      static_cast<cudaStream_t>(stream.handle());
}

StreamGuard::StreamGuard(Stream stream) : previous_(current_stream(stream.device())) { set_current_stream(stream); }
StreamGuard::~StreamGuard() { set_current_stream(previous_); }

Event::Event(bool timing) : timing_(timing) {}

Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_), timing_(other.timing_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    timing_ = other.timing_;
  }
  return *this;
}

void Event::record(Stream stream) {
  DT_CHECK_ARG(stream.valid(), "cuda_event", "expected a stream, got none");
  if (!handle_) {
    bc::use_device(stream.device());
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
    handle_ = e;
    device_ = stream.device();
  }
  DT_CHECK_ARG(stream.device() == device_, "cuda_event", "expected a stream of cuda:", device_,
               " (where the event was first recorded), got one of cuda:", stream.device());
  check(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle())),
        "cudaEventRecord");
}

void Event::wait(Stream stream) const {
  if (!handle_) return;  // nothing recorded: nothing to wait for
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle()), static_cast<cudaEvent_t>(handle_), 0),
        "cudaStreamWaitEvent");
}

void Event::synchronize() const {
  if (handle_) check(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), "cudaEventSynchronize");
}

bool Event::query() const {
  if (!handle_) return true;
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check(status, "cudaEventQuery");
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  DT_CHECK_ARG(timing_ && end.timing_ && handle_ && end.handle_, "cuda_event",
               "expected two recorded events made with timing on");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)),
        "cudaEventElapsedTime");
  return ms;
}

void synchronize(int device) {
  bc::use_device(bc::checked_device(device, "cuda_synchronize"));
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

MemoryPoolStats memory_pool_stats(int device) {
  if (device < 0 || device >= bc::device_count()) return {};
  const backend::CachingAllocatorStats s = bc::device_allocator(device).stats();
  return {s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes,       s.peak_reserved_bytes,
          s.segments,        s.allocations,          s.provider_allocations, s.provider_frees};
}

void empty_cache() {
  for (int d = 0; d < bc::device_count(); ++d) bc::device_allocator(d).empty_cache();
  bc::pinned_allocator().empty_cache();
}

}  // namespace cuda
}  // namespace dtensor
