// The rooted collectives: broadcast, gather and scatter. Each is one copy per
// rank (or per peer on the root) between the root's buffer and the others'.
#include <cstring>

#include "comm/threads/algorithms.h"

namespace dtensor::comm::threads {

void broadcast_direct(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  if (group.rank() == me.root || me.count == 0) return;
  std::memcpy(me.out, group.peer(me.root).in, static_cast<size_t>(me.count) * dtype_size(me.dtype));
}

void gather_direct(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  if (group.rank() != me.root) return;
  const size_t esize = dtype_size(me.dtype);
  const std::vector<int64_t> offsets = prefix_offsets(me.counts);
  for (int r = 0; r < group.size(); ++r) {
    if (me.counts[r] == 0) continue;
    std::memcpy(static_cast<std::byte*>(me.out) + offsets[r] * esize, group.peer(r).in,
                static_cast<size_t>(me.counts[r]) * esize);
  }
}

void scatter_direct(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  const int rank = group.rank();
  const size_t esize = dtype_size(me.dtype);
  const std::vector<int64_t> offsets = prefix_offsets(me.counts);
  if (me.counts[rank] == 0) return;
  std::memcpy(me.out, static_cast<const std::byte*>(group.peer(me.root).in) + offsets[rank] * esize,
              static_cast<size_t>(me.counts[rank]) * esize);
}

}  // namespace dtensor::comm::threads
