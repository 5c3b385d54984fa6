// reduce_scatter: rank r reduces block r of every row of every peer's input
// straight into its output. Each input byte is read by exactly one rank.
#include <vector>

#include "comm/reduce.h"
#include "comm/threads/algorithms.h"

namespace dtensor::comm::threads {

void reduce_scatter_direct(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  const int n = group.size();
  const int rank = group.rank();
  const int64_t esize = static_cast<int64_t>(dtype_size(me.dtype));
  const std::vector<int64_t> offsets = prefix_offsets(me.counts);
  const int64_t row = offsets[n];
  const int64_t mine = me.counts[rank];
  std::vector<const void*> sources(n);
  for (int64_t o = 0; o < me.outer && mine > 0; ++o) {
    for (int r = 0; r < n; ++r) {
      sources[r] = static_cast<const std::byte*>(group.peer(r).in) + (o * row + offsets[rank]) * esize;
    }
    reduce_sources(me.dtype, me.op, static_cast<std::byte*>(me.out) + o * mine * esize,
                   sources.data(), n, mine);
  }
}

}  // namespace dtensor::comm::threads
