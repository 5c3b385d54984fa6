// The escape hatches for new layouts: the local boundary with autograd (as_local,
// the DistTensor form of from_local), local_map against one rank, and from_local's
// run_check.
#include "dist_op_test_util.h"

namespace dtensor {
namespace {

using Pieces = std::vector<DistTensor>;

TEST(LocalBoundary, AsLocalAndFromLocalCarryGradients) {
  launch(3, [](Group world) {
    DeviceMesh mesh(world, {3});
    const Tensor xf = Tensor::randn({7, 2}, 1);  // rows 3, 3, 1
    DistTensor x = distribute(xf, mesh, {Shard(0)});
    x.set_requires_grad();
    const DistTensor piece = x.as_local();
    EXPECT_EQ(piece.mesh(), local_mesh());
    EXPECT_EQ(piece.shape(), x.to_local().shape());
    // Local work, lifted back: y = 3 x, so dy/dx = 3 on every element.
    const DistTensor y = DistTensor::from_local(mul(piece, 3.0), mesh, {Shard(0)}, xf.shape());
    EXPECT_TRUE(allclose(y.full_tensor(), mul(xf, 3.0), 1e-6, 1e-6));
    sum(y).backward();
    EXPECT_EQ(x.grad().placements(), Placements{Shard(0)});
    EXPECT_TRUE(allclose(x.grad().full_tensor(), Tensor::full({7, 2}, 3.0), 0, 0));
  });
}

TEST(LocalBoundary, GradPlacementsOfAReplicatedTensor) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    // Each rank takes its own loss of the same replicated values: as Replicate the
    // pieces' gradients are taken to be equal (PyTorch's default), as Partial(sum)
    // they add up.
    for (bool partial : {false, true}) {
      DistTensor x = distribute(Tensor::ones({4}), mesh, {Replicate()});
      x.set_requires_grad();
      const DistTensor piece = partial ? x.as_local(Placements{Partial()}) : x.as_local();
      sum(mul(piece, 1.0 + world.rank())).backward();  // rank r's loss: (r + 1) * sum(x)
      const DistTensor g = x.grad();
      EXPECT_EQ(g.placements(), Placements{partial ? Partial() : Replicate()});
      if (partial) EXPECT_TRUE(allclose(g.full_tensor(), Tensor::full({4}, 3.0), 0, 0));
      if (!partial) EXPECT_TRUE(allclose(g.to_local(), Tensor::full({4}, 1.0 + world.rank()), 0, 0));
    }
    EXPECT_THROW_MSG(DistTensor::from_local(distribute(Tensor::ones({2}), mesh, {Replicate()}), mesh, {Replicate()}),
                     std::invalid_argument, "[from_local] expected a piece on local_mesh() (a 1-rank mesh), got d0=2");
  });
}

// A row-wise normalisation dispatch has no rule for, on row shards; and a
// replicated input that each rank turns into its own block of a sharded output.
TEST(LocalMap, MatchesOneRankForwardAndBackward) {
  const Tensor xf = add(Tensor::rand({7, 3}, 1), 0.5);
  auto normalize_rows = [](const DistTensor& x) { return div(x, sum(x, {1}, true)); };
  // The one-rank reference, through the same ops.
  Tensor want, want_grad;
  launch(1, [&](Group one) {
    DeviceMesh m(one, {1});
    DistTensor x = distribute(xf, m, {Replicate()});
    x.set_requires_grad();
    const DistTensor y = normalize_rows(x);
    sum(mul(y, y)).backward();
    want = y.full_tensor();
    want_grad = x.grad().full_tensor();
  });
  launch(3, [&](Group world) {
    DeviceMesh mesh(world, {3});
    for (const Placements& arrives : {Placements{Shard(0)}, Placements{Shard(1)}, Placements{Replicate()}}) {
      DistTensor x = distribute(xf, mesh, arrives);
      x.set_requires_grad();
      const Pieces out = local_map([&](const Pieces& p) { return Pieces{normalize_rows(p[0])}; }, {{Shard(0)}},
                                   {{Shard(0)}}, {x});
      EXPECT_EQ(out[0].placements(), Placements{Shard(0)});
      EXPECT_TRUE(allclose(out[0].full_tensor(), want, 1e-6, 1e-6)) << placements_to_string(arrives);
      sum(mul(out[0], out[0])).backward();
      EXPECT_TRUE(allclose(x.grad().full_tensor(), want_grad, 1e-5, 1e-6)) << placements_to_string(arrives);
    }
    // Replicated in, each rank computes its own rows of 2 x: the input's gradient
    // is the sum of the ranks' contributions (2 everywhere), not one rank's.
    DistTensor r = distribute(xf, mesh, {Replicate()});
    r.set_requires_grad();
    const int64_t c = mesh.coordinate(0);
    const Range rows = chunk_range(7, 3, c);
    const Pieces doubled = local_map(
        [&](const Pieces& p) { return Pieces{mul(slice(p[0], 0, rows.offset, rows.end()), 2.0)}; }, {{Shard(0)}},
        {{Replicate()}}, {r}, {.out_shapes = {Shape{7, 3}}});
    EXPECT_TRUE(allclose(doubled[0].full_tensor(), mul(xf, 2.0), 0, 0));
    sum(doubled[0]).backward();
    EXPECT_EQ(r.grad().placements(), Placements{Partial()});
    EXPECT_TRUE(allclose(r.grad().full_tensor(), Tensor::full({7, 3}, 2.0), 0, 0));
  });
}

TEST(LocalMap, BadInput) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor x = distribute(Tensor::randn({4, 2}, 1), mesh, {Shard(0)});
    auto identity = [](const Pieces& p) { return p; };
    EXPECT_THROW_MSG(local_map(identity, {{Shard(0)}}, {{Replicate()}}, {x}, {.redistribute_inputs = false}),
                     std::invalid_argument, "[local_map] input 0 is S(0), in_placements says R (redistribute_inputs is off)");
    EXPECT_THROW_MSG(local_map(identity, {{Shard(0)}, {Shard(0)}}, {{Shard(0)}}, {x}), std::invalid_argument,
                     "[local_map] the function returned 1 outputs, out_placements has 2");
    EXPECT_THROW_MSG(local_map([&](const Pieces&) { return Pieces{x}; }, {{Shard(0)}}, {{Shard(0)}}, {x}),
                     std::invalid_argument, "output 0 must be a piece on local_mesh()");
    EXPECT_THROW_MSG(local_map(identity, {{Shard(0)}}, {}, {x}), std::invalid_argument,
                     "[local_map] expected one placement list per input (1), got 0");
  });
}

TEST(FromLocal, RunCheckVerifiesReplicateAndPartialPieces) {
  launch(4, [](Group world) {
    DeviceMesh mesh(world, {2, 2});
    const int64_t row = mesh.coordinate(0), col = mesh.coordinate(1);
    // Equal along mesh dim 1 (Replicate), different along dim 0 (Shard).
    const Tensor same = Tensor::full({2, 3}, static_cast<double>(row));
    EXPECT_NO_THROW(DistTensor::from_local(same, mesh, {Shard(0), Replicate()}, Shape{4, 3}, {.run_check = true}));
    // Partial pieces may differ in value, not in shape.
    const Tensor partial = Tensor::full({2, 3}, static_cast<double>(col));
    EXPECT_NO_THROW(DistTensor::from_local(partial, mesh, {Shard(0), Partial()}, Shape{4, 3}, {.run_check = true}));
    // Rank 3 holds other values where dim 1 says Replicate: every rank fails alike.
    const Tensor off = world.rank() == 3 ? Tensor::full({2, 3}, 9.0) : same;
    EXPECT_THROW_MSG(DistTensor::from_local(off, mesh, {Shard(0), Replicate()}, Shape{4, 3}, {.run_check = true}),
                     std::invalid_argument,
                     "[from_local] run_check: mesh ranks 2 and 3 differ only along mesh dim 1, which is Replicate");
    const Tensor shaped = world.rank() == 1 ? Tensor::zeros({1, 3}) : Tensor::zeros({2, 3});
    EXPECT_THROW_MSG(DistTensor::from_local(shaped, mesh, {Shard(0), Partial()}, std::nullopt, {.run_check = true}),
                     std::invalid_argument, "run_check: mesh ranks 0 and 1 differ along mesh dim 1 (P(sum))");
  });
}

}  // namespace
}  // namespace dtensor
