// Context parallel (issue 30).
// BM_RingAttention: one attention call (B 1, H 4, D 64, causal), forward and backward,
//   by the ring or the all-gather variant on cp ranks (the sequence in the load-balanced
//   order) against attention on the whole sequence on one rank (the op replicated: its
//   fused kernel).
// BM_ContextParallelGPT: one training step (forward, backward, gradient all-reduce) of
//   a GPT at a long sequence on cp ranks (parallelize_gpt over "cp"): the activation
//   memory per rank.
// Memory is each rank's peak above what it held before the call or step (activations,
// blocks in flight, gradients), the largest over the ranks. Ranks are threads of this
// process: at cp=4 on a 2-core machine they share the cores, so step times compare only
// where cp <= cores.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

// One measured step on each rank: `step` once to warm up, then `settle`, then one more
// between barriers. Rank 0's time, and the largest peak over the ranks above what each
// held before the measured step.
struct Measurement {
  std::mutex mu;
  double seconds = 0;
  int64_t peak = 0;
};
void measure(const Group& world, Measurement& m, const std::function<void()>& step,
             const std::function<void()>& settle = {}) {
  step();
  if (settle) settle();
  const int64_t before = memory_stats().live_bytes;
  reset_peak_memory();
  barrier(world);
  const auto t0 = std::chrono::steady_clock::now();
  step();
  barrier(world);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t mine = memory_stats().peak_bytes - before;
  const std::lock_guard<std::mutex> lock(m.mu);
  m.peak = std::max(m.peak, mine);
  if (world.rank() == 0) m.seconds = s;
}

void report(benchmark::State& state, const Measurement& m, int64_t tokens) {
  state.counters["step_ms"] = m.seconds * 1e3;
  state.counters["tokens_per_s"] = static_cast<double>(tokens) / m.seconds;
  state.counters["peak_MiB_per_rank"] = static_cast<double>(m.peak) / 1048576.0;
}

void BM_RingAttention(benchmark::State& state) {
  // 0: the scaled_dot_product_attention op on one rank; 1, 2, 4: context parallel on cp
  // ranks, by the ring (range 2 = 0) or the all-gather variant (1).
  const bool op = state.range(0) == 0;
  const int cp = std::max<int>(1, static_cast<int>(state.range(0)));
  const int64_t seq = state.range(1);
  const bool gather = state.range(2) == 1;
  const Shape shape{1, 4, seq, 64};
  Measurement m;
  for (auto _ : state) {
    m.peak = 0;
    launch(cp, [&](Group world) {
      DeviceMesh mesh(world, {cp}, {"cp"});
      // The op's baseline replicated: a sequence sharded even over one rank sends it to
      // its composite path (matmul, softmax, matmul), which materialises the scores.
      const Placements layout{op ? Placement(Replicate()) : Placement(Shard(2))};
      const DistTensor q = distribute(Tensor::randn(shape, 1), mesh, layout).set_requires_grad();
      const DistTensor k = distribute(Tensor::randn(shape, 2), mesh, layout).set_requires_grad();
      const DistTensor v = distribute(Tensor::randn(shape, 3), mesh, layout).set_requires_grad();
      auto step = [&] {
        const ContextParallelScope scope(
            {.load_balanced = true, .attention = gather ? ContextAttention::AllGather : ContextAttention::Ring});
        const DistTensor out = scaled_dot_product_attention(q, k, v, true);
        sum(out).backward();
      };
      measure(world, m, step, [&] {
        for (const DistTensor* t : {&q, &k, &v}) t->zero_grad();
      });
    });
    state.SetIterationTime(m.seconds);
  }
  state.SetLabel(op ? "one rank, scaled_dot_product_attention op"
                    : std::string(gather ? "all-gather" : "ring") + ", cp=" + std::to_string(cp) + ", load-balanced");
  report(state, m, seq);
}

void BM_ContextParallelGPT(benchmark::State& state) {
  const int cp = static_cast<int>(state.range(0));
  const int64_t seq = state.range(1);
  models::GPTConfig config;
  config.vocab = 64;
  config.block_size = seq;
  config.layers = 2;
  config.heads = 4;
  config.dim = 64;
  Measurement m;
  for (auto _ : state) {
    m.peak = 0;
    launch(cp, [&](Group world) {
      DeviceMesh mesh(world, {cp}, {"cp"});
      auto gpt = models::parallelize_gpt(mesh, config, 7);
      const ContextParallelScope scope(gpt->context_parallel());
      const SyntheticLanguage data(config.vocab, seq, 4, 3);
      const TokenBatch batch = data.get_batch({0});
      const DistTensor ids = gpt->distribute_batch(batch.inputs), targets = gpt->distribute_batch(batch.targets);
      auto step = [&] {
        gpt->model()->loss(ids, targets).backward();
        gpt->sync()->finish_gradient_sync();
      };
      measure(world, m, step);  // after the warm-up the gradients exist
    });
    state.SetIterationTime(m.seconds);
  }
  state.SetLabel("GPT 2 layers dim 64, one step, cp=" + std::to_string(cp));
  report(state, m, seq);
}

}  // namespace

BENCHMARK(BM_RingAttention)
    ->ArgsProduct({{0}, {2048, 4096, 8192}, {0}})
    ->ArgsProduct({{1, 2, 4}, {2048, 4096, 8192}, {0, 1}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_ContextParallelGPT)
    ->ArgsProduct({{1, 2, 4}, {4096}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
