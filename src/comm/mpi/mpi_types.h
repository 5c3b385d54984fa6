// DType and ReduceOp to MPI: predefined datatypes and ops where MPI has them;
// for BF16/F16 a 2-byte type with user-defined ops that reduce in F32 (MPI has no
// half types, and converting to F32 around MPI would double the traffic).
#pragma once

#include <mpi.h>

#include "dtensor/dtype.h"
#include "dtensor/group.h"

namespace dtensor::comm {

MPI_Datatype mpi_datatype(DType dtype);
// The MPI op that implements `op` on `dtype` (Avg maps to sum; the caller divides).
MPI_Op mpi_op(DType dtype, ReduceOp op);

}  // namespace dtensor::comm
