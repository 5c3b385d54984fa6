// matmul on Tensor vs a direct cblas_sgemm on the same buffers.
//
// Each iteration runs both, interleaved, so machine noise hits them alike; the
// reported `ratio` is tensor GFLOP/s over direct GFLOP/s (target >= 0.95).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void BM_MatmulVsSgemm(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  Tensor a = Tensor::randn({m, k}, 1), b = Tensor::randn({k, n}, 2);
  Tensor c = Tensor::empty({m, n});
  double tensor_s = 0, direct_s = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data<float>(), k,
                b.data<float>(), n, 0.0f, c.data<float>(), n);
    direct_s += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    Tensor out = matmul(a, b);
    benchmark::DoNotOptimize(out.data_ptr());
    const double t = seconds_since(t0);
    tensor_s += t;
    state.SetIterationTime(t);
  }
  const double flops = 2.0 * m * n * k * static_cast<double>(state.iterations());
  state.counters["tensor_GFLOPs"] = flops / tensor_s / 1e9;
  state.counters["direct_GFLOPs"] = flops / direct_s / 1e9;
  state.counters["ratio"] = direct_s / tensor_s;
}

// Transposed weight (x @ w^T, the Linear layout): BLAS Trans flag, no copy.
void BM_LinearVsSgemm(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  Tensor x = Tensor::randn({m, k}, 1), w = Tensor::randn({n, k}, 2);
  Tensor c = Tensor::empty({m, n});
  double tensor_s = 0, direct_s = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data<float>(), k,
                w.data<float>(), k, 0.0f, c.data<float>(), n);
    direct_s += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    Tensor out = linear(x, w);
    benchmark::DoNotOptimize(out.data_ptr());
    const double t = seconds_since(t0);
    tensor_s += t;
    state.SetIterationTime(t);
  }
  const double flops = 2.0 * m * n * k * static_cast<double>(state.iterations());
  state.counters["tensor_GFLOPs"] = flops / tensor_s / 1e9;
  state.counters["direct_GFLOPs"] = flops / direct_s / 1e9;
  state.counters["ratio"] = direct_s / tensor_s;
}

}  // namespace

BENCHMARK(BM_MatmulVsSgemm)
    ->Args({256, 256, 256})
    ->Args({512, 512, 512})
    ->Args({1024, 1024, 1024})
    ->Args({2048, 2048, 2048})
    ->Args({4096, 1024, 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearVsSgemm)->Args({4096, 1024, 1024})->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
