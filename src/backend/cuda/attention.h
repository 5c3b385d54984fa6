// Fused attention on CUDA (internal): attention.cu. The operands as the kernel table
// gets them (F32 or BF16 rows with unit stride along the last dim, the batch plan of
// attention_plan.h); lse and delta contiguous F32 [entries * queries].
#pragma once

#include <cstdint>

#include "backend/attention_plan.h"

namespace dtensor::backend::cuda {

struct AttentionShape {
  AttentionBatch batch;
  int64_t queries = 0, keys = 0, head_dim = 0, value_dim = 0;
  float scale = 1;
  bool causal = false;
  bool bf16 = false;  // else F32
};

// The dynamic shared memory a launch of this shape needs; above what a block may use
// the caller reports it as unsupported.
size_t attention_shared_bytes(const AttentionShape& s);
constexpr size_t kAttentionMaxSharedBytes = 48 * 1024;

// out and lse of softmax(q k^T * scale [+ causal mask]) v; one block per query row.
void launch_attention(const AttentionShape& s, const AttentionRows& q_rows, const AttentionRows& k_rows,
                      const AttentionRows& v_rows, const AttentionRows& out_rows, const void* q, const void* k,
                      const void* v, void* out, float* lse, void* stream);

struct AttentionGradRows {
  AttentionRows grad_out, q, k, v, out, grad_q, grad_k, grad_v;
};

// grad_q (one block per query row, writing delta = rowsum(grad_out * out)), then
// grad_k and grad_v (one block per key row); `delta` is scratch of entries * queries.
void launch_attention_backward(const AttentionShape& s, const AttentionGradRows& rows, const void* grad_out,
                               const void* q, const void* k, const void* v, const void* out, const float* lse,
                               float* delta, void* grad_q, void* grad_k, void* grad_v, void* stream);

}  // namespace dtensor::backend::cuda
