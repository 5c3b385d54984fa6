// Shape ops on DistTensors: conformance (every input layout on meshes 2, 3 and 2x2
// against one rank, forward and gradients; one-rank backward against finite
// differences), sharding kept without communication where the dims map cleanly,
// redistribution where they do not, and bad-input errors.
#include <gtest/gtest.h>

#include "dist_op_test_util.h"

namespace dtensor::testing {
namespace {

using Inputs = std::vector<DistTensor>;
using Locals = std::vector<Tensor>;

Tensor input(const Shape& shape, uint64_t seed) { return Tensor::randn(shape, seed, DType::F32); }

// The reference for cat: pieces copied one after another (local Tensor views only).
Tensor cat_reference(const Locals& pieces, int64_t dim) {
  Shape shape = pieces[0].shape();
  shape[dim] = 0;
  for (const Tensor& p : pieces) shape[dim] += p.size(dim);
  Tensor out = Tensor::zeros(shape, pieces[0].dtype());
  int64_t offset = 0;
  for (const Tensor& p : pieces) {
    out.narrow(dim, offset, p.size(dim)).copy_(p);
    offset += p.size(dim);
  }
  return out;
}

OpCase make_case(std::string name, Locals inputs, std::function<DistTensor(const Inputs&)> dist_fn,
                 std::function<Tensor(const Locals&)> local_fn, int64_t max_combinations = 200) {
  OpCase c;
  c.name = std::move(name);
  c.inputs = std::move(inputs);
  c.dist_fn = std::move(dist_fn);
  c.local_fn = std::move(local_fn);
  c.max_combinations = max_combinations;
  return c;
}

// ---- the conformance table -----------------------------------------------------------

std::vector<OpCase> permute_cases() {
  return {
      make_case("transpose [3,5,4] 0<->2", {input({3, 5, 4}, 1)},
                [](const Inputs& x) { return transpose(x[0], 0, -1); },
                [](const Locals& x) { return x[0].transpose(0, 2); }),
      make_case("permute [4,3,5] {2,0,1}", {input({4, 3, 5}, 2)},
                [](const Inputs& x) { return permute(x[0], {2, 0, 1}); },
                [](const Locals& x) { return x[0].permute({2, 0, 1}); }),
      make_case("unsqueeze [3,5] at 1", {input({3, 5}, 3)}, [](const Inputs& x) { return unsqueeze(x[0], 1); },
                [](const Locals& x) { return x[0].unsqueeze(1); }),
      make_case("unsqueeze [4,2] at -1", {input({4, 2}, 4)}, [](const Inputs& x) { return unsqueeze(x[0], -1); },
                [](const Locals& x) { return x[0].unsqueeze(2); }),
      make_case("squeeze [3,1,5] at 1", {input({3, 1, 5}, 5)}, [](const Inputs& x) { return squeeze(x[0], 1); },
                [](const Locals& x) { return x[0].squeeze(1); }),
      make_case("expand [3,1] to [2,3,4]", {input({3, 1}, 6)}, [](const Inputs& x) { return expand(x[0], {2, 3, 4}); },
                [](const Locals& x) { return x[0].expand({2, 3, 4}); }),
      // Sharded dims of size 3 on 3 ranks hold local pieces of size 1, which must not
      // be mistaken for broadcast dims.
      make_case("expand [2,3] to [4,2,3]", {input({2, 3}, 7)}, [](const Inputs& x) { return expand(x[0], {4, -1, 3}); },
                [](const Locals& x) { return x[0].expand({4, 2, 3}); }),
  };
}

std::vector<OpCase> reshape_cases() {
  return {
      make_case("reshape flatten [4,3,5]->[12,5]", {input({4, 3, 5}, 11)},
                [](const Inputs& x) { return reshape(x[0], {12, 5}); },
                [](const Locals& x) { return x[0].reshape({12, 5}); }),
      make_case("reshape flatten uneven [3,4,5]->[3,20]", {input({3, 4, 5}, 12)},
                [](const Inputs& x) { return reshape(x[0], {3, -1}); },
                [](const Locals& x) { return x[0].reshape({3, 20}); }),
      make_case("reshape split [12,5]->[4,3,5]", {input({12, 5}, 13)},
                [](const Inputs& x) { return reshape(x[0], {4, 3, 5}); },
                [](const Locals& x) { return x[0].reshape({4, 3, 5}); }),
      make_case("reshape split uneven [5,6]->[5,3,2]", {input({5, 6}, 14)},
                [](const Inputs& x) { return reshape(x[0], {5, 3, 2}); },
                [](const Locals& x) { return x[0].reshape({5, 3, 2}); }),
      make_case("reshape regroup [6,4]->[4,6]", {input({6, 4}, 15)}, [](const Inputs& x) { return reshape(x[0], {4, 6}); },
                [](const Locals& x) { return x[0].reshape({4, 6}); }),
      make_case("reshape size-1 dims [4,1,6]->[2,2,1,6,1]", {input({4, 1, 6}, 16)},
                [](const Inputs& x) { return reshape(x[0], {2, 2, 1, 6, 1}); },
                [](const Locals& x) { return x[0].reshape({2, 2, 1, 6, 1}); }),
      make_case("reshape to 1-D [3,2]->[6]", {input({3, 2}, 17)}, [](const Inputs& x) { return reshape(x[0], {-1}); },
                [](const Locals& x) { return x[0].reshape({6}); }),
      make_case("view [2,6]->[2,2,3]", {input({2, 6}, 18)}, [](const Inputs& x) { return view(x[0], {2, 2, 3}); },
                [](const Locals& x) { return x[0].reshape({2, 2, 3}); }),
      make_case("flatten [2,3,2,2] dims 1..2", {input({2, 3, 2, 2}, 19)},
                [](const Inputs& x) { return flatten(x[0], 1, 2); },
                [](const Locals& x) { return x[0].flatten(1, 2); }, 60),
      make_case("flatten [3,5] all", {input({3, 5}, 20)}, [](const Inputs& x) { return flatten(x[0]); },
                [](const Locals& x) { return x[0].flatten(); }),
  };
}

std::vector<OpCase> join_cases() {
  return {
      make_case("slice [7,4] dim 0 [1:6:2]", {input({7, 4}, 21)},
                [](const Inputs& x) { return slice(x[0], 0, 1, 6, 2); },
                [](const Locals& x) { return x[0].slice(0, 1, 6, 2); }),
      make_case("slice [3,5,4] dim 1 [-4:-1]", {input({3, 5, 4}, 22)},
                [](const Inputs& x) { return slice(x[0], 1, -4, -1); },
                [](const Locals& x) { return x[0].slice(1, -4, -1); }),
      make_case("slice [5,4] dim -1 [2:100:3] clamps", {input({5, 4}, 23)},
                [](const Inputs& x) { return slice(x[0], -1, 2, 100, 3); },
                [](const Locals& x) { return x[0].slice(1, 2, 100, 3); }),
      make_case("slice [4,3] dim 0 [3:1] is empty", {input({4, 3}, 35)},
                [](const Inputs& x) { return slice(x[0], 0, 3, 1); },
                [](const Locals& x) { return x[0].slice(0, 3, 1); }),
      make_case("cat dim 0 of [2,4],[3,4],[1,4]", {input({2, 4}, 24), input({3, 4}, 25), input({1, 4}, 26)},
                [](const Inputs& x) { return cat(x, 0); }, [](const Locals& x) { return cat_reference(x, 0); }, 40),
      make_case("cat dim -1 of [3,2],[3,3]", {input({3, 2}, 27), input({3, 3}, 28)},
                [](const Inputs& x) { return cat(x, -1); }, [](const Locals& x) { return cat_reference(x, 1); }, 60),
      make_case("stack dim 1 of [3,4],[3,4]", {input({3, 4}, 29), input({3, 4}, 30)},
                [](const Inputs& x) { return stack(x, 1); },
                [](const Locals& x) { return cat_reference({x[0].unsqueeze(1), x[1].unsqueeze(1)}, 1); }, 60),
      // Piece 1 gets no gradient: its part of the input gradient must be zeros.
      make_case("split [7,3] {2,1,4} dim 0", {input({7, 3}, 31)},
                [](const Inputs& x) {
                  const auto p = split(x[0], {2, 1, 4}, 0);
                  return cat({p[2], mul(p[0], 2.0)}, 0);
                },
                [](const Locals& x) { return cat_reference({x[0].slice(0, 3, 7), mul(x[0].slice(0, 0, 2), 2.0)}, 0); }),
      make_case("split [3,5] {0,5} dim 1", {input({3, 5}, 32)},
                [](const Inputs& x) { return split(x[0], {0, 5}, 1)[1]; },
                [](const Locals& x) { return x[0]; }),
      make_case("chunk [5,4] into 3 dim 0", {input({5, 4}, 33)},
                [](const Inputs& x) {
                  const auto p = chunk(x[0], 3, 0);
                  return cat({p[2], p[0]}, 0);
                },
                [](const Locals& x) { return cat_reference({x[0].slice(0, 4, 5), x[0].slice(0, 0, 2)}, 0); }),
      make_case("chunk [2,5] into 4 dim 1 (one empty)", {input({2, 5}, 34)},
                [](const Inputs& x) {
                  const auto p = chunk(x[0], 4, 1);
                  return cat({p[3], p[1], p[2]}, 1);
                },
                [](const Locals& x) { return x[0].slice(1, 2, 5); }),
  };
}

TEST(ShapeOpsConformance, PermuteFamily) {
  for (const OpCase& c : permute_cases()) {
    SCOPED_TRACE(c.name);
    run_conformance(c);
    check_finite_differences(c);
  }
}

TEST(ShapeOpsConformance, ReshapeFamily) {
  for (const OpCase& c : reshape_cases()) {
    SCOPED_TRACE(c.name);
    run_conformance(c);
    check_finite_differences(c);
  }
}

TEST(ShapeOpsConformance, SliceCatStackSplitChunk) {
  for (const OpCase& c : join_cases()) {
    SCOPED_TRACE(c.name);
    run_conformance(c);
    check_finite_differences(c);
  }
}

// ---- which layouts move data -----------------------------------------------------------

TEST(ShapeOpsSharding, FlattenBatchKeepsShardWithoutCommunication) {
  const Tensor full = input({4, 3, 5}, 40);
  for (const Shape& mesh_shape : {Shape{2}, Shape{4}}) {
    launch(static_cast<int>(shape_numel(mesh_shape)), [&](Group world) {
      DeviceMesh mesh(world, mesh_shape);
      const DistTensor x = distribute(full, mesh, {Shard(0)});
      DistTensor y;
      {
        CommDebugMode comm;
        y = reshape(x, {12, 5});
        EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
      }
      EXPECT_EQ(y.placements(), Placements{Shard(0)});
      EXPECT_EQ(y.to_local().shape(), (Shape{12 / mesh_shape[0], 5}));
      EXPECT_TRUE(allclose(y.full_tensor(), full.reshape({12, 5})));
    });
  }
}

TEST(ShapeOpsSharding, NestedShardsOfTheBatchDimSurviveFlatten) {
  // Two mesh dims split B = 8 into 4 blocks of 2 rows = 4 blocks of 6 elements of
  // B*S: the same blocks in either nesting order (FSDP over TP: order 1 outer).
  const Tensor full = input({8, 3, 2}, 46);
  for (const Placements& placements : {Placements{Shard(0), Shard(0)}, Placements{Shard(0, 1), Shard(0, 0)}}) {
    launch(4, [&](Group world) {
      DeviceMesh mesh(world, {2, 2});
      const DistTensor x = distribute(full, mesh, placements);
      DistTensor y;
      {
        CommDebugMode comm;
        y = reshape(x, {24, 2});
        EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
      }
      EXPECT_EQ(y.placements(), placements);
      EXPECT_TRUE(allclose(y.full_tensor(), full.reshape({24, 2})));
    });
  }
}

// Many reshapes (size-1 dims, regrouping, uneven sizes) from every single-shard
// layout: the values are right and every local piece has the chunk rule's shape
// for the layout the result claims (wrap does not check it).
TEST(ShapeOpsSharding, ReshapeSweepKeepsLocalShapesConsistent) {
  const std::vector<std::pair<Shape, Shape>> reshapes = {
      {{6, 4}, {24}},       {{6, 4}, {3, 8}},      {{5, 3}, {15}},         {{2, 3, 4}, {6, 4}},
      {{2, 3, 4}, {2, 12}}, {{12}, {3, 2, 2}},     {{9, 2}, {3, 3, 2}},    {{1, 6, 1}, {6}},
      {{6}, {1, 2, 1, 3}},  {{4, 1, 3}, {2, 6}},   {{3, 4, 2}, {12, 1, 2}}, {{7, 1}, {7}},
  };
  for (const Shape& mesh_shape : {Shape{3}, Shape{2, 2}}) {
    launch(static_cast<int>(shape_numel(mesh_shape)), [&](Group world) {
      DeviceMesh mesh(world, mesh_shape);
      std::vector<int64_t> coordinate;
      for (int m = 0; m < mesh.ndim(); ++m) coordinate.push_back(mesh.coordinate(m));
      uint64_t seed = 60;
      for (const auto& [from, to] : reshapes) {
        const Tensor full = input(from, seed++);
        OpCase layouts;
        layouts.inputs = {full};
        layouts.partial_inputs = false;
        for (const auto& combo : combinations(layouts, mesh.ndim())) {
          const DistTensor y = reshape(distribute(full, mesh, combo[0]), to);
          const std::string what = shape_to_string(from) + " -> " + shape_to_string(to) + " from " +
                                   placements_to_string(combo[0]) + " gave " + placements_to_string(y.placements());
          EXPECT_EQ(y.to_local().shape(), local_shape(to, mesh.shape(), y.placements(), coordinate)) << what;
          EXPECT_TRUE(allclose(y.full_tensor(), full.reshape(to))) << what;
        }
      }
    });
  }
}

TEST(ShapeOpsSharding, EmptyTensorsReshape) {
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor x = distribute(Tensor::zeros({0, 4}), mesh, {Shard(1)});
    const DistTensor y = reshape(x, {2, 0, 2});
    EXPECT_EQ(y.shape(), (Shape{2, 0, 2}));
    EXPECT_EQ(y.full_tensor().shape(), (Shape{2, 0, 2}));
  });
}

TEST(ShapeOpsSharding, UnevenShardsKeepShardingOnlyWhenBoundariesMatch) {
  // [3, 2] -> [6] on 4 ranks: rows [0,1), [1,2), [2,3), [] are elements [0,2), [2,4),
  // [4,6), [] = the chunks of 6 on 4 ranks, so S(0) stays.
  launch(4, [&](Group world) {
    DeviceMesh mesh(world, {4});
    const Tensor full = input({3, 2}, 41);
    const DistTensor x = distribute(full, mesh, {Shard(0)});
    CommDebugMode comm;
    const DistTensor y = reshape(x, {6});
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_EQ(y.placements(), Placements{Shard(0)});
    EXPECT_TRUE(allclose(y.full_tensor(), full.reshape({6})));
  });
  // [5, 2, 3] -> [10, 3] on 2 ranks: rows [0,3), [3,5) are elements [0,6), [6,10) but
  // the chunks of 10 are [0,5), [5,10): keeping S(0) would be wrong, so it moves.
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const Tensor full = input({5, 2, 3}, 42);
    const DistTensor x = distribute(full, mesh, {Shard(0)});
    DistTensor y;
    {
      CommDebugMode comm;
      y = reshape(x, {10, 3});
      EXPECT_GT(comm.total_count(), 0);
    }
    EXPECT_TRUE(allclose(y.full_tensor(), full.reshape({10, 3})));
    EXPECT_TRUE(allclose(y.redistribute({Shard(0)}).to_local(), distribute(full.reshape({10, 3}), mesh, {Shard(0)}).to_local()));
  });
}

// A piece that got no gradient is filled with zeros on the input's device (the
// gradient stays where the input is whichever piece is used).
TEST(ShapeOpsConformance, SplitBackwardKeepsTheInputsDevice) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    const Device device = Device::cpu(1);
    for (size_t used : {0, 1}) {
      DistTensor x = DistTensor::from_local(Tensor::ones({3, 6}, DType::F32, device), mesh, {Replicate()});
      x.set_requires_grad(true);
      const std::vector<DistTensor> parts = split(x, {2, 4}, 1);
      sum(parts[used]).backward();
      EXPECT_EQ(x.grad().device(), device) << "piece " << used;
    }
  });
}

TEST(ShapeOpsSharding, SplitDimPassesShardToOutermostPiece) {
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const Tensor full = input({12, 5}, 43);
    const DistTensor x = distribute(full, mesh, {Shard(0)});
    {
      CommDebugMode comm;
      const DistTensor y = reshape(x, {4, 3, 5});
      EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
      EXPECT_EQ(y.placements(), Placements{Shard(0)});
    }
    // [12] -> [3, 4]: rank 0 holds elements [0, 6), but rows [0, 2) of the result are
    // elements [0, 8): this split must redistribute.
    const DistTensor z = reshape(x, {3, 4, 5});
    EXPECT_TRUE(allclose(z.full_tensor(), full.reshape({3, 4, 5})));
  });
}

TEST(ShapeOpsSharding, InnerDimOfFlattenGroupIsMovedNotKept) {
  // S(1) is strided inside the merged dim: a rank's rows of S are not a contiguous
  // block of B*S. The cheapest clean layout is S(0) before the reshape: one
  // all-to-all, not an all-gather.
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const Tensor full = input({4, 2, 3}, 44);
    const DistTensor x = distribute(full, mesh, {Shard(1)});
    DistTensor y;
    {
      CommDebugMode comm;
      y = reshape(x, {8, 3});
      EXPECT_EQ(comm.count("all_to_all"), 1) << comm.to_string();
      EXPECT_EQ(comm.total_count(), 1) << comm.to_string();
    }
    EXPECT_EQ(y.placements(), Placements{Shard(0)});
    EXPECT_TRUE(allclose(y.full_tensor(), full.reshape({8, 3})));
  });
}

TEST(ShapeOpsSharding, CutAlongUnshardedDimIsLocal) {
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const Tensor full = input({6, 4}, 45);
    const DistTensor x = distribute(full, mesh, {Shard(1)});
    CommDebugMode comm;
    const auto pieces = chunk(x, 4, 0);
    ASSERT_EQ(pieces.size(), 4u);
    EXPECT_EQ(pieces[3].shape(), (Shape{0, 4}));  // ceil(6/4) = 2: 2, 2, 2, 0
    const DistTensor s = slice(x, 0, 1, 5, 2);
    const DistTensor c = cat({pieces[0], pieces[2]}, 0);
    const DistTensor st = stack({pieces[0], pieces[1]}, 0);
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    for (const DistTensor& t : {pieces[0], s, c}) EXPECT_EQ(t.placements(), Placements{Shard(1)});
    EXPECT_EQ(st.placements(), Placements{Shard(2)});
  });
}

// ---- bad input ----------------------------------------------------------------------------

TEST(ShapeOpsErrors, ClearMessages) {
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor x = distribute(input({2, 3, 4}, 50), mesh, {Shard(0)});
    EXPECT_THROW_MSG(reshape(x, {5, 5}), std::invalid_argument, "[reshape] expected a shape with 24 elements");
    EXPECT_THROW_MSG(reshape(x, {-1, -1}), std::invalid_argument, "[reshape] expected at most one -1");
    EXPECT_THROW_MSG(reshape(x, {-2, -12}), std::invalid_argument, "[reshape] expected sizes >= 0 or -1");
    EXPECT_THROW_MSG(reshape(x, {5, -1}), std::invalid_argument, "[reshape] expected a shape that fits 24");
    EXPECT_THROW_MSG(view(x, {7}), std::invalid_argument, "[view] expected a shape with 24 elements");
    EXPECT_THROW_MSG(flatten(x, 2, 1), std::invalid_argument, "[flatten] expected start_dim <= end_dim");
    EXPECT_THROW_MSG(flatten(x, 0, 3), std::invalid_argument, "[flatten]");
    EXPECT_THROW_MSG(slice(x, 3, 0, 1), std::invalid_argument, "[slice]");
    EXPECT_THROW_MSG(slice(x, 0, 0, 1, 0), std::invalid_argument, "[slice] expected step > 0, got 0");
    EXPECT_THROW_MSG(split(x, {1, 1}, 1), std::invalid_argument, "[split] expected sizes that add up to 3");
    EXPECT_THROW_MSG(split(x, {4, -1}, 1), std::invalid_argument, "[split] expected sizes >= 0");
    EXPECT_THROW_MSG(split(x, {3}, -4), std::invalid_argument, "[split]");
    EXPECT_THROW_MSG(chunk(x, 0, 1), std::invalid_argument, "[chunk] expected k >= 1 pieces, got 0");
    EXPECT_THROW_MSG(cat({}, 0), std::invalid_argument, "[cat] expected at least one tensor");
    EXPECT_THROW_MSG(cat({x, x}, 3), std::invalid_argument, "[cat]");
    const DistTensor wide = distribute(input({2, 4, 4}, 51), mesh, {Replicate()});
    EXPECT_THROW_MSG(cat({x, wide}, 0), std::invalid_argument, "[cat] expected tensor 1 to match [2, 3, 4]");
    const DistTensor f64 = distribute(input({2, 3, 4}, 52).to(DType::F64), mesh, {Replicate()});
    EXPECT_THROW_MSG(cat({x, f64}, 0), std::invalid_argument, "[cat] expected every tensor in f32");
    const DistTensor flat = distribute(input({24}, 53), mesh, {Replicate()});
    EXPECT_THROW_MSG(cat({x, flat}, 0), std::invalid_argument, "[cat] expected tensor 1 to match");
    EXPECT_THROW_MSG(stack({x, wide}, 0), std::invalid_argument, "[stack] expected every tensor to have shape [2, 3, 4]");
    EXPECT_THROW_MSG(stack({x, x}, 4), std::invalid_argument, "[stack]");
    EXPECT_THROW_MSG(permute(x, {0, 0, 1}), std::invalid_argument, "[permute]");
    EXPECT_THROW_MSG(permute(x, {0, 1}), std::invalid_argument, "[permute] expected 3 dims");
    EXPECT_THROW_MSG(transpose(x, 0, 3), std::invalid_argument, "[transpose]");
    EXPECT_THROW_MSG(unsqueeze(x, 4), std::invalid_argument, "[unsqueeze]");
    EXPECT_THROW_MSG(squeeze(x, -4), std::invalid_argument, "[squeeze]");
    EXPECT_THROW_MSG(expand(x, {2, 5, 4}), std::invalid_argument, "[expand] cannot expand [2, 3, 4] to [2, 5, 4]");
    EXPECT_THROW_MSG(expand(x, {3, 4}), std::invalid_argument, "[expand]");
  });
  launch(4, [&](Group world) {
    const DistTensor a = distribute(input({4, 2}, 54), DeviceMesh(world, {4}), {Replicate()});
    const DistTensor b = distribute(input({4, 2}, 55), DeviceMesh(world, {2, 2}), {Replicate(), Replicate()});
    EXPECT_THROW_MSG(cat({a, b}, 0), std::invalid_argument, "[cat] operands live on different meshes");
    EXPECT_THROW_MSG(stack({a, b}, 0), std::invalid_argument, "[stack] operands live on different meshes");
  });
}

}  // namespace
}  // namespace dtensor::testing
