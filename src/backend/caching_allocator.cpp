// The caching, stream-ordered allocator's policy (see caching_allocator.h).
#include "backend/caching_allocator.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "dtensor/error.h"

namespace dtensor::backend {

// A piece of a segment: free in a pool, handed out, or held for events. Neighbours
// in the same segment are linked so that freed pieces merge again.
struct CachingAllocator::Block {
  StreamId stream = 0;
  size_t size = 0;
  char* ptr = nullptr;
  bool small = false;      // from a small-pool segment
  bool allocated = false;  // handed out
  int pending_events = 0;  // held until this many events complete
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<StreamId> other_streams;  // record_stream while handed out
};

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  return std::make_tuple(a->stream, a->size, reinterpret_cast<uintptr_t>(a->ptr)) <
         std::make_tuple(b->stream, b->size, reinterpret_cast<uintptr_t>(b->ptr));
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemoryProvider> provider) : provider_(std::move(provider)) {}

CachingAllocator::~CachingAllocator() {
  // Blocks still handed out belong to tensors that outlive the allocator (at exit);
  // their segments stay with the provider, which the process is about to lose.
  try {
    empty_cache();
  } catch (...) {
  }
  for (auto& [ptr, block] : allocated_) delete block;
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes < kMinBlock) return kMinBlock;
  return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::Pool& CachingAllocator::pool_of(const Block* block) { return block->small ? small_ : large_; }

CachingAllocator::Block* CachingAllocator::find_free(Pool& pool, size_t rounded, StreamId stream) {
  Block key;
  key.stream = stream;
  key.size = rounded;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t rounded, StreamId stream) {
  const size_t size = segment_size(rounded);
  void* ptr = provider_->allocate(size);
  if (!ptr) return nullptr;
  auto* block = new Block;
  block->stream = stream;
  block->size = size;
  block->ptr = static_cast<char*>(ptr);
  block->small = rounded <= kSmallSize;
  stats_.reserved_bytes += static_cast<int64_t>(size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.segments;
  ++stats_.provider_allocations;
  return block;
}

CachingAllocator::Block* CachingAllocator::split(Block* block, size_t rounded) {
  const size_t rest = block->size - rounded;
  const bool worth = block->small ? rest >= kMinBlock : rest > kSmallSize;
  if (!worth) return block;
  auto* tail = new Block;
  tail->stream = block->stream;
  tail->size = rest;
  tail->ptr = block->ptr + rounded;
  tail->small = block->small;
  tail->prev = block;
  tail->next = block->next;
  if (block->next) block->next->prev = tail;
  block->next = tail;
  block->size = rounded;
  pool_of(tail).insert(tail);
  return block;
}

void* CachingAllocator::allocate(size_t bytes, StreamId stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  const size_t rounded = round_size(bytes);
  Pool& pool = pool_for(rounded);
  Block* block = find_free(pool, rounded, stream);
  if (!block) block = new_segment(rounded, stream);
  if (!block) {
    // Out of memory: give back what is cached (other streams' too) and try again.
    wait_for_events();
    release_segments();
    block = new_segment(rounded, stream);
  }
  if (!block) {
    throw std::runtime_error(detail::concat("[", provider_->name(), " allocate] out of memory: tried to allocate ",
                                            segment_size(rounded), " bytes for a request of ", bytes, " bytes; ",
                                            stats_.allocated_bytes, " bytes allocated, ", stats_.reserved_bytes,
                                            " reserved (after returning the cache)"));
  }
  block = split(block, rounded);
  block->allocated = true;
  allocated_.emplace(block->ptr, block);
  stats_.allocated_bytes += static_cast<int64_t>(block->size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.allocations;
  return block->ptr;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) {
    throw std::invalid_argument(
        detail::concat("[", provider_->name(), " free] a pointer this allocator did not hand out (or freed twice)"));
  }
  Block* block = it->second;
  allocated_.erase(it);
  block->allocated = false;
  stats_.allocated_bytes -= static_cast<int64_t>(block->size);
  if (block->other_streams.empty()) {
    release_to_pool(block);
    return;
  }
  // Its own stream orders its reuse; the other streams must be done with it first.
  for (StreamId s : block->other_streams) {
    pending_.push_back({provider_->record_event(s), block});
    ++block->pending_events;
  }
  block->other_streams.clear();
  ++stats_.held_blocks;
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) {
    throw std::invalid_argument(
        detail::concat("[", provider_->name(), " record_stream] a pointer this allocator did not hand out"));
  }
  Block* block = it->second;
  if (stream == block->stream) return;
  auto& others = block->other_streams;
  if (std::find(others.begin(), others.end(), stream) == others.end()) others.push_back(stream);
}

void CachingAllocator::release_to_pool(Block* block) {
  Pool& pool = pool_of(block);
  auto is_free = [](const Block* b) { return b && !b->allocated && b->pending_events == 0; };
  if (is_free(block->prev)) {
    Block* prev = block->prev;
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (is_free(block->next)) {
    Block* next = block->next;
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  pool.insert(block);
}

void CachingAllocator::process_events() {
  auto done = [&](Pending& p) {
    if (!provider_->query_event(p.event)) return false;
    provider_->destroy_event(p.event);
    if (--p.block->pending_events == 0) {
      --stats_.held_blocks;
      release_to_pool(p.block);
    }
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
}

void CachingAllocator::wait_for_events() {
  for (Pending& p : pending_) provider_->synchronize_event(p.event);
  process_events();
}

void CachingAllocator::release_segments() {
  for (Pool* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev || block->next) {  // part of a segment still in use
        ++it;
        continue;
      }
      provider_->free(block->ptr);
      stats_.reserved_bytes -= static_cast<int64_t>(block->size);
      --stats_.segments;
      ++stats_.provider_frees;
      it = pool->erase(it);
      delete block;
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  wait_for_events();
  release_segments();
}

CachingAllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace dtensor::backend
