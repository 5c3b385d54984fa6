// Dispatch overhead: tiny ops on DistTensors (a 1-D mesh of 2, strategies cached)
// next to the same ops on local Tensors, in the same run and threads. The reported
// `overhead_us` is the extra time per op (target <= 3 us; PyTorch DTensor ~90 us).
#include <benchmark/benchmark.h>

#include <chrono>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

constexpr int kIters = 20000;

template <class Fn>
double us_per_call(Fn&& fn) {
  for (int i = 0; i < 200; ++i) fn();  // warm-up: caches, allocator
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kIters; ++i) fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kIters;
}

void run(benchmark::State& state, const Shape& a_shape, const Shape& b_shape, bool use_matmul) {
  double local_us = 0, dist_us = 0;
  for (auto _ : state) {
    launch(2, [&](Group world) {
      DeviceMesh mesh(world, {2});
      const Tensor a = Tensor::randn(a_shape, 1), b = Tensor::randn(b_shape, 2);
      // Replicated operands: the strategy keeps them as they are (no communication),
      // so what is measured is dispatch, not collectives.
      const DistTensor da = distribute(a, mesh, {Replicate()}), db = distribute(b, mesh, {Replicate()});
      const double l = us_per_call([&] { benchmark::DoNotOptimize(use_matmul ? matmul(a, b) : add(a, b)); });
      const double d = us_per_call([&] { benchmark::DoNotOptimize(use_matmul ? matmul(da, db) : add(da, db)); });
      if (world.rank() == 0) {
        local_us = l;
        dist_us = d;
      }
    });
    state.SetIterationTime(dist_us * 1e-6);
  }
  state.counters["local_us"] = local_us;
  state.counters["dist_us"] = dist_us;
  state.counters["overhead_us"] = dist_us - local_us;
}

void BM_AddTiny(benchmark::State& state) { run(state, {8}, {8}, false); }
void BM_Matmul4x4(benchmark::State& state) { run(state, {4, 4}, {4, 4}, true); }

}  // namespace

BENCHMARK(BM_AddTiny)->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Matmul4x4)->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
