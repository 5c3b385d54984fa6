// GPT training throughput on this machine: tokens/s and peak memory per rank.
//
// Each row trains a few steps (after warm-up) of the train_gpt model with the same
// total number of cores: 1 rank uses all BLAS threads, 2 ranks one each (launch
// sets that). Compared in the same run: 1 rank vs DP=2 (target: DP=2 >= 90% of
// the 1-rank tokens/s), DDP overlap on vs off (one bucket filled last), FP32 vs
// BF16, and activation checkpointing off vs on.
#include <benchmark/benchmark.h>

#include <chrono>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

struct Case {
  const char* name;
  bool medium;
  int ranks;
  bool overlap;
  DType compute;
  bool checkpoint;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> list = {
      {"small 1 rank", false, 1, true, DType::F32, false},
      {"small dp=2", false, 2, true, DType::F32, false},
      {"small dp=2 no overlap", false, 2, false, DType::F32, false},
      {"small dp=2 bf16", false, 2, true, DType::BF16, false},
      {"small dp=2 checkpointing", false, 2, true, DType::F32, true},
      {"medium 1 rank", true, 1, true, DType::F32, false},
      {"medium dp=2", true, 2, true, DType::F32, false},
      {"medium dp=2 no overlap", true, 2, false, DType::F32, false},
      {"medium dp=2 bf16", true, 2, true, DType::BF16, false},
      {"medium dp=2 checkpointing", true, 2, true, DType::F32, true},
  };
  return list;
}

constexpr int kWarmup = 2, kSteps = 6;

void BM_TrainGpt(benchmark::State& state) {
  const Case& c = cases()[state.range(0)];
  nn::GPTConfig config;
  config.vocab = 64;
  config.block_size = c.medium ? 64 : 32;
  config.layers = c.medium ? 4 : 2;
  config.dim = c.medium ? 128 : 64;
  config.heads = c.medium ? 8 : 4;
  config.checkpoint_activations = c.checkpoint;
  const int64_t batch = 16;
  double seconds = 0;
  int64_t peak = 0;
  for (auto _ : state) {
    launch(c.ranks, [&](Group world) {
      DeviceMesh mesh(world, {c.ranks}, {"dp"});
      SyntheticLanguage data(config.vocab, config.block_size, 1024, 1);
      DistributedSampler sampler(data.size(), batch, mesh.coordinate(0), c.ranks, 1);
      nn::GPT model(mesh, config, 1);
      parallel::DistributedDataParallel ddp(model, {.bucket_cap_mb = c.overlap ? 1.0 : 1e6});
      AdamW optimizer(model.parameters(), 1e-3);
      double elapsed = 0;
      for (int step = 0; step < kWarmup + kSteps; ++step) {
        if (step == kWarmup) reset_peak_memory();
        barrier(world);
        const auto t0 = std::chrono::steady_clock::now();
        const TokenBatch b = data.get_batch(sampler.batch_at(step));
        const Shape shape{batch, config.block_size};
        const DistTensor ids = DistTensor::from_local(b.inputs, mesh, {Shard(0)}, shape);
        const DistTensor targets = DistTensor::from_local(b.targets, mesh, {Shard(0)}, shape);
        DistTensor loss;
        {
          std::optional<nn::ComputeDtype> precision;
          if (c.compute != DType::F32) precision.emplace(c.compute);
          loss = model.loss(ids, targets);
        }
        loss.backward();
        ddp.wait_for_gradients();
        optimizer.step();
        optimizer.zero_grad();
        if (step >= kWarmup) elapsed += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      const double slowest = all_reduce(world, Tensor::full({1}, elapsed, DType::F64), ReduceOp::Max).item<double>();
      const double worst_peak = all_reduce(world, Tensor::full({1}, static_cast<double>(memory_stats().peak_bytes), DType::F64),
                                           ReduceOp::Max).item<double>();
      if (world.rank() == 0) {
        seconds = slowest;
        peak = static_cast<int64_t>(worst_peak);
      }
    });
    state.SetIterationTime(seconds / kSteps);
  }
  state.counters["tokens_per_s"] = static_cast<double>(batch * config.block_size * kSteps) / seconds;
  state.counters["step_ms"] = seconds / kSteps * 1e3;
  state.counters["peak_MiB_per_rank"] = peak / 1048576.0;
  state.SetLabel(c.name);
}

}  // namespace

BENCHMARK(BM_TrainGpt)->DenseRange(0, 9)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
