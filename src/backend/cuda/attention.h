// Fused attention on CUDA (internal): attention.cu. The operands as the kernel table
// gets them (F32 or BF16 rows with unit stride along the last dim, the batch plan of
// attention_plan.h); lse and delta contiguous F32 [entries * queries].
#pragma once

#include <cstdint>

#include "backend/attention_plan.h"

namespace dtensor::backend::cuda {

// Whether the launches below take this shape on the current device, forward and
// backward: the tiled tensor-core kernels (BF16, head and value dims multiples of 16,
// compute capability 8.0, their tiles within the shared memory a block may opt in
// to), else the row kernels (rows within 48 KiB).
bool attention_fits(const AttentionShape& s);
// Whether the tiled kernels (attention_tiles.h) run this shape's forward, or its
// backward (the larger tiles of grad_q and grad_kv): each is chosen on its own.
bool attention_tiled(const AttentionShape& s, bool backward);

// out and lse of softmax(q k^T * scale [+ causal mask]) v.
void launch_attention(const AttentionShape& s, const AttentionRows& q_rows, const AttentionRows& k_rows,
                      const AttentionRows& v_rows, const AttentionRows& out_rows, const void* q, const void* k,
                      const void* v, void* out, float* lse, void* stream);

// grad_q (writing delta = rowsum(grad_out * out)), then grad_k and grad_v, by 64-row
// tiles or by rows as above; `delta` is scratch of entries * queries.
void launch_attention_backward(const AttentionShape& s, const AttentionGradRows& rows, const void* grad_out,
                               const void* q, const void* k, const void* v, const void* out, const float* lse,
                               float* delta, void* grad_q, void* grad_k, void* grad_v, void* stream);

}  // namespace dtensor::backend::cuda
