// Compiled instead of the MPI backend when the build has no MPI: init("mpi")
// says so and how to get it, instead of failing at link time.
#include <stdexcept>

#include "comm/mpi/mpi_backend.h"

namespace dtensor::comm {

bool mpi_compiled() { return false; }

bool started_by_mpi_launcher() { return false; }

std::shared_ptr<GroupImpl> mpi_world() {
  throw std::runtime_error(
      "[init] this build of dtensor has no MPI backend: install OpenMPI (e.g. libopenmpi-dev) and "
      "reconfigure with -DDTENSOR_WITH_MPI=ON");
}

}  // namespace dtensor::comm
