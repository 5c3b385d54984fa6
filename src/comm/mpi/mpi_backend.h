// Entry points of the MPI backend used by init(). mpi_group.cpp defines them when
// the build has MPI; mpi_stub.cpp otherwise (and then mpi_world() throws).
#pragma once

#include <memory>

#include "comm/comm_backend.h"

namespace dtensor::comm {

bool mpi_compiled();
// True when this process was started by mpirun/srun (their environment variables).
bool started_by_mpi_launcher();
// MPI_COMM_WORLD as a group; initialises MPI on first use.
std::shared_ptr<GroupImpl> mpi_world();

}  // namespace dtensor::comm
