// Elementwise throughput on 16M elements against memcpy of the same buffers, measured
// in the same run. Bytes count every byte read or written once: add moves 3 x 4 x 16M
// (two reads, one write), memcpy 2 x 4 x 16M (one read, one write), so both
// bytes_per_second figures are memory traffic and compare directly. The kernels use
// the rank's threads (all cores here); BM_MemcpyThreads is memcpy split the same way,
// the ceiling they are held to (target: softmax, GELU, layer norm on [4096, 4096]
// >= 50% of it), BM_Memcpy the single-thread figure of earlier runs.
#include <benchmark/benchmark.h>

#include <cstring>

#include "backend/cpu/parallel.h"
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

void BM_MemcpyThreads(benchmark::State& state) {
  Tensor src = Tensor::rand({kElements}, 1), dst = Tensor::zeros({kElements});
  auto* s = static_cast<const char*>(src.data_ptr());
  auto* d = static_cast<char*>(dst.data_ptr());
  for (auto _ : state) {
    dtensor::backend::cpu::parallel_for(kBytes, int64_t{1} << 20, [&](int64_t b, int64_t e) {
      std::memcpy(d + b, s + b, static_cast<size_t>(e - b));
    });
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

// Softmax over the last dim of [4096, 4096] (rows of a vocabulary-sized logit block);
// range(0) = 1 for BF16.
dtensor::DType dtype_arg(const benchmark::State& state) {
  return state.range(0) ? dtensor::DType::BF16 : dtensor::DType::F32;
}
int64_t bytes_of(const benchmark::State& state) { return kElements * (state.range(0) ? 2 : 4); }

void BM_SoftmaxRows(benchmark::State& state) {
  Tensor a = Tensor::randn({4096, 4096}, 1).to(dtype_arg(state));
  Tensor out = Tensor::zeros({4096, 4096}, dtype_arg(state));
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.softmax(a, 1, false, out);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * bytes_of(state));
}

// tanh-GELU, the MLP activation of train_gpt.
void BM_GeluTanh(benchmark::State& state) {
  Tensor a = Tensor::randn({4096, 4096}, 1).to(dtype_arg(state));
  Tensor out = Tensor::zeros({4096, 4096}, dtype_arg(state));
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.unary(dtensor::UnaryOp::GeluTanh, a, out);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * bytes_of(state));
}

// Its backward: reads grad_out and x, writes grad_in.
void BM_GeluTanhBackward(benchmark::State& state) {
  Tensor x = Tensor::randn({4096, 4096}, 1).to(dtype_arg(state));
  Tensor g = Tensor::randn({4096, 4096}, 2).to(dtype_arg(state));
  Tensor out = Tensor::zeros({4096, 4096}, dtype_arg(state));
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.gelu_backward(g, x, dtensor::GeluApprox::Tanh, out);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 3 * bytes_of(state));
}

// Layer norm over rows of 4096 with weight and bias.
void BM_LayerNorm(benchmark::State& state) {
  const dtensor::DType t = dtype_arg(state);
  Tensor x = Tensor::randn({4096, 4096}, 1).to(t), out = Tensor::zeros({4096, 4096}, t);
  Tensor w = Tensor::ones({4096}, t), b = Tensor::zeros({4096}, t);
  Tensor mean = Tensor::zeros({4096}), rstd = Tensor::zeros({4096});
  auto& kernels = dtensor::backend::kernels_for(dtensor::Device::cpu());
  for (auto _ : state) {
    kernels.layer_norm(x, w, b, 1e-5, out, mean, rstd);
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * bytes_of(state));
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MemcpyThreads)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AddKernel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AddOp)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AddScalarKernel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ReluKernel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Sum)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SoftmaxRows)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GeluTanh)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GeluTanhBackward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LayerNorm)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
