// CUDA streams, events and the caching allocator's controls.
//
// Every thread (every rank of the threads backend) has a current stream per GPU:
// the kernels and copies of CUDA tensors are queued on it, and freed device memory
// is reused by later allocations on the same stream without synchronisation (see
// docs/cuda.md). By default a thread's current stream is one of a fixed set of
// non-blocking streams per GPU, handed out round-robin on first use, so that ranks
// sharing a GPU do not serialise on one stream.
//
// In a build without CUDA every function here throws std::runtime_error saying so,
// except memory_pool_stats (all zero), empty_cache (nothing to do) and the TF32
// switch.
#pragma once

#include <cstdint>

namespace dtensor::cuda {

// A stream of one GPU (a handle: streams live as long as the process).
class Stream {
 public:
  Stream() = default;  // none
  int device() const { return device_; }
  void* handle() const { return handle_; }  // cudaStream_t
  bool valid() const { return handle_ != nullptr; }
  // Waits until the work queued on it has run.
  void synchronize() const;
  bool operator==(const Stream&) const = default;

  // The next stream of the GPU's set (round-robin, never destroyed).
  static Stream from_pool(int device = 0);

 private:
  Stream(int device, void* handle) : device_(device), handle_(handle) {}
  friend struct StreamAccess;
  int device_ = 0;
  void* handle_ = nullptr;
};

// The calling thread's current stream of `device`.
Stream current_stream(int device = 0);
void set_current_stream(Stream stream);

// Makes `stream` current for the scope, then restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A CUDA event: marks a point in a stream's work.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream stream);
  void record() { record(current_stream(device_)); }
  // Work queued on `stream` after this call runs after the recorded point.
  void wait(Stream stream) const;
  void synchronize() const;
  bool query() const;  // true once the recorded work has run
  // Milliseconds from this event to `end` (both recorded with timing on).
  float elapsed_ms(const Event& end) const;

 private:
  void* handle_ = nullptr;  // cudaEvent_t
  int device_ = 0;
  bool timing_ = false;
};

// FP32 matmuls on TF32 tensor cores (10-bit mantissa products, FP32 accumulation),
// as torch.backends.cuda.matmul.allow_tf32. Off by default; process-wide.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Waits for all work on the GPU.
void synchronize(int device = 0);

// The caching allocator of one GPU (sizes in bytes). allocated: handed out to
// tensors (rounded up to 512 bytes); reserved: taken from the driver.
struct MemoryPoolStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t segments = 0;
  int64_t allocations = 0;
  int64_t driver_allocations = 0;  // cudaMalloc calls (cache misses)
  int64_t driver_frees = 0;
};
MemoryPoolStats memory_pool_stats(int device = 0);
// Returns the cached (free) device memory of every GPU to the driver.
void empty_cache();

}  // namespace dtensor::cuda
