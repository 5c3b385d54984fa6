// Tensor-parallel matmul on 2 ranks: [4096, 1024] @ [1024, 4096] column-parallel
// (weight S(1): each rank multiplies by its [1024, 2048] half) and row-parallel
// (input S(1), weight S(0): each rank [4096, 512] @ [512, 4096], output Partial).
// The GFLOP/s of the local shard through DistTensor matmul next to a direct
// cblas_sgemm on the same shapes, with both ranks running at once in both cases
// (target: >= 90%).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

constexpr int kReps = 3;

template <class Fn>
double best_seconds(const Group& world, Fn&& fn) {
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    barrier(world);
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double local = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The slowest rank decides, as in a real step.
    best = std::min(best, all_reduce(world, Tensor::full({1}, local, DType::F64), ReduceOp::Max).item<double>());
  }
  return best;
}

void run(benchmark::State& state, bool column_parallel) {
  const int64_t m = 4096, k = 1024, n = 4096;
  double dist_s = 0, direct_s = 0;
  for (auto _ : state) {
    launch(2, [&](Group world) {
      DeviceMesh mesh(world, {2}, {"tp"});
      const Placements x_layout = column_parallel ? Placements{Replicate()} : Placements{Shard(1)};
      const Placements w_layout = column_parallel ? Placements{Shard(1)} : Placements{Shard(0)};
      const DistTensor x = randn({m, k}, mesh, x_layout, 1);
      const DistTensor w = randn({k, n}, mesh, w_layout, 2);
      const Tensor& xl = x.to_local();
      const Tensor& wl = w.to_local();
      Tensor out = Tensor::empty({xl.size(0), wl.size(1)});
      const double direct = best_seconds(world, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, xl.size(0), wl.size(1), xl.size(1), 1.0f,
                    xl.data<float>(), xl.size(1), wl.data<float>(), wl.size(1), 0.0f, out.data<float>(), wl.size(1));
      });
      const double dist = best_seconds(world, [&] {
        const DistTensor y = matmul(x, w);
        benchmark::DoNotOptimize(y.to_local().data_ptr());
      });
      if (world.rank() == 0) {
        direct_s = direct;
        dist_s = dist;
      }
    });
    state.SetIterationTime(dist_s);
  }
  const double flops_per_rank = 2.0 * m * k * n / 2;  // each rank does half the work
  state.counters["dist_GFLOPs_per_rank"] = flops_per_rank / dist_s / 1e9;
  state.counters["direct_GFLOPs_per_rank"] = flops_per_rank / direct_s / 1e9;
  state.counters["ratio"] = direct_s / dist_s;
}

void BM_ColumnParallelMatmul(benchmark::State& state) { run(state, true); }
void BM_RowParallelMatmul(benchmark::State& state) { run(state, false); }

}  // namespace

BENCHMARK(BM_ColumnParallelMatmul)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RowParallelMatmul)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
