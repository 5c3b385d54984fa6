// GPT training throughput on this machine: tokens/s and peak memory per rank.
//
// Each row trains a few steps (after warm-up) of the train_gpt model with the same
// total number of cores: 1 rank uses all BLAS threads, 2 ranks one each (launch
// sets that). Compared in the same run: 1 rank vs DP=2 (target: DP=2 >= 90% of
// the 1-rank tokens/s), DDP overlap on vs off (one bucket filled last), FP32 vs
// BF16, and activation checkpointing off vs on.
#include <benchmark/benchmark.h>

#include <algorithm>

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
      std::optional<DType> compute;
      if (c.compute != DType::F32) compute = c.compute;
      parallel::Trainer trainer(optimizer, {.compute_dtype = compute, .sync = &ddp});
      const Shape shape{batch, config.block_size};
      double elapsed = 0;
      int64_t step_peak = 0;
      for (int step = 0; step < kWarmup + kSteps; ++step) {
        barrier(world);
        const parallel::StepReport report = trainer.step(step, [&](int64_t) {
          const TokenBatch b = data.get_batch(sampler.batch_at(step));
          const DistTensor ids = DistTensor::from_local(b.inputs, mesh, {Shard(0)}, shape);
          const DistTensor targets = DistTensor::from_local(b.targets, mesh, {Shard(0)}, shape);
          return model.loss(ids, targets);
        });
        if (step < kWarmup) continue;
        elapsed += report.stats.seconds;
        for (int64_t bytes : report.stats.peak_memory_bytes) step_peak = std::max(step_peak, bytes);
      }
      const double slowest = all_reduce(world, Tensor::full({1}, elapsed, DType::F64), ReduceOp::Max).item<double>();
      if (world.rank() == 0) {
        seconds = slowest;
        peak = step_peak;
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
