// all_reduce by chunk owners: rank r reduces chunk r of every rank's input and
// stores the result straight into chunk r of every rank's output. One phase and
// the least traffic a shared-memory all-reduce can have: each rank reads 1/n of
// every input and writes 1/n of every output (2 x bytes in all, whatever n),
// where reduce-scatter + all-gather reads 1/n more and needs a second barrier.
// In place is safe: only rank r reads chunk r of any input, and it reads a block
// of every source before it stores that block anywhere.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "comm/reduce.h"
#include "comm/threads/algorithms.h"

namespace dtensor::comm::threads {

int64_t last_level_cache_bytes() {
  static const int64_t bytes = [] {
    // sysfs first: in virtual machines sysconf may report the host's whole L3.
    int64_t kib = 0;
    if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
      long long v = 0;
      if (std::fscanf(f, "%lldK", &v) == 1) kib = v;
      std::fclose(f);
    }
    if (kib > 0) return kib << 10;
#ifdef _SC_LEVEL3_CACHE_SIZE
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) return static_cast<int64_t>(l3);
#endif
    return int64_t{32} << 20;
  }();
  return bytes;
}

void all_reduce_owner(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  const int n = group.size();
  const int64_t esize = static_cast<int64_t>(dtype_size(me.dtype));
  // Chunk boundaries are multiples of 64 bytes from the buffer start, so two ranks
  // never write one cache line of a 64-byte aligned buffer (as the allocator gives).
  const int64_t align = std::max<int64_t>(1, 64 / esize);
  const int64_t chunk = ((me.count + n - 1) / n + align - 1) / align * align;
  const int64_t begin = std::min(me.count, group.rank() * chunk);
  const int64_t length = std::min(me.count, begin + chunk) - begin;
  if (length <= 0) return;

  std::vector<const void*> sources(n);
  std::vector<void*> outputs(n);
  for (int r = 0; r < n; ++r) {
    sources[r] = static_cast<const std::byte*>(group.peer(r).in) + begin * esize;
    outputs[r] = static_cast<std::byte*>(group.peer(r).out) + begin * esize;
  }
  // When the results of all ranks alone fill the last-level cache (the inputs are
  // as large again), they go to memory with streaming stores: no read of the lines
  // they overwrite, no eviction of the inputs still to be read.
  const bool stream = n * me.count * esize > last_level_cache_bytes();
  reduce_sources(me.dtype, me.op, outputs.data(), n, sources.data(), n, length, stream);
}

}  // namespace dtensor::comm::threads
