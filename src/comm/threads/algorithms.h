// The threads backend's algorithms, one per file. Each runs on every rank of a call
// after the rendezvous has checked that the calls match; `group.me()` and
// `group.peer(r)` are the ranks' descriptors, `group.sync()` a barrier between
// phases. The caller adds the final barrier.
#pragma once

#include <cstdint>

#include "comm/threads/threads_group.h"

namespace dtensor::comm::threads {

void all_reduce_owner(ThreadsGroup& group);
void all_gather_direct(ThreadsGroup& group);
void reduce_scatter_direct(ThreadsGroup& group);
void all_to_all_direct(ThreadsGroup& group);
void all_to_all_blocks_direct(ThreadsGroup& group);
void broadcast_direct(ThreadsGroup& group);
void gather_direct(ThreadsGroup& group);
void scatter_direct(ThreadsGroup& group);

// Size of the L3 cache (sysfs, then sysconf; 32 MiB where neither says).
int64_t last_level_cache_bytes();

// Offsets of packed per-rank counts: offsets[r] = counts[0] + ... + counts[r-1].
std::vector<int64_t> prefix_offsets(const std::vector<int64_t>& counts);

}  // namespace dtensor::comm::threads
