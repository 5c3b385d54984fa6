// CUDA embedding lookup and its deterministic scatter-add backward (internal):
// embedding.cu. Without `masked` the ids have been checked on the host (each in
// [0, V)); with it, ids outside [0, V) give a zero row and no gradient.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

struct EmbeddingShape {
  int64_t ids = 0;              // N
  int64_t id_stride = 1;        // of the ids (I64 or I32)
  int64_t rows = 0, width = 0;  // V, D of the table
  int64_t table_row_stride = 0, table_col_stride = 0;
  bool masked = false;
};

// out [N, D] contiguous; the table's rows are copied as elements of `element_size`
// bytes (any dtype).
void launch_embedding(size_t element_size, DType id_dtype, const EmbeddingShape& shape, const void* table,
                      const void* ids, void* out, void* stream);

// Bytes of scratch launch_embedding_backward needs for `shape` (no device work).
size_t embedding_backward_scratch_bytes(const EmbeddingShape& shape);
// grad_table [V, D] (zeroed, strides in `shape`'s table strides) += the rows of
// grad_out [N, D] (strides grad_row_stride, grad_col_stride) grouped by id: the ids
// are sorted with their positions (CUB's stable radix sort), then each id's rows are
// summed in double in position order, as on the CPU; no atomics.
void launch_embedding_backward(DType dtype, DType id_dtype, const EmbeddingShape& shape, const void* grad_out,
                               int64_t grad_row_stride, int64_t grad_col_stride, const void* ids, void* grad_table,
                               void* scratch, size_t scratch_bytes, void* stream);

}  // namespace dtensor::backend::cuda
