// The rules by which dispatch decides where a Partial is resolved, held to exact
// communication: a Partial passes through an op only when the op does not grow it
// (otherwise its input is reduced first, at the smaller size); a contraction that
// would leave a large output Partial is charged the bandwidth of its later
// reduction; one backward function moves a gradient once (MoveMemo).
#include "dist_op_test_util.h"
#include "dtensor/dispatch_trace.h"
#include "dtensor/optim.h"

namespace dtensor {
namespace {

// Megatron's MLP on 2 ranks, placed by hand, with the output gradient arriving
// Partial (as it does when the gradient comes from a row-parallel consumer):
// backward must all-reduce that [16, 4] gradient once, not gather the weight to
// keep the Partial and then reduce-scatter [16, 32] activations (what greedy
// dispatch did: 4 collectives and 3.8 KB per step instead of 1 and 256 B).
TEST(DispatchRules, MegatronMlpWithPartialGradientAllReducesOncePerStep) {
  const Tensor xf = Tensor::randn({16, 4}, 1), w1f = Tensor::randn({4, 32}, 2), w2f = Tensor::randn({32, 4}, 3);
  auto train = [&](const DeviceMesh& mesh, const Placements& p1, const Placements& p2, CommDebugMode* comm) {
    DistTensor x = distribute(xf, mesh, Placements(mesh.ndim(), Replicate()));
    DistTensor w1 = distribute(w1f, mesh, p1).set_requires_grad();
    DistTensor w2 = distribute(w2f, mesh, p2).set_requires_grad();
    AdamW optimizer({w1, w2}, {.lr = 1e-2});
    for (int step = 0; step < 5; ++step) {
      if (comm) comm->reset();
      DistTensor y = matmul(gelu(matmul(x, w1)), w2);
      y.backward(ones(y.shape(), mesh, Placements(mesh.ndim(), Partial())));
      if (comm) {
        EXPECT_EQ(comm->count("all_reduce"), 1) << comm->to_string();
        EXPECT_EQ(comm->total_count(), 1) << comm->to_string();
        EXPECT_EQ(comm->total_bytes(), 16 * 4 * 4) << comm->to_string();
      }
      optimizer.step();
      optimizer.zero_grad();
    }
    return std::make_pair(w1.full_tensor(), w2.full_tensor());
  };
  std::pair<Tensor, Tensor> reference;
  launch(1, [&](Group world) { reference = train(DeviceMesh(world, {1}), {Replicate()}, {Replicate()}, nullptr); });
  launch(2, [&](Group world) {
    CommDebugMode comm;
    const auto [w1, w2] = train(DeviceMesh(world, {2}, {"tp"}), {Shard(1)}, {Shard(0)}, &comm);
    EXPECT_TRUE(allclose(w1, reference.first, 1e-5, 1e-6));
    EXPECT_TRUE(allclose(w2, reference.second, 1e-5, 1e-6));
  });
}

TEST(DispatchRules, PartialIsReducedAtTheSmallestTensorItPassesThrough) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor small = testing::make_input(Tensor::randn({4, 8}, 1), mesh, {Partial()});
    const DistTensor widen = distribute(Tensor::randn({8, 32}, 2), mesh, {Replicate()});
    const DistTensor narrow = distribute(Tensor::randn({32, 8}, 3), mesh, {Replicate()});
    CommDebugMode comm;
    // [4, 8] -> [4, 32] would grow the Partial: its input is reduced first (one
    // reduce-scatter or all-reduce of the [4, 8] input).
    DistTensor grown = matmul(small, widen);
    EXPECT_FALSE(grown.placements()[0].is_partial());
    EXPECT_EQ(comm.total_count(), 1) << comm.to_string();
    EXPECT_EQ(comm.total_bytes(), 4 * 8 * 4) << comm.to_string();
    EXPECT_TRUE(allclose(grown.full_tensor(), matmul(small.full_tensor(), widen.full_tensor()), 1e-5, 1e-5));
    // [4, 32] P -> [4, 8]: no larger than its input, the Partial passes through.
    comm.reset();
    const DistTensor wide = testing::make_input(Tensor::randn({4, 32}, 4), mesh, {Partial()});
    DistTensor shrunk = matmul(wide, narrow);
    EXPECT_EQ(shrunk.placements(), Placements{Partial()});
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    // Broadcasting a Partial scalar: the scalar is reduced, not the [4, 8] result.
    comm.reset();
    const DistTensor scalar = testing::make_input(Tensor::randn({}, 5), mesh, {Partial()});
    DistTensor expanded = expand(unsqueeze(unsqueeze(scalar, 0), 0), {4, 8});
    EXPECT_EQ(expanded.placements(), Placements{Replicate()});
    EXPECT_EQ(comm.bytes("all_reduce"), 4) << comm.to_string();
    EXPECT_TRUE(allclose(expanded.full_tensor(), scalar.full_tensor().expand({4, 8}), 1e-6, 1e-6));
    // Same-size pass-through is free: P + P, P * R, -P stay Partial.
    comm.reset();
    DistTensor same = neg(mul(add(small, small), distribute(Tensor::randn({8}, 6), mesh, {Replicate()})));
    EXPECT_EQ(same.placements(), Placements{Partial()});
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
  });
}

// x [512, 64] @ w [64, 512] with w sharded on the contracted dim: keeping w in place
// leaves a [512, 512] output Partial (1 MiB to reduce later); moving w costs an
// all-to-all of 128 KiB and gives a column-sharded output.
TEST(DispatchRules, ContractionMovesTheSmallOperandRatherThanLeaveALargeOutputPartial) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    const Tensor xf = Tensor::randn({512, 64}, 1), wf = Tensor::randn({64, 512}, 2);
    const DistTensor x = distribute(xf, mesh, {Replicate()});
    const DistTensor w = distribute(wf, mesh, {Shard(0)});
    DispatchTrace trace;
    CommDebugMode comm;
    const DistTensor y = matmul(x, w);
    EXPECT_EQ(y.placements(), Placements{Shard(1)}) << trace.to_string();
    EXPECT_EQ(comm.count("all_to_all"), 1) << comm.to_string();
    EXPECT_EQ(comm.total_count(), 1) << comm.to_string();
    EXPECT_TRUE(allclose(y.full_tensor(), matmul(xf, wf), 1e-4, 1e-4));
    // The reverse proportions keep the Partial: [64, 512] @ [512, 64] with the
    // contracted dim sharded on both sides leaves only [64, 64] to reduce.
    comm.reset();
    const DistTensor a = distribute(wf, mesh, {Shard(1)}), b = distribute(xf, mesh, {Shard(0)});
    EXPECT_EQ(matmul(a, b).placements(), Placements{Partial()});
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
  });
}

// The trace names what a Partial output defers.
TEST(DispatchRules, TraceShowsTheDeferredReduction) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor h = distribute(Tensor::randn({16, 32}, 1), mesh, {Shard(1)});
    const DistTensor w = distribute(Tensor::randn({32, 4}, 2), mesh, {Shard(0)});
    DispatchTrace trace;
    EXPECT_EQ(matmul(h, w).placements(), Placements{Partial()});
    EXPECT_NE(trace.to_string().find("to resolve the Partial output"), std::string::npos) << trace.to_string();
  });
}

}  // namespace
}  // namespace dtensor
