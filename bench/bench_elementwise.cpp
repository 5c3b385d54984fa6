// Elementwise throughput on 16M floats against memcpy of the same buffers, measured in
// the same run. Bytes count every byte read or written once: add moves 3 x 4 x 16M
// (two reads, one write), memcpy 2 x 4 x 16M (one read, one write), so both
// bytes_per_second figures are memory traffic and compare directly.
#include <benchmark/benchmark.h>

#include <cstring>

#include "backend/kernels.h"
#include "dtensor/tensor_ops.h"

namespace {

using dtensor::Tensor;
constexpr int64_t kElements = int64_t{1} << 24;  // 16M
constexpr int64_t kBytes = kElements * 4;

void set_traffic(benchmark::State& state, int64_t bytes_per_iteration) {
  state.SetBytesProcessed(state.iterations() * bytes_per_iteration);
}

void BM_Memcpy(benchmark::State& state) {
  Tensor src = Tensor::rand({kElements}, 1), dst = Tensor::zeros({kElements});
  for (auto _ : state) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), kBytes);
    benchmark::DoNotOptimize(dst.data_ptr());
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * kBytes);
}

// The kernel alone into a preallocated output: the figure to hold against memcpy.
void BM_AddKernel(benchmark::State& state) {
  Tensor a = Tensor::rand({kElements}, 1), b = Tensor::rand({kElements}, 2);
  Tensor out = Tensor::zeros({kElements});
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.binary(dtensor::BinaryOp::Add, a, b, out);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 3 * kBytes);
}

// The public op: checks, a fresh 64 MB output per call (page faults included), kernel.
void BM_AddOp(benchmark::State& state) {
  Tensor a = Tensor::rand({kElements}, 1), b = Tensor::rand({kElements}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(dtensor::add(a, b).data_ptr());
  set_traffic(state, 3 * kBytes);
}

// a + scalar takes the broadcast-scalar loop.
void BM_AddScalarKernel(benchmark::State& state) {
  Tensor a = Tensor::rand({kElements}, 1), out = Tensor::zeros({kElements});
  Tensor s = Tensor::full({}, 2.0).expand({kElements});
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.binary(dtensor::BinaryOp::Add, a, s, out);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * kBytes);
}

void BM_ReluKernel(benchmark::State& state) {
  Tensor a = Tensor::randn({kElements}, 1), out = Tensor::zeros({kElements});
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.unary(dtensor::UnaryOp::Relu, a, out);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * kBytes);
}

void BM_Sum(benchmark::State& state) {
  Tensor a = Tensor::rand({kElements}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(dtensor::sum(a).data_ptr());
  set_traffic(state, kBytes);
}

// Softmax over the last dim of [4096, 4096] (rows of a vocabulary-sized logit block).
void BM_SoftmaxRows(benchmark::State& state) {
  Tensor a = Tensor::randn({4096, 4096}, 1), out = Tensor::zeros({4096, 4096});
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.softmax(a, 1, false, out);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * kBytes);
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AddKernel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AddOp)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AddScalarKernel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReluKernel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Sum)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SoftmaxRows)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
