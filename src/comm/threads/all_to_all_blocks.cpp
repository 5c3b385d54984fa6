// all_to_all between strided pieces: every rank copies, from each peer's input, the
// piece that peer addressed to it straight into its own piece of the output, both
// read and written where they lie (no packing on either side).
#include "comm/block_all_to_all.h"
#include "comm/threads/algorithms.h"

namespace dtensor::comm::threads {

void all_to_all_blocks_direct(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  const int n = group.size();
  const int rank = group.rank();
  const size_t esize = dtype_size(me.dtype);
  auto* out = static_cast<std::byte*>(me.out);
  for (int k = 0; k < n; ++k) {
    const int sender = (rank + k) % n;
    const CallDesc& peer = group.peer(sender);
    copy_piece(out, *me.recv_blocks, sender, static_cast<const std::byte*>(peer.in), *peer.send_blocks,
               rank, esize);
  }
}

}  // namespace dtensor::comm::threads
