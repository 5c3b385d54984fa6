// Context parallelism: attention with the sequence sharded over a mesh dim (ring
// attention, as Megatron-Core's context parallel and TorchTitan's do).
//
//   DeviceMesh mesh(world, {2, 4}, {"dp", "cp"});
//   // q, k, v [B, H, S, D], the batch on dp and the sequence on cp: {Shard(0), Shard(2)}
//   DistTensor out = parallel::ring_attention(q, k, v, "cp", /*causal=*/true);   // {Shard(0), Shard(2)}
//
// Each cp rank keeps its queries and passes its K/V block around the ring: at step s
// it computes attention of its queries against the block of rank r - s (a fused
// local kernel giving the block's output and log-sum-exp) while that block travels on
// to rank r + 1 and the next arrives from r - 1 (asynchronous send/recv, so the
// exchange overlaps the compute), and merges the partial results with
// the online-softmax rule (out = sum_s exp(lse_s - lse) out_s, lse = logsumexp_s
// lse_s). Nothing of size S x S and no full K/V is ever held: per rank one
// extra K/V block in flight. Backward runs the same ring: each block's dK/dV
// accumulators travel with it and arrive home after P steps, and dQ stays local; the
// local backward kernel is given the merged out and lse, which makes each block's
// share exact. Communication per attention call and rank: P - 1 K/V blocks sent in
// forward, P K/V blocks and P dK/dV blocks in backward (the K/V blocks travel again so
// that nothing of the forward's ring is kept).
//
// Causal masking is by global position: a chunk of keys earlier than the queries is
// attended whole, the same chunk with the causal mask, later chunks are skipped.
// With the sequence in contiguous chunks rank r then does r + 1 of P blocks of work.
// The load-balanced order (Megatron's and TorchTitan's) cuts the sequence into 2P
// chunks and gives rank r chunks r and 2P - 1 - r, so every rank does the same work:
// feed the sequence in the order load_balanced_positions gives (a permutation of the
// positions; position embeddings and targets follow it) and pass load_balanced.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/dist_tensor.h"
#include "dtensor/ops.h"

namespace dtensor::parallel {

// softmax(q k^T / sqrt(D) [+ causal mask]) v for q, k, v [..., S, D] (v [..., S, Dv])
// laid out alike: Shard(ndim - 2) (the sequence) on mesh dim `cp_dim`; on every other
// mesh dim Replicate or a Shard of a dim before the sequence (batch, heads). The
// output is laid out as q. Differentiable. Throws std::invalid_argument naming the
// input and its layout otherwise.
struct RingAttentionOptions {
  bool causal = false;
  // The sequence is in load_balanced_positions order (S a multiple of 2P).
  bool load_balanced = false;
};
DistTensor ring_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, const std::string& cp_dim,
                          RingAttentionOptions options);
DistTensor ring_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, const std::string& cp_dim,
                          bool causal = false);

// load_balanced_positions, sequence_positions, ContextParallelScope: ops.h.
using ::dtensor::load_balanced_positions;

// A global batch laid out for context parallelism: `global` (the same on every rank)
// with its sequence dim `seq_dim` put in the order `options` gives (the load-balanced
// order over the mesh dim's size, or as it is), distributed by `placements`, which
// shard `seq_dim` over options.mesh_dim. Inputs, targets and masks alike.
DistTensor distribute_sequence(const Tensor& global, const DeviceMesh& mesh, const Placements& placements,
                               const ContextParallelOptions& options, int64_t seq_dim = 1);

}  // namespace dtensor::parallel
