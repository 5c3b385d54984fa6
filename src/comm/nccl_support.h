// The NCCL backend's decisions that need no GPU (internal; compiled in every build and
// tested on the CPU): which GPU a rank takes, how a collective of dtensor's forms maps
// onto NCCL's (which has equal blocks only and no Bool), and the rank's place on its
// host under a launcher.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/dtype.h"
#include "dtensor/group.h"

namespace dtensor::comm {

// The GPU of the rank with `local_rank` among `local_size` ranks of one host, on a
// host with `device_count` visible GPUs. `one_process`: the ranks are threads of one
// process and all see the same GPUs, so each takes the GPU of its rank, and more ranks
// than GPUs is refused (NCCL does not allow two ranks on one GPU: the message names
// the threads backend, which does). Processes under a launcher, which may show each
// one only its own GPU, take their local rank's modulo the visible GPUs, and NCCL
// refuses a real sharing. std::runtime_error when no GPU is visible.
int nccl_device_for(int local_rank, int local_size, int device_count, bool one_process);

// This process's rank among the processes of its host and their number, from the
// launcher's environment (Open MPI, MPICH/Hydra, Slurm); nullopt when none says.
struct LocalRank {
  int rank = 0, size = 1;
};
std::optional<LocalRank> local_rank_from_env();

// How a row-block collective (comm_backend.h: `outer` rows, rank r owning counts[r]
// elements of each) runs on NCCL:
//   Direct  one ncclAllGather / ncclReduceScatter (equal counts, one row)
//   Packed  equal counts in several rows: the blocks are packed into (or unpacked
//           from) a contiguous buffer around the direct call
//   PerRank uneven counts: one ncclBroadcast (all_gather) or ncclReduce
//           (reduce_scatter) per rank, grouped, with packing when outer > 1
enum class BlockRoute : uint8_t { Direct, Packed, PerRank };
BlockRoute block_route(const std::vector<int64_t>& counts, int64_t outer);

// The reduction NCCL runs for (dtype, op): Bool travels as bytes, where sum and max
// are a logical or (max) and min and product a logical and (min). Avg stays Avg
// (ncclAvg, floating dtypes only, checked before).
ReduceOp nccl_reduce_op(DType dtype, ReduceOp op);

}  // namespace dtensor::comm
