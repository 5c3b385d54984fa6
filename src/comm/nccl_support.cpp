// The NCCL backend's GPU-free decisions (nccl_support.h).
#include "comm/nccl_support.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "util/check.h"

namespace dtensor::comm {

int nccl_device_for(int local_rank, int local_size, int device_count, bool one_process) {
  if (device_count <= 0) {
    throw std::runtime_error(
        "[init] the nccl backend needs a GPU per rank, and this machine has none visible "
        "(no CUDA driver or device, or CUDA_VISIBLE_DEVICES hides them): use the threads or mpi backend here");
  }
  DT_CHECK_ARG(local_rank >= 0 && local_rank < local_size, "init", "local rank ", local_rank, " outside [0, ",
               local_size, ")");
  if (!one_process) return local_rank % device_count;
  if (local_size > device_count) {
    throw std::runtime_error(detail::concat(
        "[init] the nccl backend needs a GPU per rank: ", local_size, " ranks on this host, ", device_count,
        device_count == 1 ? " GPU" : " GPUs",
        " (NCCL does not allow two ranks on one GPU; the threads backend runs several ranks on one GPU)"));
  }
  return local_rank;
}

std::optional<LocalRank> local_rank_from_env() {
  const std::pair<const char*, const char*> pairs[] = {
      {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},  // Open MPI
      {"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},                        // MPICH (Hydra)
      {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},                    // Slurm's srun
      {"LOCAL_RANK", "LOCAL_WORLD_SIZE"},                            // torchrun's convention
  };
  for (const auto& [rank_var, size_var] : pairs) {
    const char* rank = std::getenv(rank_var);
    const char* size = std::getenv(size_var);
    if (!rank || !size) continue;
    char* end_rank = nullptr;
    char* end_size = nullptr;
    const long r = std::strtol(rank, &end_rank, 10);
    const long s = std::strtol(size, &end_size, 10);  // "4(x2)" (Slurm's repeated form) reads 4
    if (end_rank == rank || *end_rank != '\0' || end_size == size || r < 0 || s < 1 || r >= s) continue;
    return LocalRank{static_cast<int>(r), static_cast<int>(s)};
  }
  return std::nullopt;
}

BlockRoute block_route(const std::vector<int64_t>& counts, int64_t outer) {
  const bool equal = std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
  if (!equal) return BlockRoute::PerRank;
  return outer == 1 ? BlockRoute::Direct : BlockRoute::Packed;
}

ReduceOp nccl_reduce_op(DType dtype, ReduceOp op) {
  if (dtype != DType::Bool) return op;
  return op == ReduceOp::Sum || op == ReduceOp::Max ? ReduceOp::Max : ReduceOp::Min;
}

}  // namespace dtensor::comm
