// MPI datatypes and reduction ops for every DType (see mpi_types.h).
#include "comm/mpi/mpi_types.h"

#include <mutex>

#include "comm/reduce.h"

namespace dtensor::comm {
namespace {

// inout[i] = in[i] op inout[i], computed by the same kernel as the threads backend.
template <DType kType, ReduceOp kOp>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* sources[2] = {in, inout};
  reduce_sources(kType, kOp, inout, sources, 2, *len);
}

struct HalfTypes {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op ops[2][4] = {};  // [bf16, f16][sum, product, max, min]
};

const HalfTypes& half_types() {
  static HalfTypes types;
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Type_contiguous(2, MPI_BYTE, &types.type);
    MPI_Type_commit(&types.type);
    MPI_Op_create(&half_op<DType::BF16, ReduceOp::Sum>, 1, &types.ops[0][0]);
    MPI_Op_create(&half_op<DType::BF16, ReduceOp::Product>, 1, &types.ops[0][1]);
    MPI_Op_create(&half_op<DType::BF16, ReduceOp::Max>, 1, &types.ops[0][2]);
    MPI_Op_create(&half_op<DType::BF16, ReduceOp::Min>, 1, &types.ops[0][3]);
    MPI_Op_create(&half_op<DType::F16, ReduceOp::Sum>, 1, &types.ops[1][0]);
    MPI_Op_create(&half_op<DType::F16, ReduceOp::Product>, 1, &types.ops[1][1]);
    MPI_Op_create(&half_op<DType::F16, ReduceOp::Max>, 1, &types.ops[1][2]);
    MPI_Op_create(&half_op<DType::F16, ReduceOp::Min>, 1, &types.ops[1][3]);
  });
  return types;
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return 0;
    case ReduceOp::Product: return 1;
    case ReduceOp::Max: return 2;
    case ReduceOp::Min: return 3;
  }
  return 0;
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I64: return MPI_INT64_T;
    case DType::I32: return MPI_INT32_T;
    case DType::Bool: return MPI_UINT8_T;  // 0/1 bytes; logical ops keep them 0/1
    case DType::BF16:
    case DType::F16: return half_types().type;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  if (dtype == DType::BF16 || dtype == DType::F16) {
    return half_types().ops[dtype == DType::BF16 ? 0 : 1][op_index(op)];
  }
  if (dtype == DType::Bool) {
    return op == ReduceOp::Sum || op == ReduceOp::Max ? MPI_LOR : MPI_LAND;
  }
  static const MPI_Op ops[4] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
  return ops[op_index(op)];
}

}  // namespace dtensor::comm
