// Device memory and its byte counters.
//
// Every allocation is charged to the memory counter of the rank that made it, so
// "peak bytes on rank 1" means the same thing whether ranks are threads of one
// process (the counter is thread-local, installed by `launch`) or processes.
// A buffer freed on another thread is still returned to the counter it came from.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "dtensor/device.h"

namespace dtensor {

struct MemoryStats {
  int64_t live_bytes = 0;   // allocated now
  int64_t peak_bytes = 0;   // most ever live since the last reset_peak_memory
  int64_t allocations = 0;  // number of allocations since the counter was made
};

// Counters of one rank for one device kind. Lock-free: allocations are hot.
class MemoryCounter {
 public:
  void add(int64_t bytes);
  void remove(int64_t bytes);
  void reset_peak();
  MemoryStats stats() const;

 private:
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// Counters of the calling rank (the process-wide counters outside `launch`).
MemoryStats memory_stats(Device device = Device::cpu());
void reset_peak_memory(Device device = Device::cpu());

// Freed CPU blocks of 1 MiB and more are kept for reuse (a step of training
// allocates the same sizes again; fresh large blocks cost a page fault per 4 KiB).
// They are not counted as live. cached_memory_bytes() says how much is held;
// release_cached_memory() gives it back to the system.
int64_t cached_memory_bytes();
void release_cached_memory();

// A set of counters (one per device kind) for one rank.
struct RankMemoryCounters {
  std::shared_ptr<MemoryCounter> cpu = std::make_shared<MemoryCounter>();
  std::shared_ptr<MemoryCounter> cpu_host = std::make_shared<MemoryCounter>();  // cpu:1 (device.h)
  std::shared_ptr<MemoryCounter> cuda = std::make_shared<MemoryCounter>();
};

// The calling thread's counters (the process-wide ones outside `launch`): a helper
// thread of a rank installs them to count its bytes as the rank's.
std::shared_ptr<RankMemoryCounters> current_memory_counters();

// Installs `counters` as the calling thread's counters until destroyed; `launch`
// uses it so each rank thread counts its own bytes.
class ScopedMemoryCounters {
 public:
  explicit ScopedMemoryCounters(std::shared_ptr<RankMemoryCounters> counters);
  ~ScopedMemoryCounters();
  ScopedMemoryCounters(const ScopedMemoryCounters&) = delete;
  ScopedMemoryCounters& operator=(const ScopedMemoryCounters&) = delete;

 private:
  std::shared_ptr<RankMemoryCounters> previous_;
};

// A block of device memory owned by one or more tensors. CPU blocks are 64-byte
// aligned. Freed (and uncounted) when the last owner lets go.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  // Memory allocated by someone else (a DLPack import): `release` runs once, when
  // the storage is destroyed or release_memory() is called, and must return the
  // memory to its owner without throwing. Not charged to the memory counters.
  // `data` may be null when `bytes` is 0.
  Storage(void* data, size_t bytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // Frees the memory but keeps the size: tensors viewing this storage keep their
  // shapes, and reading or writing them throws until restore_memory(). FSDP frees a
  // module's gathered parameters after forward this way while the autograd graph
  // still holds views of them, and gathers into the restored block before backward.
  void release_memory();
  // Allocates the block again (contents undefined); nothing to do when it holds memory.
  // Foreign memory, once released, is replaced by a block of dtensor's own.
  void restore_memory();
  bool holds_memory() const { return data_ != nullptr || bytes_ == 0; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  std::shared_ptr<MemoryCounter> counter_;
  std::function<void()> release_foreign_;  // set while data_ is foreign memory
};

}  // namespace dtensor
