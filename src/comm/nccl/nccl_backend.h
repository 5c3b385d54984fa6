// Entry points of the NCCL backend used by init() (internal). nccl_group.cpp defines
// them when the build has NCCL; nccl_stub.cpp otherwise (and nccl_world() throws).
#pragma once

#include <memory>

#include "comm/comm_backend.h"

namespace dtensor::comm {

bool nccl_compiled();
// The NCCL world of the calling rank, bootstrapped over `host` (the launch rank's
// threads world, or MPI's world): one GPU per rank, the communicator's unique id
// broadcast over `host`, which also carries every call on host memory (size exchanges,
// CPU tensors). The same host group gives the same NCCL world.
std::shared_ptr<GroupImpl> nccl_world(const std::shared_ptr<GroupImpl>& host);

}  // namespace dtensor::comm
