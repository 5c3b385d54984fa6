// Attention with the sequence sharded over one mesh dim (internal): what the two
// context-parallel algorithms share, and their passes. ops/attention_context.cpp
// chooses between them and records the backward; ops/attention_ring.cpp and
// ops/attention_gather.cpp are the algorithms.
//
// The sequence lies in P blocks, block b on cp rank b. Contiguous order: block b is
// chunk b of P (chunk_range, uneven allowed). Load-balanced order: the sequence is cut
// into 2P equal chunks and block b holds chunks b and 2P - 1 - b, one after the other.
// A block is a list of segments, each one whole chunk; a pair of segments (queries,
// keys) attends fully when the keys' chunk comes first, with the causal mask when it
// is the same chunk, and not at all when it comes later (causal) .
#pragma once

#include <cstdint>
#include <vector>

#include "dtensor/group.h"
#include "dtensor/ops.h"

namespace dtensor::ops::context {

struct Segment {
  int64_t chunk = 0;
  int64_t offset = 0, rows = 0;  // within its block
};

enum class Mask { Full, Causal, None };

struct Layout {
  const Group* group = nullptr;  // the cp mesh dim's group
  int cp = 0;                    // its index in the mesh
  int ranks = 1, rank = 0;
  int64_t seq = 0;  // the global sequence length
  bool causal = false;
  bool load_balanced = false;

  int next() const { return (rank + 1) % ranks; }
  int prev() const { return (rank + ranks - 1) % ranks; }
  int block_at(int step) const { return (rank - step % ranks + ranks) % ranks; }  // the ring's block at `step`
  int64_t block_rows(int block) const;
  std::vector<Segment> segments(int block) const;
  int64_t chunks() const { return load_balanced ? 2 * ranks : ranks; }
  // Where chunk c starts in the natural order of the sequence, and where in the
  // order the ranks hold it (blocks one after the other).
  int64_t natural_start(int64_t chunk) const;
  int64_t held_start(int64_t chunk) const;
  int64_t chunk_rows(int64_t chunk) const;
  Mask mask(const Segment& queries, const Segment& keys) const {
    if (!causal || keys.chunk < queries.chunk) return Mask::Full;
    return keys.chunk == queries.chunk ? Mask::Causal : Mask::None;
  }
};

// rows [offset, offset + rows) of t's sequence dim (-2), a view.
Tensor rows_of(const Tensor& t, int64_t offset, int64_t rows);
inline Tensor rows_of(const Tensor& t, const Segment& s) { return rows_of(t, s.offset, s.rows); }

// Merges `part` into the running (out, lse) rows by the online-softmax rule (F32).
void merge(Tensor out_rows, Tensor lse_rows, const AttentionResult& part);
// dst += src (F32 accumulators).
void accumulate(Tensor dst, const Tensor& src);

// The running output (F32, zero) and log-sum-exp (-inf) for queries q and values v.
AttentionResult empty_result(const Tensor& q, const Tensor& v);

// Ring attention: P steps, the K/V blocks passed on while each is computed on;
// backward passes the blocks again with their dK/dV accumulators, which arrive home.
AttentionResult ring_forward(const Layout& layout, const Tensor& q, const Tensor& k, const Tensor& v);
AttentionGrads ring_backward(const Layout& layout, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const AttentionResult& result);

// The all-gather variant: K and V gathered whole (again in backward), per query
// segment one call over the keys before it and one causal call over its own chunk;
// dK and dV of the whole sequence reduce-scattered home.
AttentionResult gather_forward(const Layout& layout, const DistTensor& q, const DistTensor& k, const DistTensor& v);
AttentionGrads gather_backward(const Layout& layout, const Tensor& dout, const DistTensor& q, const DistTensor& k,
                               const DistTensor& v, const AttentionResult& result);

}  // namespace dtensor::ops::context

namespace dtensor::ops::context {

// The mesh dim that shards the sequence when q, k, v can take the context-parallel
// path (one sequence length and leading dims, one layout, no Partial, the head dim
// whole, the sequence sharded over exactly one mesh dim), or -1.
int sequence_mesh_dim(const DistTensor& q, const DistTensor& k, const DistTensor& v);

// Attention over the sequence sharded on mesh dim `cp`, by `algorithm` (Auto: the
// cost model's choice), differentiable; the output is laid out as q.
DistTensor attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, bool causal, int cp,
                     bool load_balanced, ContextAttention algorithm);

}  // namespace dtensor::ops::context
