// A caching, stream-ordered device allocator (internal), in plain host C++.
//
// The policy of PyTorch's CUDACachingAllocator, over an abstract provider of raw
// device memory and events, so that the same code serves the CUDA backend (the
// provider calls cudaMalloc/cudaFree and cudaEventRecord/Query) and runs in CTest on
// the CPU over host memory:
// - Requests are rounded up to 512 bytes. Requests up to 1 MiB come from the small
//   pool, carved out of 2 MiB segments; larger ones from the large pool (20 MiB
//   segments below 10 MiB, else the request rounded up to 2 MiB).
// - A free block goes back to the pool of the stream it was allocated on and is
//   reused by that stream only: work queued on one stream runs in order, so the
//   next allocation on that stream cannot touch the memory before the last use has
//   run. No synchronisation, no device call per allocation.
// - A block used on other streams as well (record_stream) is held after free until
//   an event recorded on each of those streams at free time has completed.
// - Best fit by (stream, size); a block larger than the request is split and the
//   rest stays in the pool (small: rest >= 512 bytes; large: rest > 1 MiB); freed
//   neighbours within a segment merge again.
// - When the provider runs out of memory, the free whole segments are returned and
//   the request is tried again; then an out-of-memory error names the sizes.
// - empty_cache() waits for the held blocks' events and returns every free whole
//   segment to the provider.
// Thread-safe (one mutex: ranks of the threads backend share a device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace dtensor::backend {

// A stream handle as the provider knows it (cudaStream_t, cast).
using StreamId = uintptr_t;

// Raw memory and events of one device.
class DeviceMemoryProvider {
 public:
  virtual ~DeviceMemoryProvider() = default;
  // Null when the device has no memory left (any other failure throws).
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  // An event recorded on `stream` now; query is true once the work queued on the
  // stream before it has completed. destroy releases it.
  virtual void* record_event(StreamId stream) = 0;
  virtual bool query_event(void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
  // Names the memory in error messages ("cuda:0").
  virtual std::string name() const = 0;
};

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0;  // in blocks handed out (rounded sizes)
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;  // in segments taken from the provider
  int64_t peak_reserved_bytes = 0;
  int64_t segments = 0;
  int64_t allocations = 0;           // allocate() calls
  int64_t provider_allocations = 0;  // segments taken (cache misses)
  int64_t provider_frees = 0;        // segments returned (empty_cache, out of memory)
  int64_t held_blocks = 0;           // freed, waiting for other streams' events
};

class CachingAllocator {
 public:
  static constexpr size_t kMinBlock = 512;               // rounding of every request
  static constexpr size_t kSmallSize = size_t{1} << 20;  // largest small-pool request
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kMinLargeAlloc = size_t{10} << 20;
  static constexpr size_t kLargeSegment = size_t{20} << 20;
  static constexpr size_t kRoundLarge = size_t{2} << 20;

  explicit CachingAllocator(std::unique_ptr<DeviceMemoryProvider> provider);
  ~CachingAllocator();  // returns every segment it still holds
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` for use on `stream` (512-byte aligned when the
  // provider's segments are). Zero bytes gives null. Throws std::runtime_error when
  // the provider cannot give the memory even after the cache is emptied.
  void* allocate(size_t bytes, StreamId stream);
  // Back to the pool of its stream (or held until other streams are done with it).
  // Throws std::invalid_argument for a pointer this allocator did not hand out.
  void free(void* ptr);
  // `ptr` (handed out, not yet freed) is used on `stream` too.
  void record_stream(void* ptr, StreamId stream);
  void empty_cache();
  CachingAllocatorStats stats() const;
  void reset_peaks();

  // The size a request is rounded to, and the segment a cache miss allocates for it.
  static size_t round_size(size_t bytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;
  struct Pending {
    void* event;
    Block* block;
  };

  Pool& pool_for(size_t rounded) { return rounded <= kSmallSize ? small_ : large_; }
  Pool& pool_of(const Block* block);
  Block* find_free(Pool& pool, size_t rounded, StreamId stream);
  Block* new_segment(size_t rounded, StreamId stream);  // null when out of memory
  Block* split(Block* block, size_t rounded);
  void release_to_pool(Block* block);  // merges with free neighbours
  void process_events();               // releases held blocks whose events completed
  void wait_for_events();
  void release_segments();  // free whole segments back to the provider

  std::unique_ptr<DeviceMemoryProvider> provider_;
  mutable std::mutex mutex_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> allocated_;
  std::vector<Pending> pending_;
  CachingAllocatorStats stats_;
};

}  // namespace dtensor::backend
