// Compiled instead of the NCCL backend when the build has no NCCL: init("nccl") says
// so and how to get it, instead of failing at link time.
#include <stdexcept>

#include "comm/nccl/nccl_backend.h"

namespace dtensor::comm {

bool nccl_compiled() { return false; }

std::shared_ptr<GroupImpl> nccl_world(const std::shared_ptr<GroupImpl>&) {
  throw std::runtime_error(
      "[init] this build of dtensor has no NCCL backend: it needs the CUDA toolkit with NCCL (libnccl-dev, or "
      "NCCL in the toolkit) and -DDTENSOR_WITH_CUDA=ON -DDTENSOR_WITH_NCCL=ON");
}

}  // namespace dtensor::comm
