// Tensor-parallel matmul on 2 ranks: [4096, 1024] @ [1024, 4096] column-parallel
// (weight S(1): each rank multiplies by its [1024, 2048] half) and row-parallel
// (input S(1), weight S(0): each rank [4096, 512] @ [512, 4096], output Partial).
// The GFLOP/s of the local shard through DistTensor matmul next to a direct
// cblas_sgemm on the same shapes, with both ranks running at once in both cases
// (target: >= 90%).
//
// Linear with a bias on one rank (BM_LinearBias/<shape>/<dtype>): linear(x, w, b)
// with the bias in the GEMM's epilogue, next to the composite it replaced,
// add(matmul(x, w^T), b), and to the GEMM alone, matmul(x, w^T) (the limit: a bias
// that costs nothing), alternating A B C for kRounds rounds in one process; each
// figure is the median over rounds of the best of kReps calls. Shapes of train_gpt's
// model (1024 tokens, dim 256): the attention's qkv, the MLP's up and down
// projections.
//
// Linear then GELU (BM_LinearGelu/<shape>/<dtype>, the MLP's up projection):
// linear_gelu(x, w, b) with the GELU in the bias epilogue's task, next to the two
// ops it replaced, gelu(linear(x, w, b)), and to linear alone (the limit: a GELU
// that costs only its math), alternating A B C in one process as above.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

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

constexpr int kRounds = 7;

template <class Fn>
double best_of_reps(Fn&& fn) {
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs a, b, c alternating for kRounds rounds (after two warm-up calls each: the
// GEMM route is tuned once) and returns each one's median of the best of kReps calls
// in seconds; the iteration time is a's.
template <class A, class B, class C>
std::array<double, 3> alternate(benchmark::State& state, A&& a, B&& b, C&& c) {
  for (int warm = 0; warm < 2; ++warm) a(), b(), c();
  std::vector<double> ta, tb, tc;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      ta.push_back(best_of_reps(a));
      tb.push_back(best_of_reps(b));
      tc.push_back(best_of_reps(c));
    }
    state.SetIterationTime(median(ta));
  }
  return {median(ta), median(tb), median(tc)};
}

// args: tokens, in features, out features, dtype (0 F32, 1 BF16).
struct LinearOperands {
  int64_t rows, k, n;
  Tensor x, w, b;
  explicit LinearOperands(const benchmark::State& state) : rows(state.range(0)), k(state.range(1)), n(state.range(2)) {
    const DType dtype = state.range(3) == 0 ? DType::F32 : DType::BF16;
    x = Tensor::randn({rows, k}, 1, dtype);
    w = Tensor::randn({n, k}, 2, dtype);
    b = Tensor::randn({n}, 3, dtype);
  }
};

void BM_LinearBias(benchmark::State& state) {
  const LinearOperands o(state);
  const auto [f, c, g] = alternate(
      state, [&] { benchmark::DoNotOptimize(linear(o.x, o.w, o.b).data_ptr()); },
      [&] { benchmark::DoNotOptimize(add(matmul(o.x, o.w.t()), o.b).data_ptr()); },
      [&] { benchmark::DoNotOptimize(matmul(o.x, o.w.t()).data_ptr()); });
  const double flops = 2.0 * o.rows * o.k * o.n;
  state.counters["fused_GFLOPs"] = flops / f / 1e9;
  state.counters["composite_GFLOPs"] = flops / c / 1e9;
  state.counters["gemm_only_GFLOPs"] = flops / g / 1e9;
  state.counters["fused_over_composite"] = c / f;
  state.counters["fused_over_gemm_only"] = g / f;
}

void BM_LinearGelu(benchmark::State& state) {
  const LinearOperands o(state);
  const auto [f, t, l] = alternate(
      state, [&] { benchmark::DoNotOptimize(linear_gelu(o.x, o.w, o.b, GeluApprox::Tanh).out.data_ptr()); },
      [&] { benchmark::DoNotOptimize(gelu(linear(o.x, o.w, o.b), GeluApprox::Tanh).data_ptr()); },
      [&] { benchmark::DoNotOptimize(linear(o.x, o.w, o.b).data_ptr()); });
  state.counters["fused_ms"] = f * 1e3;
  state.counters["two_ops_ms"] = t * 1e3;
  state.counters["linear_only_ms"] = l * 1e3;
  state.counters["fused_over_two_ops"] = t / f;
  state.counters["fused_over_linear_only"] = l / f;
}

}  // namespace

BENCHMARK(BM_LinearGelu)
    ->ArgNames({"tokens", "in", "out", "bf16"})
    ->ArgsProduct({{1024}, {256}, {1024}, {0, 1}})
    ->ArgsProduct({{4096}, {768}, {3072}, {0, 1}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearBias)
    ->ArgNames({"tokens", "in", "out", "bf16"})
    ->ArgsProduct({{1024}, {256}, {768}, {0, 1}})
    ->ArgsProduct({{1024}, {256}, {1024}, {0, 1}})
    ->ArgsProduct({{1024}, {1024}, {256}, {0, 1}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ColumnParallelMatmul)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RowParallelMatmul)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
