// Ring attention over a context-parallel mesh dim: outputs and gradients equal to
// attention on the whole sequence, causal or not, with even and uneven chunks, alone
// and beside data parallelism; layouts it cannot take are errors.
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
};

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
                           " S=" + std::to_string(c.seq) + (c.causal ? " causal" : "");
  launch(c.cp * c.dp, [&](Group g) {
    DeviceMesh mesh(g, {c.dp, c.cp}, {"dp", "cp"});
    const Placements layout{Shard(0), Shard(2)};
    const DistTensor dq = distribute(q, mesh, layout).set_requires_grad();
    const DistTensor dk = distribute(k, mesh, layout).set_requires_grad();
    const DistTensor dv = distribute(v, mesh, layout).set_requires_grad();
    const DistTensor out = parallel::ring_attention(dq, dk, dv, "cp", c.causal);
    EXPECT_EQ(out.placements(), layout) << what;
    sum(out * distribute(w, mesh, layout)).backward();
    EXPECT_TRUE(allclose(out.full_tensor(), want.out, 1e-5, 1e-6)) << what << " out";
    EXPECT_TRUE(allclose(dq.grad().full_tensor(), want.dq, 1e-4, 1e-5)) << what << " dq";
    EXPECT_TRUE(allclose(dk.grad().full_tensor(), want.dk, 1e-4, 1e-5)) << what << " dk";
    EXPECT_TRUE(allclose(dv.grad().full_tensor(), want.dv, 1e-4, 1e-5)) << what << " dv";
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
