// Whole-step planning (dtensor/step_plan.h) on the models of issue 33: the MLP and the
// GPT whose weights are placed as Megatron places them, with no redistribute in their
// code. Per layout, in one run: the communication of a step under greedy dispatch,
// under the plan (a replayed step) and under Megatron's pattern (the same model with
// the tensor-parallel styles), as bytes on the wire per rank (ring bus factors) and
// collective calls; the planning time of the recorded step (target < 1 s) and the
// wall time of a greedy and a replayed step (replay has no planning cost).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

double wire_bytes(const CommDebugMode& comm, int64_t n) {
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return 2 * f * static_cast<double>(comm.bytes("all_reduce")) +
         f * static_cast<double>(comm.bytes("reduce_scatter") + comm.bytes("all_to_all")) +
         static_cast<double>(n - 1) * static_cast<double>(comm.bytes("all_gather"));
}

struct Measured {
  double wire = 0;
  int64_t calls = 0;
  double step_ms = 0;  // the median of the timed steps
  StepPlanReport recorded;
};

// Runs `steps` steps of `step_fn` (one forward, backward and gradient sync), under a
// planner when `plan`; the last step's communication and the median step time.
template <class StepFn>
Measured measure(const DeviceMesh& mesh, bool plan, int steps, StepFn&& step_fn) {
  Measured m;
  StepPlanner planner;
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    CommDebugMode comm;
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::optional<PlannedStep> scope;
      if (plan) scope.emplace(planner);
      step_fn();
    }
    if (s > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (s == 0 && plan) m.recorded = planner.last_report();
    m.wire = wire_bytes(comm, mesh.size(mesh.ndim() - 1));
    m.calls = comm.total_count();
  }
  std::sort(ms.begin(), ms.end());
  m.step_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  return m;
}

void gradients_home(const std::vector<std::pair<std::string, DistTensor>>& params) {
  for (const auto& [name, p] : params) {
    if (p.grad().defined()) p.set_grad(p.grad().redistribute(p.placements()));
  }
}

void report(benchmark::State& state, const Measured& megatron, const Measured& greedy, const Measured& planned) {
  state.counters["megatron_KB"] = megatron.wire / 1e3;
  state.counters["greedy_KB"] = greedy.wire / 1e3;
  state.counters["planned_KB"] = planned.wire / 1e3;
  state.counters["planned_vs_megatron"] = planned.wire / megatron.wire;
  state.counters["megatron_calls"] = static_cast<double>(megatron.calls);
  state.counters["greedy_calls"] = static_cast<double>(greedy.calls);
  state.counters["planned_calls"] = static_cast<double>(planned.calls);
  state.counters["ops"] = static_cast<double>(planned.recorded.ops);
  state.counters["planning_ms"] = planned.recorded.planning_seconds * 1e3;
  state.counters["megatron_step_ms"] = megatron.step_ms;
  state.counters["greedy_step_ms"] = greedy.step_ms;
  state.counters["replay_step_ms"] = planned.step_ms;
}

std::vector<int64_t> mesh_shape(int64_t layout) {
  return layout == 0 ? std::vector<int64_t>{2} : layout == 1 ? std::vector<int64_t>{4} : std::vector<int64_t>{2, 2};
}

DeviceMesh make_mesh(const Group& world, const std::vector<int64_t>& shape) {
  return shape.size() == 2 ? DeviceMesh(world, shape, {"dp", "tp"}) : DeviceMesh(world, shape, {"tp"});
}

// The GPT of TensorParallel.CommunicationPerStepIsMegatronsAtTrainingSizes.
void BM_HandPlacedGpt(benchmark::State& state) {
  const std::vector<int64_t> shape = mesh_shape(state.range(0));
  models::GPTConfig config;
  config.vocab = 2048;
  config.block_size = 64;
  config.layers = 2;
  config.heads = 8;
  config.dim = 128;
  const int64_t batch = 16;
  for (auto _ : state) {
    launch(static_cast<int>(shape_numel(shape)), [&](Group world) {
      const DeviceMesh mesh = make_mesh(world, shape);
      const DeviceMesh tp = mesh.ndim() == 2 ? mesh["tp"] : mesh;
      SyntheticLanguage data(config.vocab, config.block_size, batch, 3);
      std::vector<int64_t> indices(static_cast<size_t>(batch));
      std::iota(indices.begin(), indices.end(), 0);
      const TokenBatch tokens = data.get_batch(indices);
      const Placements rows = mesh.ndim() == 2 ? Placements{Shard(0), Replicate()} : Placements{Replicate()};
      const DistTensor ids = distribute(tokens.inputs, mesh, rows), targets = distribute(tokens.targets, mesh, rows);
      models::GPT styled(mesh, config, 1), placed(mesh, config, 1);
      parallel::parallelize_module(styled, tp, models::gpt_tp_plan(config));
      for (const auto& [name, p] : styled.named_parameters()) {
        placed.set_parameter(name, distribute(p.full_tensor(), mesh, p.placements()).set_requires_grad());
      }
      auto step_of = [&](models::GPT& model) {
        return [&] {
          model.loss(ids, targets).backward();
          gradients_home(model.named_parameters());
          model.zero_grad();
        };
      };
      const Measured megatron = measure(mesh, false, 5, step_of(styled));
      const Measured greedy = measure(mesh, false, 5, step_of(placed));
      const Measured planned = measure(mesh, true, 5, step_of(placed));
      if (world.rank() == 0) report(state, megatron, greedy, planned);
    });
  }
}

// The MLP: [16, 8] -> 32 -> 8, MSE; Megatron's step is one all-reduce.
void BM_HandPlacedMlp(benchmark::State& state) {
  const std::vector<int64_t> shape = mesh_shape(state.range(0));
  for (auto _ : state) {
    launch(static_cast<int>(shape_numel(shape)), [&](Group world) {
      const DeviceMesh mesh = make_mesh(world, shape);
      const DeviceMesh tp = mesh.ndim() == 2 ? mesh["tp"] : mesh;
      const bool two_d = mesh.ndim() == 2;
      const Placements rows = two_d ? Placements{Shard(0), Replicate()} : Placements{Replicate()};
      const DistTensor x = distribute(Tensor::randn({16, 8}, 1), mesh, rows);
      const DistTensor t = distribute(Tensor::randn({16, 8}, 2), mesh, rows);
      nn::MLP styled(mesh, 8, 32, nn::Activation::Gelu, true, 3, 0.02),
          placed(mesh, 8, 32, nn::Activation::Gelu, true, 3, 0.02);
      parallel::parallelize_module(styled, tp,
                                   {{"up", parallel::ColwiseParallel{}}, {"down", parallel::RowwiseParallel{}}});
      for (const auto& [name, p] : styled.named_parameters()) {
        placed.set_parameter(name, distribute(p.full_tensor(), mesh, p.placements()).set_requires_grad());
      }
      auto step_of = [&](nn::Module& model) {
        return [&] {
          mean(square(model.forward(x) - t)).backward();
          gradients_home(model.named_parameters());
          model.zero_grad();
        };
      };
      const Measured megatron = measure(mesh, false, 5, step_of(styled));
      const Measured greedy = measure(mesh, false, 5, step_of(placed));
      const Measured planned = measure(mesh, true, 5, step_of(placed));
      if (world.rank() == 0) report(state, megatron, greedy, planned);
    });
  }
}

}  // namespace

// Arg: 0 tp=2, 1 tp=4, 2 dp=2 x tp=2.
BENCHMARK(BM_HandPlacedMlp)->DenseRange(0, 2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HandPlacedGpt)->DenseRange(0, 2)->Iterations(1)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
