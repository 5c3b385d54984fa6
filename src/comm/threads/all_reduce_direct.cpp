// all_reduce for small buffers: one phase, every rank reads every peer's whole
// input and reduces it itself. n times more reading than the chunked algorithm,
// but a single barrier, which is what costs most below ~64 KiB.
#include <cstring>
#include <vector>

#include "comm/reduce.h"
#include "comm/threads/algorithms.h"

namespace dtensor::comm::threads {

void all_reduce_direct(ThreadsGroup& group) {
  const CallDesc& me = group.me();
  const int n = group.size();
  const size_t bytes = static_cast<size_t>(me.count) * dtype_size(me.dtype);
  // Sources in rank order on every rank, so every rank gets the same bits.
  std::vector<const void*> sources(n);
  bool any_in_place = false;
  for (int r = 0; r < n; ++r) {
    sources[r] = group.peer(r).in;
    any_in_place = any_in_place || group.peer(r).in == group.peer(r).out;
  }
  if (!any_in_place) {
    reduce_sources(me.dtype, me.op, me.out, sources.data(), n, me.count);
    return;
  }
  // Some rank reduces in place: its input is read by everyone, so results go to a
  // scratch buffer until all ranks have read (the same steps on every rank).
  thread_local std::vector<std::byte> scratch;
  scratch.resize(bytes);
  reduce_sources(me.dtype, me.op, scratch.data(), sources.data(), n, me.count);
  group.sync();
  if (bytes > 0) std::memcpy(me.out, scratch.data(), bytes);
}

}  // namespace dtensor::comm::threads
