// Redistribution of a 64 MiB F32 tensor on 4 ranks (a 2x2 mesh, threads backend).
//
// For each main transition, in the same run:
//   time        the planned redistribute (median over reps, slowest rank)
//   collective  the bare collective(s) the plan runs, on buffers of the same sizes
//   naive       gather everything (full_tensor) then slice the target piece
//   predicted   the cost model's time for the plan, and its relative error
//   bytes       what each rank sends on the planned and the naive path
// Each case runs its ranks once (launch) and times repetitions inside, so thread
// start-up is not measured.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

constexpr int kRanks = 4;
const Shape kShape{4096, 4096};  // 64 MiB of F32
constexpr int kReps = 9;

struct Transition {
  const char* name;
  Placements from, to;
};

const std::vector<Transition>& transitions() {
  static const std::vector<Transition> list = {
      {"S0R_to_RR (all_gather)", {Shard(0), Replicate()}, {Replicate(), Replicate()}},
      {"PR_to_RR (all_reduce)", {Partial(), Replicate()}, {Replicate(), Replicate()}},
      {"PR_to_S0R (reduce_scatter)", {Partial(), Replicate()}, {Shard(0), Replicate()}},
      {"S0R_to_S1R (all_to_all)", {Shard(0), Replicate()}, {Shard(1), Replicate()}},
      {"RR_to_S0S1 (local)", {Replicate(), Replicate()}, {Shard(0), Shard(1)}},
      {"S0S1_to_RR (2 all_gathers)", {Shard(0), Shard(1)}, {Replicate(), Replicate()}},
      {"S0S1_to_S1S0 (block transfer)", {Shard(0), Shard(1)}, {Shard(1), Shard(0)}},
      {"PP_to_RR (2 all_reduces)", {Partial(), Partial()}, {Replicate(), Replicate()}},
  };
  return list;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Medians over reps of the slowest rank's time for each function. The functions
// run interleaved within every rep, so drift in the machine's load hits them alike.
std::vector<double> time_interleaved(const Group& world, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> times(fns.size());
  for (const auto& fn : fns) fn();  // warm-up: plans, caches, first-touch pages
  for (int rep = 0; rep < kReps; ++rep) {
    for (size_t f = 0; f < fns.size(); ++f) {
      barrier(world);
      const auto t0 = std::chrono::steady_clock::now();
      fns[f]();
      Tensor mine = Tensor::full({1}, seconds_since(t0), DType::F64);
      times[f].push_back(all_reduce(world, mine, ReduceOp::Max).item<double>());
    }
  }
  std::vector<double> medians;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

// The same collectives as the plan, issued directly on tensors of the plan's sizes.
void run_bare_collectives(const DeviceMesh& mesh, const RedistributePlan& plan, const DistTensor& source) {
  Tensor local = source.to_local();
  for (const RedistributeStep& step : plan.steps) {
    if (step.collective == "all_gather") {
      local = all_gather(mesh.group(step.mesh_dim), local, step.before[step.mesh_dim].dim());
    } else if (step.collective == "all_reduce") {
      local = all_reduce(mesh.group(step.mesh_dim), local);
    } else if (step.collective == "reduce_scatter") {
      local = reduce_scatter(mesh.group(step.mesh_dim), local, ReduceOp::Sum, step.after[step.mesh_dim].dim());
    } else if (step.collective == "all_to_all") {
      local = all_to_all(mesh.group(step.mesh_dim), local.reshape({-1}));
    } else if (step.collective == "send") {
      // One exchange of the same number of bytes with the peer across the diagonal.
      const int peer = static_cast<int>(mesh.size() - 1 - mesh.linear_index());
      Tensor out = Tensor::empty({local.numel()}, local.dtype());
      if (peer != mesh.linear_index()) {
        batch_send_recv(mesh.group(), {P2POp::send(local.reshape({-1}), peer), P2POp::recv(out, peer)});
      }
    }
  }
}

void BM_Redistribute(benchmark::State& state) {
  const Transition& t = transitions()[state.range(0)];
  const Tensor full = Tensor::randn(kShape, 1);
  double planned_s = 0, bare_s = 0, naive_s = 0, predicted_s = 0;
  int64_t planned_bytes = 0, naive_bytes = 0;
  for (auto _ : state) {
    launch(kRanks, [&](Group world) {
      DeviceMesh mesh(world, {2, 2}, {"a", "b"});
      const DistTensor source = distribute(full, mesh, t.from);
      const RedistributePlan plan = explain_redistribute(t.from, t.to, kShape, mesh);
      const RedistributePlan naive = explain_redistribute(t.from, {Replicate(), Replicate()}, kShape, mesh);
      const std::vector<double> times = time_interleaved(
          world, {[&] { benchmark::DoNotOptimize(source.redistribute(t.to).to_local().data_ptr()); },
                  [&] { run_bare_collectives(mesh, plan, source); },
                  [&] {
                    const Tensor everything = source.full_tensor();
                    benchmark::DoNotOptimize(distribute(everything, mesh, t.to).to_local().data_ptr());
                  }});
      const double planned = times[0], bare = times[1], gathered = times[2];
      if (world.rank() == 0) {
        planned_s = planned;
        bare_s = bare;
        naive_s = gathered;
        predicted_s = plan.predicted_seconds;
        planned_bytes = plan.bytes_sent();
        naive_bytes = naive.bytes_sent();
      }
    });
    state.SetIterationTime(planned_s);
  }
  state.counters["planned_ms"] = planned_s * 1e3;
  state.counters["collective_ms"] = bare_s * 1e3;
  state.counters["naive_ms"] = naive_s * 1e3;
  state.counters["vs_collective"] = bare_s > 0 ? planned_s / bare_s : 0;
  state.counters["predicted_ms"] = predicted_s * 1e3;
  state.counters["model_error"] = planned_s > 0 ? (predicted_s - planned_s) / planned_s : 0;
  state.counters["MiB_sent"] = planned_bytes / 1048576.0;
  state.counters["naive_MiB_sent"] = naive_bytes / 1048576.0;
  state.SetLabel(t.name);
}

// Replicate -> Shard(d) of the 64 MiB tensor on a 1-D mesh of 2 ranks: S(0) is a view
// of the replicated buffer (chunk.cpp), S(1) a strided piece that is copied; the
// third figure is a memcpy of one rank's 32 MiB piece, what a copying chunk costs.
void BM_ReplicateToShard(benchmark::State& state) {
  const Tensor full = Tensor::randn(kShape, 1);
  double view_s = 0, copy_s = 0, memcpy_s = 0;
  for (auto _ : state) {
    launch(2, [&](Group world) {
      DeviceMesh mesh(world, {2}, {"a"});
      const DistTensor source = distribute(full, mesh, {Replicate()});
      Tensor piece = Tensor::empty({kShape[0] / 2, kShape[1]});
      const std::vector<double> times = time_interleaved(
          world, {[&] { benchmark::DoNotOptimize(source.redistribute({Shard(0)}).to_local().data_ptr()); },
                  [&] { benchmark::DoNotOptimize(source.redistribute({Shard(1)}).to_local().data_ptr()); },
                  [&] { piece.copy_(source.to_local().narrow(0, 0, kShape[0] / 2)); }});
      if (world.rank() == 0) {
        view_s = times[0];
        copy_s = times[1];
        memcpy_s = times[2];
      }
    });
    state.SetIterationTime(view_s);
  }
  state.counters["R_to_S0_ms"] = view_s * 1e3;
  state.counters["R_to_S1_ms"] = copy_s * 1e3;
  state.counters["memcpy_32MiB_ms"] = memcpy_s * 1e3;
}

}  // namespace

BENCHMARK(BM_Redistribute)->DenseRange(0, 7)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReplicateToShard)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
