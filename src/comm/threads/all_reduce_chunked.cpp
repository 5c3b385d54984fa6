// all_reduce for large buffers: reduce-scatter then all-gather, both done by
// reading peers' memory directly. Each byte of input is read once by its chunk's
// owner and each result chunk copied n-1 times, the shared-memory equivalent of
// ring all-reduce's 2(n-1)/n traffic, with two barriers instead of 2(n-1) steps.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/reduce.h"
#include "comm/threads/algorithms.h"

namespace dtensor::comm::threads {

void all_reduce_chunked(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  const int n = group.size();
  const int rank = group.rank();
  const int64_t esize = static_cast<int64_t>(dtype_size(me.dtype));
  // Chunks start on 64-byte boundaries so two ranks never write one cache line.
  const int64_t align = std::max<int64_t>(1, 64 / esize);
  const int64_t chunk = ((me.count + n - 1) / n + align - 1) / align * align;
  auto begin = [&](int r) { return std::min(me.count, r * chunk); };
  auto length = [&](int r) { return std::min(me.count, (r + 1) * chunk) - begin(r); };

  // Step 1 (reduce-scatter): reduce my chunk of every rank's input into my output.
  // Only I read chunk `rank` of any input, so writing it in place is safe.
  std::vector<const void*> sources(n);
  for (int r = 0; r < n; ++r) {
    sources[r] = static_cast<const std::byte*>(group.peer(r).in) + begin(rank) * esize;
  }
  auto* out = static_cast<std::byte*>(me.out);
  reduce_sources(me.dtype, me.op, out + begin(rank) * esize, sources.data(), n, length(rank));
  group.sync();

  // Step 2 (all-gather): copy every other chunk from its owner's output, starting
  // with my right neighbour so ranks do not all read the same owner at once.
  for (int k = 1; k < n; ++k) {
    const int owner = (rank + k) % n;
    const auto* src = static_cast<const std::byte*>(group.peer(owner).out);
    if (length(owner) > 0) {
      std::memcpy(out + begin(owner) * esize, src + begin(owner) * esize, length(owner) * esize);
    }
  }
}

}  // namespace dtensor::comm::threads
