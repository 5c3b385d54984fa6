// Redistribution across meshes over one world of 4 ranks: every ordered pair among
// {4}, {2, 2}, {2} on ranks 0-1 and {2} on ranks 2-3, every pair of layouts from
// {S(0), S(1), R, P(sum)} per mesh dim, uneven and empty shards; values on the
// target's ranks and gradients back on the source's; exact point-to-point traffic;
// ranks outside both meshes take no part.
#include "dist_op_test_util.h"

namespace dtensor {
namespace {

std::vector<Placements> all_layouts(int mesh_ndim) {
  std::vector<Placements> layouts{{}};
  for (int m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const Placements& prefix : layouts) {
      for (const Placement& p : {Shard(0), Shard(1), Replicate(), Partial()}) {
        Placements l = prefix;
        l.push_back(p);
        next.push_back(l);
      }
    }
    layouts = next;
  }
  return layouts;
}

std::vector<DeviceMesh> four_meshes(const Group& world) {
  return {DeviceMesh(world, {4}, {"all"}), DeviceMesh(world, {2, 2}, {"a", "b"}),
          DeviceMesh::from_ranks(world, {0, 1}, {2}, {"front"}), DeviceMesh::from_ranks(world, {2, 3}, {2}, {"back"})};
}

// Fresh values for every case: a buffer freed by the previous case may hold the
// same numbers, and a piece the move forgot to write would then look right.
void move_every_layout(const DeviceMesh& from, const DeviceMesh& to, const Shape& shape, uint64_t& seed) {
  for (const Placements& pa : all_layouts(from.ndim())) {
    for (const Placements& pb : all_layouts(to.ndim())) {
      const Tensor full = Tensor::randn(shape, seed++), weight = Tensor::randn(shape, seed++);
      const std::string what = from.to_string() + " " + placements_to_string(pa) + " -> " + to.to_string() + " " +
                               placements_to_string(pb) + " shape " + shape_to_string(full.shape());
      DistTensor x = from.is_member() ? testing::make_input(full, from, pa) : distribute(full, from, pa);
      x.set_requires_grad();
      const DistTensor y = x.redistribute(to, pb);
      ASSERT_EQ(y.mesh(), to) << what;
      ASSERT_EQ(y.shape(), full.shape()) << what;
      if (to.is_member()) {
        ASSERT_EQ(y.placements(), validate_placements(pb, to.ndim(), full.dim(), "test")) << what;
        ASSERT_EQ(y.to_local().shape(), local_shape(full.shape(), to.shape(), y.placements(), to.coordinate()))
            << what;
        ASSERT_TRUE(allclose(y.full_tensor(), full, 1e-5, 1e-6)) << what;
        // d(sum(y * w))/dx = w, back on the source mesh in the source's layout.
        sum(mul(y, distribute(weight, to, Placements(to.ndim(), Replicate())))).backward();
      } else {
        EXPECT_EQ(y.to_local().numel(), 0) << what;
        y.backward();  // this rank's share of the gradient arrives from the target's ranks
      }
      if (from.is_member()) {
        ASSERT_TRUE(x.grad().defined()) << what;
        ASSERT_TRUE(allclose(x.grad().full_tensor(), weight, 1e-5, 1e-6)) << what;
      }
    }
  }
}

TEST(CrossMesh, EveryMeshPairAndLayoutPairWithGradients) {
  launch(4, [](Group world) {
    const std::vector<DeviceMesh> meshes = four_meshes(world);
    uint64_t seed = 7;
    for (const Shape& shape : {Shape{5, 3}, Shape{1, 2}}) {  // uneven; empty shards
      for (size_t a = 0; a < meshes.size(); ++a) {
        for (size_t b = 0; b < meshes.size(); ++b) {
          if (a != b) move_every_layout(meshes[a], meshes[b], shape, seed);
        }
      }
    }
  });
}

// A pipeline stage hands its activations to the next: ranks 0-1 -> ranks 2-3.
// Each rank sends exactly the block its counterpart needs, and nothing else.
TEST(CrossMesh, SendsExactlyWhatTheOtherMeshNeeds) {
  launch(4, [](Group world) {
    const DeviceMesh front = DeviceMesh::from_ranks(world, {0, 1}, {2}, {"front"});
    const DeviceMesh back = DeviceMesh::from_ranks(world, {2, 3}, {2}, {"back"});
    const Tensor full = Tensor::randn({6, 4}, 1);
    const DistTensor x = distribute(full, front, {Shard(0)});
    CommDebugMode comm;
    const DistTensor y = x.redistribute(back, {Shard(0)});
    const int r = world.rank();
    // Rank 0 -> 2 and 1 -> 3: three rows of four floats each.
    EXPECT_EQ(comm.bytes("send"), r < 2 ? 3 * 4 * 4 : 0) << comm.to_string();
    EXPECT_EQ(comm.bytes("recv"), r < 2 ? 0 : 3 * 4 * 4) << comm.to_string();
    EXPECT_EQ(comm.total_count(), 1) << comm.to_string();
    if (r >= 2) EXPECT_TRUE(allclose(y.to_local(), full.narrow(0, 3 * (r - 2), 3), 0, 0));
    // Replicated on the source: the two holders share the sends (one each).
    comm.reset();
    const Tensor other = Tensor::randn({6, 4}, 2);
    const DistTensor z = distribute(other, front, {Replicate()}).redistribute(back, {Shard(1)});
    EXPECT_EQ(comm.bytes("send"), r < 2 ? 6 * 2 * 4 : 0) << comm.to_string();
    if (r >= 2) EXPECT_TRUE(allclose(z.to_local(), other.narrow(1, 2 * (r - 2), 2), 0, 0));
    // 4 ranks -> the 2x2 mesh of the same ranks: only the blocks that change owner move.
    comm.reset();
    const DeviceMesh line(world, {4}, {"all"}), square(world, {2, 2}, {"a", "b"});
    const Tensor third = Tensor::randn({6, 4}, 3);
    const DistTensor u = distribute(third, line, {Shard(0)}).redistribute(square, {Shard(0), Replicate()});
    // The line holds rows 0-1, 2-3, 4-5 and none; the square's first row of ranks
    // (0, 1) needs rows 0-2 and its second (2, 3) rows 3-5. Rank 0 sends rows 0-1 to
    // rank 1; rank 1 sends row 2 to rank 0 and row 3 to ranks 2 and 3; rank 2 sends
    // rows 4-5 to rank 3. Everything else is already in place.
    const std::vector<int64_t> sent{2 * 16, 3 * 16, 2 * 16, 0};
    EXPECT_EQ(comm.bytes("send"), sent[static_cast<size_t>(r)]) << comm.to_string();
    EXPECT_TRUE(allclose(u.full_tensor(), third, 0, 0));
  });
}

// Ranks outside both meshes take no part: they get a tensor that lives elsewhere
// and communicate nothing.
TEST(CrossMesh, RanksOutsideBothMeshesDoNothing) {
  launch(4, [](Group world) {
    const DeviceMesh first = DeviceMesh::from_ranks(world, {0}, {1}, {"x"});
    const DeviceMesh second = DeviceMesh::from_ranks(world, {1}, {1}, {"y"});
    const Tensor full = Tensor::randn({3, 2}, 1);
    CommDebugMode comm;
    const DistTensor y = distribute(full, first, {Replicate()}).redistribute(second, {Replicate()});
    if (world.rank() >= 2) {
      EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
      EXPECT_EQ(y.to_local().numel(), 0);
      EXPECT_THROW_MSG(y.full_tensor(), std::invalid_argument, "[full_tensor] this rank is not in mesh y=1");
      EXPECT_THROW_MSG(add(y, y), std::invalid_argument, "[add] this rank is not in mesh y=1");
    }
    if (world.rank() == 1) EXPECT_TRUE(allclose(y.to_local(), full, 0, 0));
  });
}

TEST(CrossMesh, ExplainAndErrors) {
  launch(4, [](Group world) {
    const DeviceMesh front = DeviceMesh::from_ranks(world, {0, 1}, {2}, {"front"});
    const DeviceMesh back = DeviceMesh::from_ranks(world, {2, 3}, {2}, {"back"});
    const RedistributePlan plan = explain_redistribute({Partial()}, front, {Shard(1)}, back, {4, 6});
    // All-reduce on the source, the transfer, nothing to re-partition.
    ASSERT_EQ(plan.steps.size(), 2u) << plan.to_string();
    EXPECT_EQ(plan.steps[0].kind, TransformKind::AllReduce) << plan.to_string();
    EXPECT_EQ(plan.steps[1].kind, TransformKind::CrossMesh) << plan.to_string();
    EXPECT_EQ(plan.steps[1].bytes_sent, world.rank() < 2 ? 4 * 3 * 4 : 0) << plan.to_string();
    EXPECT_NE(plan.to_string().find("cross_mesh from front=2 to back=2"), std::string::npos) << plan.to_string();
    EXPECT_GT(plan.predicted_seconds, 0);
    // Another world.
    Group pairs = world.split(world.rank() / 2);
    const DeviceMesh other(pairs, {2}, {"pair"});
    const DistTensor x = distribute(Tensor::randn({2, 2}, 1), DeviceMesh(world, {4}), {Replicate()});
    EXPECT_THROW_MSG(x.redistribute(other, {Replicate()}), std::invalid_argument,
                     "[redistribute] the meshes are over different worlds");
    EXPECT_THROW_MSG(x.redistribute(back, {Shard(2)}), std::invalid_argument, "[redistribute]");
  });
}

}  // namespace
}  // namespace dtensor
