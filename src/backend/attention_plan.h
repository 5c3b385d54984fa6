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

// What an attention kernel computes: softmax(q k^T * scale [+ causal mask]) v over
// `batch` entries, q [queries, head_dim], k [keys, head_dim], v [keys, value_dim].
struct AttentionShape {
  AttentionBatch batch;
  int64_t queries = 0, keys = 0, head_dim = 0, value_dim = 0;
  float scale = 1;
  bool causal = false;
  bool bf16 = false;  // else F32
};

// The operands of the backward, as AttentionRows each.
struct AttentionGradRows {
  AttentionRows grad_out, q, k, v, out, grad_q, grad_k, grad_v;
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

// The shape of softmax(q k^T * scale [+ causal mask]) v for the kernel table's
// operands; false (s unset) where q has more than kMaxAttentionBatchDims leading dims.
inline bool make_attention_shape(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                 AttentionShape& s) {
  s = AttentionShape{};
  if (!make_attention_batch(q, s.batch)) return false;
  s.queries = q.size(-2);
  s.keys = k.size(-2);
  s.head_dim = q.size(-1);
  s.value_dim = v.size(-1);
  s.scale = static_cast<float>(scale);
  s.causal = causal;
  s.bf16 = q.dtype() == DType::BF16;
  return true;
}

// t itself where its rows have unit stride (as the kernels read them), else a
// contiguous copy.
inline Tensor with_unit_stride_rows(const Tensor& t) {
  return t.stride(-1) == 1 || t.size(-1) == 1 ? t : t.contiguous();
}

inline AttentionRows attention_rows(const Tensor& t) {
  AttentionRows rows;
  for (int64_t d = 0; d + 2 < t.dim() && d < kMaxAttentionBatchDims; ++d) rows.batch_strides[d] = t.stride(d);
  rows.row_stride = t.stride(-2);
  return rows;
}

}  // namespace dtensor::backend
