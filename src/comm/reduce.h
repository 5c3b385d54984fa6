// Elementwise reduction of several buffers into one, shared by every backend (the
// threads algorithms call it on peers' buffers; the MPI backend wraps it in
// user-defined MPI ops for BF16/F16). BF16/F16 accumulate in F32 and round once.
#pragma once

#include <cstdint>

#include "dtensor/dtype.h"
#include "dtensor/group.h"

namespace dtensor::comm {

// Throws std::invalid_argument naming `op_name` when `op` makes no sense for
// `dtype` (Avg on integers or Bool).
void check_reduce_supported(DType dtype, ReduceOp op, const char* op_name);

// dst[i] = op(srcs[0][i], ..., srcs[n-1][i]) for i < count, always summing in
// source order so every rank computing the same element gets the same bits.
// dst may be one of the sources (each element is read before it is written).
// Avg divides the sum by `n`.
void reduce_sources(DType dtype, ReduceOp op, void* dst, const void* const* srcs, int n,
                    int64_t count);

// The same result stored to each of `ndst` destinations (one pass over the
// sources). A destination may be one of the sources. `stream`: non-temporal
// stores, for results that do not fit in the last-level cache anyway.
void reduce_sources(DType dtype, ReduceOp op, void* const* dsts, int ndst,
                    const void* const* srcs, int n, int64_t count, bool stream);

// data[i] /= divisor (floating dtypes only): the Avg step of backends that sum.
void divide_by(DType dtype, void* data, int64_t count, int64_t divisor);

}  // namespace dtensor::comm
