// The host optimizer step at memory speed: AdamW over N F32 parameters (one flat
// tensor) through the Optimizer API, against the memory-bandwidth limit measured in
// the same run. A step reads the parameter, gradient, exp_avg and exp_avg_sq and
// writes three of them back: 28 bytes per parameter. The limit is a memcpy of 14 bytes
// per parameter (14 read + 14 written), split over the same threads (the library's
// CPU pool): the faster of libc's memcpy and the library's vectorised copy. A copy
// also reads its destination for ownership, so the step's own access pattern without
// the arithmetic (stream_bandwidth) is measured too: that is the limit proper. Target (issue 29): the step at >= 80% of
// that bandwidth, and ahead of PyTorch's CPU AdamW (bench/peers/torch_adamw_peer.py: default, foreach and fused, run
// alternately with this program).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "backend/cpu/parallel.h"
#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

constexpr int kRounds = 5;

template <class Fn>
double best_seconds(Fn&& fn) {
  fn();  // warm-up: pages touched, the pool started
  double best = 1e30;
  for (int r = 0; r < kRounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Bytes per second (read + written) of the faster of two copies of `bytes`, each
// split over the pool: libc's memcpy per chunk, and the library's vectorised copy
// (Tensor::copy_). On a virtual machine either can be the faster one.
double copy_bandwidth(int64_t bytes) {
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 0);
  const double by_memcpy = best_seconds([&] {
    backend::cpu::parallel_for(bytes, int64_t{1} << 20, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data() + b, src.data() + b, static_cast<size_t>(e - b));
    });
  });
  benchmark::DoNotOptimize(dst.data());
  const Tensor from = Tensor::ones({bytes / 4}), to = Tensor::zeros({bytes / 4});
  const double by_copy = best_seconds([&] { Tensor(to).copy_(from); });
  return 2.0 * static_cast<double>(bytes) / std::min(by_memcpy, by_copy);
}

// Bytes per second of AdamW's access pattern without its arithmetic: four F32 streams
// read, three of them written in place (p += g, m += g, v += g). Unlike a copy, whose
// destination lines are read for ownership before they are written, this moves exactly
// AdamW's 28 bytes per parameter: the bandwidth limit of the step.
double stream_bandwidth(int64_t n) {
  std::vector<float> p(static_cast<size_t>(n), 1), g(static_cast<size_t>(n), 1e-3f), m(static_cast<size_t>(n), 0),
      v(static_cast<size_t>(n), 0);
  const double s = best_seconds([&] {
    backend::cpu::parallel_for(n, int64_t{1} << 15, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        p[i] += g[i];
        m[i] += g[i];
        v[i] += g[i];
      }
    });
  });
  benchmark::DoNotOptimize(p.data());
  return 28.0 * static_cast<double>(n) / s;
}

void BM_AdamWStep(benchmark::State& state) {
  const int64_t n = state.range(0) * 1000000;
  double step_s = 0, limit = 0, stream = 0;
  for (auto _ : state) {
    launch(1, [&](Group world) {
      DeviceMesh mesh(world, {1});
      DistTensor p = distribute(Tensor::randn({n}, 1), mesh, {Replicate()}).set_requires_grad();
      p.set_grad(distribute(Tensor::randn({n}, 2), mesh, {Replicate()}));
      AdamW optimizer({p}, AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
      step_s = best_seconds([&] { optimizer.step(); });
      limit = copy_bandwidth(14 * n);
      stream = stream_bandwidth(n);
    });
    state.SetIterationTime(step_s);
  }
  const double bandwidth = 28.0 * static_cast<double>(n) / step_s;
  state.counters["step_ms"] = step_s * 1e3;
  state.counters["GB_per_s"] = bandwidth / 1e9;
  state.counters["copy_GB_per_s"] = limit / 1e9;
  state.counters["of_copy"] = bandwidth / limit;
  state.counters["stream_GB_per_s"] = stream / 1e9;
  state.counters["of_stream"] = bandwidth / stream;
  state.counters["ns_per_param"] = step_s / static_cast<double>(n) * 1e9;
}

}  // namespace

// Millions of parameters: 100M is the size (1.6 GB of state and gradient).
BENCHMARK(BM_AdamWStep)->Arg(10)->Arg(100)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
