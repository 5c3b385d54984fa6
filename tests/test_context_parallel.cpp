// Attention with the sequence sharded over a context-parallel mesh dim, by the ring
// and by the all-gather variant (scaled_dot_product_attention's context-parallel
// path): outputs and gradients equal to attention on the whole sequence, causal or
// not, with even and uneven chunks, in the load-balanced order, alone and beside data
// parallelism; the communication each does; layouts it cannot take are errors.
#include <gtest/gtest.h>

#include "dtensor/dtensor.h"
#include "dtensor/parallel/context_parallel.h"
#include "test_helpers.h"

namespace dtensor {
namespace {

struct Case {
  int cp = 2;
  int dp = 1;
  int64_t seq = 8;
  bool causal = false;
  bool load_balanced = false;
  // Ring: parallel::ring_attention. Otherwise the op itself, in a scope naming it.
  ContextAttention attention = ContextAttention::Ring;
};

// t with its sequence dim (2) reordered: row i of the result is row positions[i] of t,
// or the inverse.
Tensor reorder(const Tensor& t, const std::vector<int64_t>& positions, bool inverse = false) {
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t to = inverse ? positions[i] : static_cast<int64_t>(i);
    const int64_t from = inverse ? static_cast<int64_t>(i) : positions[i];
    out.narrow(2, to, 1).copy_(t.narrow(2, from, 1));
  }
  return out;
}

// out and the gradients of sum(out * w) for q, k, v [2, 2, S, 4] on one rank.
struct Result {
  Tensor out, dq, dk, dv;
};

Result reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, bool causal) {
  Result r;
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    const DistTensor dq = distribute(q, mesh, {Replicate()}).set_requires_grad();
    const DistTensor dk = distribute(k, mesh, {Replicate()}).set_requires_grad();
    const DistTensor dv = distribute(v, mesh, {Replicate()}).set_requires_grad();
    const DistTensor out = scaled_dot_product_attention(dq, dk, dv, causal);
    sum(out * distribute(w, mesh, {Replicate()})).backward();
    r = {out.full_tensor(), dq.grad().full_tensor(), dk.grad().full_tensor(), dv.grad().full_tensor()};
  });
  return r;
}

void expect_ring_matches(const Case& c) {
  const Shape shape{2, 2, c.seq, 4};
  const Tensor q = Tensor::randn(shape, 1), k = Tensor::randn(shape, 2), v = Tensor::randn(shape, 3),
               w = Tensor::randn(shape, 4);
  const Result want = reference(q, k, v, w, c.causal);
  const std::string what = "cp=" + std::to_string(c.cp) + " dp=" + std::to_string(c.dp) +
                           " S=" + std::to_string(c.seq) + (c.causal ? " causal" : "") +
                           (c.load_balanced ? " load-balanced" : "") +
                           (c.attention == ContextAttention::AllGather ? " all-gather"
                            : c.attention == ContextAttention::Auto    ? " auto"
                                                                       : " ring");
  // The load-balanced run sees the sequence in its order and is compared back in order.
  std::vector<int64_t> order(static_cast<size_t>(c.seq));
  for (int64_t i = 0; i < c.seq; ++i) order[static_cast<size_t>(i)] = i;
  if (c.load_balanced) order = parallel::load_balanced_positions(c.seq, c.cp);
  const Tensor qo = reorder(q, order), ko = reorder(k, order), vo = reorder(v, order), wo = reorder(w, order);
  launch(c.cp * c.dp, [&](Group g) {
    DeviceMesh mesh(g, {c.dp, c.cp}, {"dp", "cp"});
    const Placements layout{Shard(0), Shard(2)};
    const DistTensor dq = distribute(qo, mesh, layout).set_requires_grad();
    const DistTensor dk = distribute(ko, mesh, layout).set_requires_grad();
    const DistTensor dv = distribute(vo, mesh, layout).set_requires_grad();
    DistTensor out;
    if (c.attention == ContextAttention::Ring) {
      out = parallel::ring_attention(dq, dk, dv, "cp", {.causal = c.causal, .load_balanced = c.load_balanced});
    } else {
      const ContextParallelScope scope({.load_balanced = c.load_balanced, .attention = c.attention});
      out = scaled_dot_product_attention(dq, dk, dv, c.causal);
    }
    EXPECT_EQ(out.placements(), layout) << what;
    sum(out * distribute(wo, mesh, layout)).backward();
    auto in_order = [&](const DistTensor& t) { return reorder(t.full_tensor(), order, /*inverse=*/true); };
    EXPECT_TRUE(allclose(in_order(out), want.out, 1e-5, 1e-6)) << what << " out";
    EXPECT_TRUE(allclose(in_order(dq.grad()), want.dq, 1e-4, 1e-5)) << what << " dq";
    EXPECT_TRUE(allclose(in_order(dk.grad()), want.dk, 1e-4, 1e-5)) << what << " dk";
    EXPECT_TRUE(allclose(in_order(dv.grad()), want.dv, 1e-4, 1e-5)) << what << " dv";
  });
}

TEST(ContextParallel, RingAttentionEqualsWholeSequenceAttention) {
  for (bool causal : {false, true}) {
    expect_ring_matches({.cp = 2, .seq = 8, .causal = causal});
    expect_ring_matches({.cp = 4, .seq = 8, .causal = causal});
    expect_ring_matches({.cp = 2, .seq = 7, .causal = causal});   // chunks of 4 and 3
    expect_ring_matches({.cp = 4, .seq = 10, .causal = causal});  // 3, 3, 2, 2
    expect_ring_matches({.cp = 2, .dp = 2, .seq = 6, .causal = causal});
  }
}

TEST(ContextParallel, LoadBalancedOrderGivesTheSameAttention) {
  EXPECT_EQ(parallel::load_balanced_positions(8, 2), (std::vector<int64_t>{0, 1, 6, 7, 2, 3, 4, 5}));
  expect_ring_matches({.cp = 2, .seq = 8, .causal = true, .load_balanced = true});
  expect_ring_matches({.cp = 4, .seq = 16, .causal = true, .load_balanced = true});
  expect_ring_matches({.cp = 2, .dp = 2, .seq = 12, .causal = true, .load_balanced = true});
  expect_ring_matches({.cp = 2, .seq = 8, .causal = false, .load_balanced = true});
  EXPECT_THROW_MSG(parallel::load_balanced_positions(10, 4), std::invalid_argument, "8 equal chunks");
}

TEST(ContextParallel, AllGatherVariantEqualsWholeSequenceAttention) {
  for (const ContextAttention a : {ContextAttention::AllGather, ContextAttention::Auto}) {
    for (bool causal : {false, true}) {
      expect_ring_matches({.cp = 2, .seq = 8, .causal = causal, .attention = a});
      expect_ring_matches({.cp = 4, .seq = 10, .causal = causal, .attention = a});  // 3, 3, 2, 2
      expect_ring_matches({.cp = 2, .dp = 2, .seq = 7, .causal = causal, .attention = a});
    }
    expect_ring_matches({.cp = 2, .seq = 8, .causal = true, .load_balanced = true, .attention = a});
    expect_ring_matches({.cp = 4, .seq = 16, .causal = true, .load_balanced = true, .attention = a});
    expect_ring_matches({.cp = 2, .dp = 2, .seq = 12, .causal = true, .load_balanced = true, .attention = a});
  }
}

// Without a scope: any model that shards the sequence gets context parallelism from
// the op (contiguous order), and one sharded over a 1-rank dim the fused kernel.
TEST(ContextParallel, AttentionOnAShardedSequenceIsContextParallel) {
  const Shape shape{1, 2, 8, 4};
  const Tensor q = Tensor::randn(shape, 1), k = Tensor::randn(shape, 2), v = Tensor::randn(shape, 3);
  const Result want = reference(q, k, v, Tensor::ones(shape), true);
  for (int ranks : {1, 2}) {
    launch(ranks, [&](Group g) {
      DeviceMesh mesh(g, {ranks}, {"seq"});
      const DistTensor dq = distribute(q, mesh, {Shard(2)}).set_requires_grad();
      const DistTensor dk = distribute(k, mesh, {Shard(2)}), dv = distribute(v, mesh, {Shard(2)});
      CommDebugMode comm;
      const DistTensor out = scaled_dot_product_attention(dq, dk, dv, true);
      EXPECT_EQ(out.placements(), (Placements{Shard(2)}));
      EXPECT_EQ(comm.total_count() > 0, ranks > 1) << comm.to_string();
      sum(out).backward();
      EXPECT_TRUE(allclose(out.full_tensor(), want.out, 1e-5, 1e-6)) << ranks;
      EXPECT_TRUE(allclose(dq.grad().full_tensor(), want.dq, 1e-4, 1e-5)) << ranks;
    });
  }
}

// The all-gather variant: K and V all-gathered in forward, again in backward, and
// dK, dV reduce-scattered; no sends.
TEST(ContextParallel, AllGatherVariantCommunicatesWhatItSays) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {4}, {"cp"});
    const Shape shape{2, 2, 8, 4};  // blocks [2, 2, 2, 4]: 128 bytes, whole 512
    const DistTensor q = distribute(Tensor::randn(shape, 1), mesh, {Shard(2)}).set_requires_grad();
    const DistTensor k = distribute(Tensor::randn(shape, 2), mesh, {Shard(2)}).set_requires_grad();
    const DistTensor v = distribute(Tensor::randn(shape, 3), mesh, {Shard(2)}).set_requires_grad();
    const ContextParallelScope scope({.attention = ContextAttention::AllGather});
    CommDebugMode forward;
    const DistTensor out = scaled_dot_product_attention(q, k, v, true);
    EXPECT_EQ(forward.count("all_gather"), 2) << forward.to_string();
    EXPECT_EQ(forward.total_count(), 2) << forward.to_string();
    const DistTensor loss = sum(out);
    CommDebugMode backward;
    loss.backward();
    EXPECT_EQ(backward.count("all_gather"), 2) << backward.to_string();
    EXPECT_EQ(backward.count("reduce_scatter"), 2) << backward.to_string();
    EXPECT_EQ(backward.total_count(), 4) << backward.to_string();
  });
}

// The cost model: a short sequence is all-gathered (one kernel call instead of P, the
// exchange too small to hide), a long causal one goes round the ring (its exchange
// hidden behind the blocks' compute). Both ranks choose alike, or the run would hang.
TEST(ContextParallel, CostModelAllGathersShortSequencesAndRingsLongOnes) {
  for (const int64_t seq : {8, 2048}) {
    launch(2, [&](Group g) {
      DeviceMesh mesh(g, {2}, {"cp"});
      const bool causal = seq > 8;
      const Shape shape{1, 1, seq, 16};
      const DistTensor q = distribute(Tensor::randn(shape, 1), mesh, {Shard(2)});
      CommDebugMode comm;
      (void)scaled_dot_product_attention(q, q, q, causal);
      EXPECT_EQ(comm.count("all_gather") > 0, seq == 8) << seq << " " << comm.to_string();
      EXPECT_EQ(comm.count("send") > 0, seq > 8) << seq << " " << comm.to_string();
    });
  }
}

TEST(ContextParallel, RingAttentionOnOneRankIsAttention) { expect_ring_matches({.cp = 1, .seq = 5, .causal = true}); }

// Forward: P - 1 passes of the K/V block; backward: P - 1 passes of K, V, dK, dV and
// the last pass of dK, dV home. Nothing else communicates.
TEST(ContextParallel, RingSendsTheBlocksItSays) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {4}, {"cp"});
    const Shape shape{2, 2, 8, 4};  // blocks [2, 2, 2, 4]: 128 bytes
    const DistTensor q = distribute(Tensor::randn(shape, 1), mesh, {Shard(2)}).set_requires_grad();
    const DistTensor k = distribute(Tensor::randn(shape, 2), mesh, {Shard(2)}).set_requires_grad();
    const DistTensor v = distribute(Tensor::randn(shape, 3), mesh, {Shard(2)}).set_requires_grad();
    CommDebugMode forward;
    const DistTensor out = parallel::ring_attention(q, k, v, "cp", true);
    EXPECT_EQ(forward.count("send"), 2 * 3);
    EXPECT_EQ(forward.bytes("send"), 2 * 3 * 128);
    EXPECT_EQ(forward.total_count(), 2 * 2 * 3) << forward.to_string();  // the sends and their receives
    const DistTensor loss = sum(out);
    CommDebugMode backward;
    loss.backward();
    // sum's backward is local; the ring's: 3 passes of 4 blocks and one of 2.
    EXPECT_EQ(backward.count("send"), 4 * 3 + 2) << backward.to_string();
  });
}

TEST(ContextParallel, LayoutsItCannotTakeAreErrors) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"cp"});
    const Tensor t = Tensor::randn({2, 8, 4}, 1);
    const DistTensor seq = distribute(t, mesh, {Shard(1)}), rep = distribute(t, mesh, {Replicate()});
    EXPECT_THROW_MSG(parallel::ring_attention(rep, rep, rep, "cp"), std::invalid_argument,
                     "q must be sharded on its sequence dim (Shard(1)) over the context-parallel mesh dim, got R");
    EXPECT_THROW_MSG(parallel::ring_attention(seq, rep, seq, "cp"), std::invalid_argument, "k must be laid out as q");
    EXPECT_THROW_MSG(parallel::ring_attention(seq, seq, seq, "sp"), std::invalid_argument, "sp");
  });
}

}  // namespace
}  // namespace dtensor
