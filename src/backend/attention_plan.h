// Where each batch entry of an attention operand starts (internal): the leading dims
// of q [..., Sq, D], k, v, out and the gradients are one shared batch shape, each
// operand with its own strides; entry e is row-major over that shape, as the CPU
// kernel's entry_offsets. Host code builds the plan, the CUDA kernels
// (cuda/attention.cu) evaluate it per block; tested on the CPU (test_attention_kernel).
#pragma once

#include <cstdint>

#include "backend/scalar_ops.h"  // DT_HOST_DEVICE
#include "dtensor/tensor.h"

namespace dtensor::backend {

constexpr int kMaxAttentionBatchDims = 6;

// The batch shape: the dims before the last two.
struct AttentionBatch {
  int dims = 0;
  int64_t sizes[kMaxAttentionBatchDims] = {};
  int64_t entries = 1;
};

// One operand's strides along the batch dims and between rows (the last dim has unit
// stride).
struct AttentionRows {
  int64_t batch_strides[kMaxAttentionBatchDims] = {};
  int64_t row_stride = 0;
};

// Element offset of batch entry e of an operand: for shape [2, 3, S, D] and batch
// strides {s0, s1}, entry 4 is (1, 1) and starts at s0 + s1.
DT_HOST_DEVICE inline int64_t entry_offset(const AttentionBatch& batch, const AttentionRows& rows, int64_t e) {
  int64_t offset = 0;
  for (int d = batch.dims - 1; d >= 0; --d) {
    offset += (e % batch.sizes[d]) * rows.batch_strides[d];
    e /= batch.sizes[d];
  }
  return offset;
}

// False where t has more than kMaxAttentionBatchDims leading dims.
inline bool make_attention_batch(const Tensor& t, AttentionBatch& batch) {
  batch = AttentionBatch{};
  if (t.dim() - 2 > kMaxAttentionBatchDims) return false;
  batch.dims = static_cast<int>(t.dim() - 2);
  for (int d = 0; d < batch.dims; ++d) {
    batch.sizes[d] = t.size(d);
    batch.entries *= t.size(d);
  }
  return true;
}

inline AttentionRows attention_rows(const Tensor& t) {
  AttentionRows rows;
  for (int64_t d = 0; d + 2 < t.dim() && d < kMaxAttentionBatchDims; ++d) rows.batch_strides[d] = t.stride(d);
  rows.row_stride = t.stride(-2);
  return rows;
}

}  // namespace dtensor::backend
