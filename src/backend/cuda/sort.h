// CUDA argsort and bincount (internal): sort.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

// Bytes of scratch launch_argsort needs for `rows` rows of `n` (no device work).
size_t argsort_scratch_bytes(int64_t rows, int64_t n);
// out [rows, n] I64 = each row's indices in sort_key.h's order, stable; `in` is a
// contiguous [rows, n] of `dtype` F64 or I64. CUB's radix sort (stable) over the
// 64-bit keys with their flat positions, then, for several rows, a second stable
// pass keyed by the row, which groups the rows and keeps each row's order.
void launch_argsort(DType dtype, int64_t rows, int64_t n, bool descending, const void* in, int64_t* out, void* scratch,
                    size_t scratch_bytes, void* stream);

// counts [bins] I64 (zeroed) += 1 per id in [0, bins) of ids [n] (I64 or I32),
// by integer atomics: the totals do not depend on the order.
void launch_bincount(DType id_dtype, int64_t n, const void* ids, int64_t bins, int64_t* counts, void* stream);

}  // namespace dtensor::backend::cuda
