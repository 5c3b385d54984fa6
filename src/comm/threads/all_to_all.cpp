// all_to_all: every rank copies, from each peer's input, the block that peer
// addressed to it (the pairwise sizes were checked to agree before this runs).
#include <cstring>

#include "comm/threads/algorithms.h"

namespace dtensor::comm::threads {

void all_to_all_direct(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  const int n = group.size();
  const int rank = group.rank();
  const size_t esize = dtype_size(me.dtype);
  const std::vector<int64_t> recv_offsets = prefix_offsets(me.recv_counts);
  auto* out = static_cast<std::byte*>(me.out);
  for (int k = 0; k < n; ++k) {
    const int sender = (rank + k) % n;
    const CallDesc& peer = group.peer(sender);
    const std::vector<int64_t> send_offsets = prefix_offsets(peer.counts);
    const size_t bytes = static_cast<size_t>(me.recv_counts[sender]) * esize;
    if (bytes == 0) continue;
    std::memcpy(out + recv_offsets[sender] * esize,
                static_cast<const std::byte*>(peer.in) + send_offsets[rank] * esize, bytes);
  }
}

}  // namespace dtensor::comm::threads
