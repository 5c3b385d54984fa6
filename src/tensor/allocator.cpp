// Storage and the per-rank memory counters.
#include "dtensor/allocator.h"

#include <stdexcept>
#include <string>

#include "backend/cpu/block_cache.h"
#include "backend/kernels.h"

namespace dtensor {
namespace {

std::shared_ptr<RankMemoryCounters>& process_counters() {
  static auto counters = std::make_shared<RankMemoryCounters>();
  return counters;
}

// The calling rank's counters; null means the process-wide ones.
thread_local std::shared_ptr<RankMemoryCounters> thread_counters;

const std::shared_ptr<RankMemoryCounters>& calling_counters() {
  return thread_counters ? thread_counters : process_counters();
}

const std::shared_ptr<MemoryCounter>& counter_for(Device device) {
  const auto& counters = calling_counters();
  if (device.is_cuda()) return counters->cuda;
  if (device.index < 0 || device.index >= Device::kCpuDevices) {
    throw std::invalid_argument("[memory] no device " + device.to_string() +
                                ": the CPU devices are cpu (cpu:0) and cpu:1");
  }
  return device.index == 0 ? counters->cpu : counters->cpu_host;
}

}  // namespace

void MemoryCounter::add(int64_t bytes) {
  const int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  allocations_.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryCounter::remove(int64_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }

void MemoryCounter::reset_peak() { peak_.store(live_.load(std::memory_order_relaxed)); }

MemoryStats MemoryCounter::stats() const {
  return {live_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed),
          allocations_.load(std::memory_order_relaxed)};
}

MemoryStats memory_stats(Device device) { return counter_for(device)->stats(); }
int64_t cached_memory_bytes() { return backend::cpu::cached_bytes(); }
void release_cached_memory() { backend::cpu::release_cached_blocks(); }
void reset_peak_memory(Device device) { counter_for(device)->reset_peak(); }

std::shared_ptr<RankMemoryCounters> current_memory_counters() { return calling_counters(); }

ScopedMemoryCounters::ScopedMemoryCounters(std::shared_ptr<RankMemoryCounters> counters)
    : previous_(std::move(thread_counters)) {
  thread_counters = std::move(counters);
}
ScopedMemoryCounters::~ScopedMemoryCounters() { thread_counters = std::move(previous_); }

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;  // empty tensors own no memory and are not counted
  // First: it throws for a device that does not exist, before anything is allocated.
  counter_ = counter_for(device);
  data_ = backend::device_allocate(device, bytes);
  counter_->add(static_cast<int64_t>(bytes));
}

Storage::Storage(void* data, size_t bytes, Device device, std::function<void()> release)
    : data_(data), bytes_(bytes), device_(device), release_foreign_(std::move(release)) {}

Storage::~Storage() { release_memory(); }

void Storage::release_memory() {
  if (release_foreign_) {
    // Cleared before the call so that it runs once, even for an empty block (data_ null).
    std::function<void()> release = std::move(release_foreign_);
    release_foreign_ = nullptr;
    data_ = nullptr;
    release();
    return;
  }
  if (!data_) return;
  backend::device_free(device_, data_, bytes_);
  counter_->remove(static_cast<int64_t>(bytes_));
  data_ = nullptr;
}

void Storage::restore_memory() {
  if (holds_memory()) return;
  // Charged to the rank that restores it (the one that released it, in practice).
  counter_ = counter_for(device_);
  data_ = backend::device_allocate(device_, bytes_);
  counter_->add(static_cast<int64_t>(bytes_));
}

}  // namespace dtensor
