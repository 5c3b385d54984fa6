// Redistribution between every pair of layouts on small meshes, checked against the
// full tensor on one rank, with the comm counters held to what explain promised.
#include <map>
#include <random>

#include "dist_op_test_util.h"

using namespace dtensor;

namespace {

// The candidate placements of the issue: S(0), S(1), S(-1), R, P(sum), P(max).
std::vector<Placement> candidates(int64_t ndim) {
  std::vector<Placement> out{Shard(0), Replicate(), Partial(ReduceOp::Sum), Partial(ReduceOp::Max), Shard(-1)};
  if (ndim >= 2) out.push_back(Shard(1));
  return out;
}

bool mixes_nonlinear(const Placements& p) {
  bool sum = false, max = false;
  for (const Placement& x : p) {
    sum |= x.is_partial() && x.reduce_op() == ReduceOp::Sum;
    max |= x.is_partial() && x.reduce_op() == ReduceOp::Max;
  }
  return sum && max;
}

// Every placement list of length `ndim_mesh` over the candidates.
std::vector<Placements> all_layouts(int64_t mesh_ndim, int64_t tensor_ndim) {
  std::vector<Placements> out{{}};
  for (int64_t i = 0; i < mesh_ndim; ++i) {
    std::vector<Placements> next;
    for (const Placements& prefix : out) {
      for (const Placement& p : candidates(tensor_ndim)) {
        Placements l = prefix;
        l.push_back(p);
        next.push_back(l);
      }
    }
    out = next;
  }
  std::erase_if(out, mixes_nonlinear);
  return out;
}

// Redistributes source -> target and checks values, local shape and comm counters.
void check_pair(const Tensor& full, const DeviceMesh& mesh, const Placements& from, const Placements& to) {
  const DistTensor source = dtensor::testing::make_input(full, mesh, from);
  const RedistributePlan plan = explain_redistribute(from, to, full.shape(), mesh, full.dtype());
  DistTensor result;
  {
    CommDebugMode comm;
    result = source.redistribute(to);
    std::map<std::string, int64_t> calls, bytes;
    for (const RedistributeStep& step : plan.steps) {
      if (step.collective.empty()) continue;
      calls[step.collective] += step.collective_calls;
      bytes[step.collective] += step.bytes_sent;
    }
    for (const char* kind : {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "send"}) {
      ASSERT_EQ(comm.count(kind), calls[kind]) << kind << " for " << plan.to_string();
      ASSERT_EQ(comm.bytes(kind), bytes[kind]) << kind << " for " << plan.to_string();
    }
  }
  const Shape expected_local = local_shape(full.shape(), mesh.shape(),
                                           validate_placements(to, mesh.ndim(), full.dim(), "test"), mesh.coordinate());
  ASSERT_EQ(result.to_local().shape(), expected_local) << plan.to_string();
  ASSERT_EQ(placements_to_string(result.placements()),
            placements_to_string(validate_placements(to, mesh.ndim(), full.dim(), "test")));
  const Tensor back = result.full_tensor();
  ASSERT_TRUE(allclose(back, full, 1e-5, 1e-5))
      << placements_to_string(from) << " -> " << placements_to_string(to) << " on " << mesh.to_string() << " shape "
      << shape_to_string(full.shape()) << ": " << compare(back, full, 1e-5, 1e-5).to_string() << "\n"
      << plan.to_string();
}

std::vector<Shape> shapes_for(int64_t ndim, int64_t mesh_size) {
  if (ndim == 1) return {{2 * mesh_size}, {3 * mesh_size + 1}, {1}};
  if (ndim == 2) return {{4, 6}, {5, 3}, {1, 2}};
  return {{3, 4, 5}, {2, 1, 3}};
}

void exhaustive(int world, const Shape& mesh_shape, int64_t max_pairs_per_shape) {
  launch(world, [&](Group g) {
    DeviceMesh mesh(g, mesh_shape);
    std::mt19937 rng(7);  // the same on every rank: all ranks run the same pairs
    for (int64_t ndim = 1; ndim <= 3; ++ndim) {
      const std::vector<Placements> layouts = all_layouts(mesh.ndim(), ndim);
      for (const Shape& shape : shapes_for(ndim, mesh.size())) {
        const Tensor full = Tensor::randn(shape, 11);
        const int64_t pairs = static_cast<int64_t>(layouts.size() * layouts.size());
        for (int64_t k = 0; k < std::min(pairs, max_pairs_per_shape); ++k) {
          const int64_t index =
              pairs <= max_pairs_per_shape ? k : std::uniform_int_distribution<int64_t>(0, pairs - 1)(rng);
          check_pair(full, mesh, layouts[index / layouts.size()], layouts[index % layouts.size()]);
        }
      }
    }
  });
}

}  // namespace

TEST(Redistribute, Exhaustive1D) {
  for (int n = 1; n <= 5; ++n) exhaustive(n, {n}, 1 << 30);
}
TEST(Redistribute, Exhaustive2x2) { exhaustive(4, {2, 2}, 1 << 30); }
TEST(Redistribute, Sampled2x3) { exhaustive(6, {2, 3}, 400); }
TEST(Redistribute, Sampled2x2x2) { exhaustive(8, {2, 2, 2}, 150); }

TEST(Redistribute, RandomChainsStayExact) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2}, {"dp", "tp"});
    std::mt19937 rng(99);
    const Tensor full = Tensor::randn({7, 5, 3}, 5);
    const std::vector<Placements> layouts = all_layouts(2, 3);
    for (int chain = 0; chain < 20; ++chain) {
      DistTensor t = distribute(full, mesh, {Replicate(), Replicate()});
      for (int step = 0; step < 6; ++step) {
        Placements next = layouts[std::uniform_int_distribution<size_t>(0, layouts.size() - 1)(rng)];
        t = t.redistribute(next);
      }
      ASSERT_TRUE(allclose(t.full_tensor(), full, 1e-5, 1e-5)) << placements_to_string(t.placements());
    }
  });
}

TEST(Redistribute, SwappingTwoShardedDimsNeverGathersTheWholeTensor) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2});
    const Shape shape{64, 64};
    const RedistributePlan planned = explain_redistribute({Shard(0), Shard(1)}, {Shard(1), Shard(0)}, shape, mesh);
    const RedistributePlan naive = explain_redistribute({Shard(0), Shard(1)}, {Replicate(), Replicate()}, shape, mesh);
    EXPECT_LT(planned.bytes_sent(), naive.bytes_sent()) << planned.to_string() << naive.to_string();
    for (const RedistributeStep& step : planned.steps) {
      const bool all_replicated =
          std::all_of(step.after.begin(), step.after.end(), [](const Placement& p) { return p.is_replicate(); });
      EXPECT_FALSE(all_replicated) << planned.to_string();
    }
    const Tensor full = Tensor::randn(shape, 3);
    DistTensor d = distribute(full, mesh, {Shard(0), Shard(1)}).redistribute({Shard(1), Shard(0)});
    EXPECT_TRUE(allclose(d.full_tensor(), full, 0, 0));
  });
}

TEST(Redistribute, CanonicalCasesUseTheExpectedCollective) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    const Shape shape{6, 4};
    auto only = [&](const Placements& from, const Placements& to, const char* collective) {
      const RedistributePlan plan = explain_redistribute(from, to, shape, mesh);
      ASSERT_EQ(plan.steps.size(), 1u) << plan.to_string();
      EXPECT_EQ(plan.steps[0].collective, collective) << plan.to_string();
    };
    only({Shard(0)}, {Replicate()}, "all_gather");
    only({Partial()}, {Replicate()}, "all_reduce");
    only({Partial()}, {Shard(1)}, "reduce_scatter");
    only({Shard(0)}, {Shard(1)}, "all_to_all");
    only({Replicate()}, {Shard(0)}, "");
    only({Shard(0)}, {Partial()}, "");
  });
}

// Found by tests/fuzz/fuzz_redistribute: a size-1 mesh dim takes the target's P(sum)
// for free while P(max) is still to resolve on the other dims; the planner refused
// every move from that start ("no path") as mixing Partial kinds.
TEST(Redistribute, SizeOneMeshDimsDoNotMixPartialKinds) {
  launch(4, [](Group g) {
    const DeviceMesh mesh(g, {2, 2, 1});
    const Tensor full = Tensor::randn({4, 3}, 7);
    const Placements max2{Partial(ReduceOp::Max), Partial(ReduceOp::Max), Replicate()};
    check_pair(full, mesh, max2, {Replicate(), Shard(0), Partial()});
    check_pair(full, mesh, {Replicate(), Shard(0), Partial()}, max2);
  });
}

// Found by tests/fuzz/fuzz_redistribute: a source spelled S(0, order=1) where that
// is its dim's only split (canonically S(0)) planned differently from its canonical
// spelling (the search compares placements with their orders), so redistribute ran
// an all-gather where explain_redistribute had promised one point-to-point move. The
// planner now plans the canonical pair whatever the spelling.
TEST(Redistribute, ExplainPromisesWhatRedistributeRunsForAnySpelling) {
  launch(8, [](Group g) {
    const DeviceMesh mesh(g, {2, 1, 4});
    for (int64_t n : {0, 8, 13}) {
      const Tensor full = Tensor::arange(0, static_cast<double>(n), 1);
      const Placements to{Shard(0, 1), Shard(0), Shard(0)};
      for (const Placements& from :
           {Placements{Shard(0, 1), Replicate(), Replicate()}, Placements{Shard(0), Replicate(), Replicate()}}) {
        const DistTensor source = distribute(full, mesh, from);
        const RedistributePlan plan = explain_redistribute(from, to, full.shape(), mesh);
        std::map<std::string, int64_t> promised;
        for (const RedistributeStep& step : plan.steps) {
          if (!step.collective.empty()) promised[step.collective] += step.collective_calls;
        }
        CommDebugMode comm;
        const DistTensor result = source.redistribute(to);
        for (const char* kind : {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "send"}) {
          EXPECT_EQ(comm.count(kind), promised[kind])
              << kind << " for " << placements_to_string(from) << ", n " << n << "\n"
              << plan.to_string() << comm.to_string();
        }
        EXPECT_TRUE(allclose(result.full_tensor(), full, 0, 0));
      }
    }
  });
}

// Replicate -> Shard(d) is a local chunk whatever d and the size: never a free chunk
// of dim 0 and an all-to-all of data the rank already holds (the all-to-all also
// copies the piece a rank keeps, so it cannot undercut the strided local copy).
TEST(Redistribute, ReplicateToAnyShardIsLocal) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    for (const Shape& shape : {Shape{6, 4}, Shape{1024, 2048}, Shape{16, 64, 2048}}) {
      for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
        const RedistributePlan plan = explain_redistribute({Replicate()}, {Shard(d)}, shape, mesh);
        ASSERT_EQ(plan.steps.size(), 1u) << plan.to_string();
        EXPECT_EQ(plan.steps[0].collective, "") << plan.to_string();
        EXPECT_EQ(plan.bytes_sent(), 0) << plan.to_string();
      }
    }
  });
}

TEST(Redistribute, FsdpOverTensorParallelOrderRoundTrips) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2}, {"dp", "tp"});
    const Tensor w = Tensor::randn({9, 4}, 8);
    // tp splits the rows first (outer), dp splits each tp piece.
    DistTensor fsdp_tp = distribute(w, mesh, {Shard(0, 1), Shard(0, 0)});
    const Range tp_piece = chunk_range(9, 2, mesh.coordinate(1));
    const Range dp_piece = chunk_range(tp_piece.length, 2, mesh.coordinate(0));
    EXPECT_TRUE(allclose(fsdp_tp.to_local(), w.narrow(0, tp_piece.offset + dp_piece.offset, dp_piece.length), 0, 0));
    EXPECT_TRUE(allclose(fsdp_tp.full_tensor(), w, 0, 0));
    // Gathering dp (the inner splitter) gives the tp-sharded weight: one all-gather.
    CommDebugMode comm;
    DistTensor tp_only = fsdp_tp.redistribute({Replicate(), Shard(0)});
    EXPECT_EQ(comm.count("all_gather"), 1);
    EXPECT_EQ(comm.total_count(), 1);
    EXPECT_TRUE(allclose(tp_only.to_local(), w.narrow(0, tp_piece.offset, tp_piece.length), 0, 0));
    // And to the default nesting (dp outer) and back.
    DistTensor dp_outer = fsdp_tp.redistribute({Shard(0), Shard(0)});
    EXPECT_TRUE(allclose(dp_outer.full_tensor(), w, 0, 0));
    EXPECT_TRUE(allclose(dp_outer.redistribute({Shard(0, 1), Shard(0, 0)}).to_local(), fsdp_tp.to_local(), 0, 0));
  });
}

TEST(Redistribute, AsyncStartsTheFirstCollective) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    const Tensor full = Tensor::randn({1000, 8}, 1);
    DistTensor d = distribute(full, mesh, {Shard(0)});
    PendingRedistribute pending = d.redistribute_async({Replicate()});
    DistTensor r = pending.wait();
    EXPECT_TRUE(allclose(r.to_local(), full, 0, 0));
    EXPECT_THROW_MSG(pending.wait(), std::invalid_argument, "[redistribute_async]");
  });
}

TEST(Redistribute, ExplainDescribesTheSteps) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2}, {"dp", "tp"});
    const RedistributePlan plan = explain_redistribute({Shard(0), Partial()}, {Replicate(), Replicate()}, {8, 8}, mesh);
    ASSERT_EQ(plan.steps.size(), 2u);
    const std::string text = plan.to_string();
    EXPECT_NE(text.find("all_reduce"), std::string::npos) << text;
    EXPECT_NE(text.find("all_gather"), std::string::npos) << text;
    EXPECT_GT(plan.predicted_seconds, 0);
    // Rank bytes: all-reduce of the [4, 8] shard, all-gather of it.
    EXPECT_EQ(plan.bytes_sent(), 2 * 4 * 8 * 4);
    EXPECT_TRUE(explain_redistribute({Shard(0), Replicate()}, {Shard(0), Replicate()}, {8, 8}, mesh).steps.empty());
  });
}

TEST(Redistribute, BadInputsThrow) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2});
    DistTensor d = distribute(Tensor::randn({4, 4}, 1), mesh, {Shard(0), Replicate()});
    EXPECT_THROW_MSG(d.redistribute({Replicate()}), std::invalid_argument, "[redistribute]");
    EXPECT_THROW_MSG(d.redistribute({Shard(2), Replicate()}), std::invalid_argument, "[redistribute]");
    EXPECT_THROW_MSG(d.redistribute({Partial(ReduceOp::Max), Partial(ReduceOp::Sum)}), std::invalid_argument,
                     "[redistribute]");
    DeviceMesh other(g, {4});
    EXPECT_THROW_MSG(d.redistribute(other, {Replicate(), Replicate()}), std::invalid_argument,
                     "[redistribute] expected 1 placements");
    EXPECT_THROW_MSG(d.redistribute(DeviceMesh(), {Replicate()}), std::invalid_argument,
                     "[redistribute] expected a defined target mesh");
  });
}
