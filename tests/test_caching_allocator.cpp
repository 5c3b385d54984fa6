// The CUDA backend's caching allocator policy (backend/caching_allocator.h), run on
// the CPU over host memory: the provider hands out aligned host blocks up to a
// capacity and models streams as queues of work whose completion the test advances,
// so that events complete exactly when the work queued before them has run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "backend/caching_allocator.h"

using dtensor::backend::CachingAllocator;
using dtensor::backend::DeviceMemoryProvider;
using dtensor::backend::StreamId;

namespace {

struct HostDevice {
  size_t capacity = size_t{1} << 30;
  size_t in_use = 0;
  std::map<void*, size_t> blocks;
  int allocations = 0, frees = 0;
  // Per stream: work items submitted and completed.
  std::map<StreamId, int64_t> submitted, completed;
  int live_events = 0;

  void submit(StreamId s) { ++submitted[s]; }
  void complete_all(StreamId s) { completed[s] = submitted[s]; }
};

struct HostEvent {
  StreamId stream;
  int64_t mark;
};

class HostProvider final : public DeviceMemoryProvider {
 public:
  explicit HostProvider(HostDevice& d) : d_(d) {}
  void* allocate(size_t bytes) override {
    if (d_.in_use + bytes > d_.capacity) return nullptr;
    void* p = std::aligned_alloc(512, bytes);
    if (!p) return nullptr;
    d_.in_use += bytes;
    d_.blocks[p] = bytes;
    ++d_.allocations;
    return p;
  }
  void free(void* ptr) override {
    auto it = d_.blocks.find(ptr);
    ASSERT_NE(it, d_.blocks.end());
    d_.in_use -= it->second;
    d_.blocks.erase(it);
    ++d_.frees;
    std::free(ptr);
  }
  void* record_event(StreamId s) override {
    ++d_.live_events;
    return new HostEvent{s, d_.submitted[s]};
  }
  bool query_event(void* e) override {
    auto* ev = static_cast<HostEvent*>(e);
    return d_.completed[ev->stream] >= ev->mark;
  }
  void synchronize_event(void* e) override {
    auto* ev = static_cast<HostEvent*>(e);
    d_.completed[ev->stream] = std::max(d_.completed[ev->stream], ev->mark);
  }
  void destroy_event(void* e) override {
    --d_.live_events;
    delete static_cast<HostEvent*>(e);
  }
  std::string name() const override { return "host"; }

 private:
  HostDevice& d_;
};

constexpr StreamId kS1 = 1, kS2 = 2;
constexpr size_t MiB = size_t{1} << 20;

std::unique_ptr<CachingAllocator> make(HostDevice& d) {
  return std::make_unique<CachingAllocator>(std::make_unique<HostProvider>(d));
}

}  // namespace

TEST(CachingAllocator, RoundsAndSizesSegmentsLikePyTorch) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(512), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(11 * MiB), 12 * MiB);
}

TEST(CachingAllocator, SmallRequestsShareOneSegmentAndAreReused) {
  HostDevice d;
  auto a = make(d);
  std::vector<void*> ptrs;
  for (int i = 0; i < 100; ++i) ptrs.push_back(a->allocate(1000, kS1));  // 1024 each
  EXPECT_EQ(d.allocations, 1);                                           // one 2 MiB segment holds them all
  std::set<void*> distinct(ptrs.begin(), ptrs.end());
  EXPECT_EQ(distinct.size(), ptrs.size());
  for (void* p : ptrs) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
  // The blocks do not overlap: write each one's index into all of it and read back.
  for (size_t i = 0; i < ptrs.size(); ++i) std::memset(ptrs[i], static_cast<int>(i), 1000);
  for (size_t i = 0; i < ptrs.size(); ++i) EXPECT_EQ(static_cast<unsigned char*>(ptrs[i])[999], i);
  EXPECT_EQ(a->stats().allocated_bytes, 100 * 1024);
  EXPECT_EQ(a->stats().reserved_bytes, static_cast<int64_t>(2 * MiB));
  for (void* p : ptrs) a->free(p);
  EXPECT_EQ(a->stats().allocated_bytes, 0);
  // Everything merged back into the one segment: a 1 MiB request fits without a miss.
  void* big = a->allocate(MiB, kS1);
  EXPECT_EQ(d.allocations, 1);
  a->free(big);
  EXPECT_EQ(a->stats().peak_allocated_bytes, static_cast<int64_t>(MiB));
}

TEST(CachingAllocator, FreedBlocksAreReusedOnTheirStreamOnly) {
  HostDevice d;
  auto a = make(d);
  void* p = a->allocate(4 * MiB, kS1);
  a->free(p);
  // Another stream must not get it: its work is not ordered after stream 1's.
  void* q = a->allocate(4 * MiB, kS2);
  EXPECT_NE(q, p);
  EXPECT_EQ(d.allocations, 2);
  // The same stream gets it back without a new segment.
  void* r = a->allocate(4 * MiB, kS1);
  EXPECT_EQ(r, p);
  EXPECT_EQ(d.allocations, 2);
  a->free(q);
  a->free(r);
}

TEST(CachingAllocator, LargeSegmentsSplitAndMergeBestFit) {
  HostDevice d;
  auto a = make(d);
  void* x = a->allocate(3 * MiB, kS1);  // a 20 MiB segment, 17 MiB left in the pool
  void* y = a->allocate(5 * MiB, kS1);  // carved from the rest
  EXPECT_EQ(d.allocations, 1);
  EXPECT_EQ(static_cast<char*>(y), static_cast<char*>(x) + 3 * MiB);
  a->free(x);
  // A 2 MiB request takes the best fit: the freed 3 MiB block, not the 12 MiB tail.
  void* z = a->allocate(2 * MiB, kS1);
  EXPECT_EQ(z, x);
  a->free(z);
  a->free(y);
  // All merged: the whole 20 MiB is one block again, and empty_cache returns it.
  void* whole = a->allocate(20 * MiB, kS1);
  EXPECT_EQ(whole, x);
  EXPECT_EQ(d.allocations, 1);
  a->free(whole);
  a->empty_cache();
  EXPECT_EQ(d.frees, 1);
  EXPECT_EQ(d.in_use, 0u);
  EXPECT_EQ(a->stats().reserved_bytes, 0);
  EXPECT_EQ(a->stats().peak_reserved_bytes, static_cast<int64_t>(20 * MiB));
}

TEST(CachingAllocator, BlocksUsedOnOtherStreamsWaitForTheirEvents) {
  HostDevice d;
  auto a = make(d);
  void* p = a->allocate(4 * MiB, kS1);
  a->record_stream(p, kS2);
  d.submit(kS2);  // stream 2 reads p
  a->free(p);
  EXPECT_EQ(a->stats().held_blocks, 1);
  // Stream 2 has not run yet: stream 1 must not get p back.
  void* q = a->allocate(4 * MiB, kS1);
  EXPECT_NE(q, p);
  d.complete_all(kS2);
  void* r = a->allocate(4 * MiB, kS1);
  EXPECT_EQ(r, p);
  EXPECT_EQ(a->stats().held_blocks, 0);
  EXPECT_EQ(d.live_events, 0);
  a->free(q);
  a->free(r);
}

TEST(CachingAllocator, EmptyCacheWaitsForHeldBlocks) {
  HostDevice d;
  auto a = make(d);
  void* p = a->allocate(12 * MiB, kS1);
  a->record_stream(p, kS2);
  d.submit(kS2);
  a->free(p);
  a->empty_cache();
  EXPECT_EQ(d.in_use, 0u);
  EXPECT_EQ(d.live_events, 0);
  EXPECT_EQ(a->stats().segments, 0);
}

TEST(CachingAllocator, OutOfMemoryReturnsTheCacheThenFailsClearly) {
  HostDevice d;
  d.capacity = 40 * MiB;
  auto a = make(d);
  void* p = a->allocate(30 * MiB, kS1);
  a->free(p);  // cached on stream 1
  // Stream 2 cannot reuse it, and 30 + 30 > 40: the cache is returned, then it fits.
  void* q = a->allocate(30 * MiB, kS2);
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(d.frees, 1);
  try {
    a->allocate(30 * MiB, kS1);
    FAIL() << "expected out of memory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[host allocate] out of memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("31457280 bytes allocated"), std::string::npos) << e.what();
  }
  a->free(q);
  EXPECT_THROW(a->free(q), std::invalid_argument);
  EXPECT_THROW(a->record_stream(q, kS2), std::invalid_argument);
}

TEST(CachingAllocator, SegmentsInUseStayWhenTheCacheIsEmptied) {
  HostDevice d;
  auto a = make(d);
  void* small = a->allocate(100, kS1);
  void* other = a->allocate(100, kS1);
  a->free(other);
  a->empty_cache();  // the small segment is still partly in use
  EXPECT_EQ(d.frees, 0);
  EXPECT_EQ(a->stats().allocated_bytes, 512);
  a->free(small);
  a->empty_cache();
  EXPECT_EQ(d.frees, 1);
}

TEST(CachingAllocator, ThreadsOnTheirOwnStreamsShareOneAllocator) {
  HostDevice d;
  d.capacity = size_t{8} << 30;
  auto a = make(d);
  std::vector<std::thread> threads;
  for (StreamId s = 1; s <= 4; ++s) {
    threads.emplace_back([&, s] {
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = (static_cast<size_t>(i) * 7919 % 64 + 1) * 4096 * (i % 5 == 0 ? 300 : 1);
        void* p = a->allocate(bytes, s);
        static_cast<char*>(p)[bytes - 1] = 1;
        a->free(p);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(a->stats().allocated_bytes, 0);
  EXPECT_EQ(a->stats().allocations, 8000);
  EXPECT_LT(a->stats().provider_allocations, 100);  // the cache served nearly all of them
  a->empty_cache();
  EXPECT_EQ(d.in_use, 0u);
}
