// Context parallel (issue 30): ring attention's step time and memory per rank against
// attention on the whole sequence on one rank (ring attention with cp=1, the same
// fused local kernels, and the scaled_dot_product_attention op), at long sequences. One attention call
// (B 1, H 4, D 64, causal), forward and backward; cp ranks split the sequence in the
// load-balanced order. Memory is each rank's peak above what it held before the call
// (the activations, the blocks in flight and the gradients), the largest over the ranks.
// Ranks are threads of this process: at cp=4 on a 2-core machine they share the cores,
// so the step time compares only where cp <= cores.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

void BM_RingAttention(benchmark::State& state) {
  // 0: the scaled_dot_product_attention op on one rank; 1, 2, 4: ring attention on cp ranks.
  const bool op = state.range(0) == 0;
  const int cp = std::max<int>(1, static_cast<int>(state.range(0)));
  const int64_t seq = state.range(1);
  const Shape shape{1, 4, seq, 64};
  double seconds = 0;
  int64_t peak = 0;
  for (auto _ : state) {
    std::mutex mu;
    peak = 0;
    launch(cp, [&](Group world) {
      DeviceMesh mesh(world, {cp}, {"cp"});
      // The op's baseline replicated: a sequence sharded even over one rank sends it to
      // its composite path (matmul, softmax, matmul), which materialises the scores.
      const Placements layout{op ? Placement(Replicate()) : Placement(Shard(2))};
      const DistTensor q = distribute(Tensor::randn(shape, 1), mesh, layout).set_requires_grad();
      const DistTensor k = distribute(Tensor::randn(shape, 2), mesh, layout).set_requires_grad();
      const DistTensor v = distribute(Tensor::randn(shape, 3), mesh, layout).set_requires_grad();
      auto step = [&] {
        const DistTensor out = op ? scaled_dot_product_attention(q, k, v, true)
                                  : parallel::ring_attention(q, k, v, "cp", {.causal = true, .load_balanced = true});
        sum(out).backward();
      };
      step();  // warm-up
      for (const DistTensor* t : {&q, &k, &v}) t->zero_grad();
      const int64_t before = memory_stats().live_bytes;
      reset_peak_memory();
      barrier(world);
      const auto t0 = std::chrono::steady_clock::now();
      step();
      barrier(world);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const int64_t mine = memory_stats().peak_bytes - before;
      const std::lock_guard<std::mutex> lock(mu);
      peak = std::max(peak, mine);
      if (world.rank() == 0) seconds = s;
    });
    state.SetIterationTime(seconds);
  }
  state.SetLabel(op ? "one rank, scaled_dot_product_attention op"
                    : "ring, cp=" + std::to_string(cp) + ", load-balanced");
  state.counters["step_ms"] = seconds * 1e3;
  state.counters["tokens_per_s"] = static_cast<double>(seq) / seconds;
  state.counters["peak_MiB_per_rank"] = static_cast<double>(peak) / 1048576.0;
}

}  // namespace

BENCHMARK(BM_RingAttention)
    ->Args({0, 2048})
    ->Args({1, 2048})
    ->Args({2, 2048})
    ->Args({4, 2048})
    ->Args({0, 4096})
    ->Args({1, 4096})
    ->Args({2, 4096})
    ->Args({4, 4096})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
