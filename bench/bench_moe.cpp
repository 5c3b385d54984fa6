// Mixture of experts (issue 30): a GPT training step (forward, backward, gradient
// all-reduce) whose blocks' MLPs are MoE layers (8 experts, top-2, hidden H each),
// against the dense GPT of equal active parameters (MLP hidden 2H: each token passes
// through two experts' worth of weights), on one rank and with the experts over ep=2
// ranks (threads). Tokens/s of the step and the MoE layers' share of it; the routing,
// permutation and all-to-alls are what the MoE adds beyond the dense GEMMs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

// range(0): 0 dense, 1 MoE; range(1): ranks (ep for the MoE, dp for the dense model).
void BM_MoEStep(benchmark::State& state) {
  const bool moe = state.range(0) == 1;
  const int ranks = static_cast<int>(state.range(1));
  models::GPTConfig config;
  config.vocab = 256;
  config.block_size = 128;
  config.layers = 2;
  config.heads = 4;
  config.dim = 128;
  const int64_t hidden = 256, batch = 8;
  if (moe) {
    config.moe_experts = 8;
    config.moe_top_k = 2;
    config.moe_hidden = hidden;
    config.mlp_hidden = hidden;
  } else {
    config.mlp_hidden = 2 * hidden;
  }
  double seconds = 0;
  for (auto _ : state) {
    launch(ranks, [&](Group world) {
      DeviceMesh mesh(world, {ranks}, {moe ? "ep" : "dp"});
      auto gpt = models::parallelize_gpt(mesh, config, 7);
      const SyntheticLanguage data(config.vocab, config.block_size, batch, 3);
      std::vector<int64_t> rows(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i) rows[static_cast<size_t>(i)] = i;
      const TokenBatch b = data.get_batch(rows);
      const DistTensor ids = gpt->distribute_batch(b.inputs), targets = gpt->distribute_batch(b.targets);
      auto step = [&] {
        gpt->model()->loss(ids, targets).backward();
        gpt->sync()->finish_gradient_sync();
        for (const DistTensor& p : gpt->parameters()) p.zero_grad();
      };
      step();  // warm-up
      barrier(world);
      const auto t0 = std::chrono::steady_clock::now();
      constexpr int kSteps = 3;
      for (int i = 0; i < kSteps; ++i) step();
      barrier(world);
      if (world.rank() == 0) {
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSteps;
      }
    });
    state.SetIterationTime(seconds);
  }
  state.SetLabel(std::string(moe ? "MoE 8 experts top-2, ep=" : "dense, equal active params, dp=") +
                 std::to_string(ranks));
  state.counters["step_ms"] = seconds * 1e3;
  state.counters["tokens_per_s"] = static_cast<double>(batch * config.block_size) / seconds;
}

}  // namespace

BENCHMARK(BM_MoEStep)->ArgsProduct({{0, 1}, {1, 2}})->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
