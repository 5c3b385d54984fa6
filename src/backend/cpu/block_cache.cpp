// The large-block cache (see block_cache.h).
#include "backend/cpu/block_cache.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

namespace dtensor::backend::cpu {
namespace {

constexpr size_t kAlign = 64;                     // a cache line, the widest vector register
constexpr size_t kCachedFrom = size_t{1} << 20;   // 1 MiB
constexpr size_t kGranule = size_t{64} << 10;     // 64 KiB
constexpr size_t kBudget = size_t{2} << 30;       // at most 2 GiB held

size_t rounded(size_t bytes) {
  if (bytes < kCachedFrom) return (bytes + kAlign - 1) / kAlign * kAlign;
  return (bytes + kGranule - 1) / kGranule * kGranule;
}

struct Cache {
  std::mutex mutex;
  std::multimap<size_t, void*> blocks;  // rounded size -> block
  size_t held = 0;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: tensors may be freed at exit
  return *c;
}

}  // namespace

void* cached_allocate(size_t bytes) {
  const size_t size = rounded(bytes);
  if (size >= kCachedFrom) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.blocks.find(size);
    if (it != c.blocks.end()) {
      void* ptr = it->second;
      c.blocks.erase(it);
      c.held -= size;
      return ptr;
    }
  }
  void* ptr = std::aligned_alloc(kAlign, size);
  if (!ptr) throw std::bad_alloc();
  return ptr;
}

void cached_free(void* ptr, size_t bytes) {
  const size_t size = rounded(bytes);
  if (size >= kCachedFrom) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.held + size <= kBudget) {
      c.blocks.emplace(size, ptr);
      c.held += size;
      return;
    }
  }
  std::free(ptr);
}

int64_t cached_bytes() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return static_cast<int64_t>(c.held);
}

void release_cached_blocks() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [size, ptr] : c.blocks) std::free(ptr);
  c.blocks.clear();
  c.held = 0;
}

}  // namespace dtensor::backend::cpu
