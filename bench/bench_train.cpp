// GPT training throughput on this machine: tokens/s and peak memory per rank.
//
// Each row trains a few steps (after warm-up) of the train_gpt model with the same
// total number of cores: 1 rank uses all BLAS threads, 2 ranks one each (launch
// sets that). Compared in the same run: 1 rank vs DP=2 (target: DP=2 >= 90% of
// the 1-rank tokens/s), DDP overlap on vs off (one bucket filled last), FP32 vs
// BF16, activation checkpointing off vs on, and FSDP: ZeRO stages 1-3 and HSDP next
// to DDP at the same global batch, prefetch on vs off, with the time each rank waited
// for all-gathers and reduce-scatters (the fsdp_*_wait spans of the trace); tensor
// parallel (Megatron's plan) at TP=2 and DP=2 x TP=2. Every row reports rank 0's
// collectives and bytes sent per step (CommDebugMode).
#include <benchmark/benchmark.h>

#include <algorithm>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

struct Case {
  const char* name;
  bool medium;  // medium (or small); `wide` below overrides both
  int ranks;
  bool overlap;
  DType compute;
  bool checkpoint;
  int fsdp = 0;         // ZeRO stage; 0: DDP
  bool prefetch = true;
  bool hsdp = false;    // ranks as replicate=2 x dp=ranks/2
  bool tp = false;      // ranks as dp=ranks/2 x tp=2, Megatron's plan on tp (ranks 2: tp=2 alone)
  bool wide = false;    // dim 256, 4 layers, seq 16: parameters outweigh activations
};

const std::vector<Case>& cases() {
  static const std::vector<Case> list = {
      {"small 1 rank", false, 1, true, DType::F32, false},
      {"small dp=2", false, 2, true, DType::F32, false},
      {"small dp=2 no overlap", false, 2, false, DType::F32, false},
      {"small dp=2 bf16", false, 2, true, DType::BF16, false},
      {"small dp=2 checkpointing", false, 2, true, DType::F32, true},
      {"small tp=2", false, 2, true, DType::F32, false, 0, true, false, true},
      {"medium 1 rank", true, 1, true, DType::F32, false},
      {"medium dp=2", true, 2, true, DType::F32, false},
      {"medium dp=2 no overlap", true, 2, false, DType::F32, false},
      {"medium dp=2 bf16", true, 2, true, DType::BF16, false},
      {"medium dp=2 checkpointing", true, 2, true, DType::F32, true},
      {"medium dp=2 zero1", true, 2, true, DType::F32, false, 1},
      {"medium dp=2 zero2", true, 2, true, DType::F32, false, 2},
      {"medium dp=2 zero3", true, 2, true, DType::F32, false, 3},
      {"medium dp=2 zero3 no prefetch", true, 2, true, DType::F32, false, 3, false},
      {"medium dp=2 zero3 bf16", true, 2, true, DType::BF16, false, 3},
      {"medium dp=4", true, 4, true, DType::F32, false},
      {"medium dp=4 zero3", true, 4, true, DType::F32, false, 3},
      {"medium dp=4 zero3 checkpointing", true, 4, true, DType::F32, true, 3},
      {"medium dp=4 checkpointing", true, 4, true, DType::F32, true},
      {"medium hsdp 2x2 zero3", true, 4, true, DType::F32, false, 3, true, true},
      {"medium tp=2", true, 2, true, DType::F32, false, 0, true, false, true},
      {"medium dp=2,tp=2", true, 4, true, DType::F32, false, 0, true, false, true},
      {"medium dp=2,tp=2 zero3", true, 4, true, DType::F32, false, 3, true, false, true},
      {"wide dp=4", true, 4, true, DType::F32, false, 0, true, false, false, true},
      {"wide dp=4 zero3", true, 4, true, DType::F32, false, 3, true, false, false, true},
  };
  return list;
}

constexpr int kWarmup = 2, kSteps = 6;

void BM_TrainGpt(benchmark::State& state) {
  const Case& c = cases()[state.range(0)];
  models::GPTConfig config;
  config.vocab = 64;
  config.block_size = c.medium ? 64 : 32;
  config.layers = c.medium ? 4 : 2;
  config.dim = c.medium ? 128 : 64;
  config.heads = c.medium ? 8 : 4;
  config.checkpoint_activations = c.checkpoint;
  if (c.wide) {
    config.block_size = 16;
    config.layers = 4;
    config.dim = 256;
    config.heads = 8;
  }
  const int64_t batch = 16;
  double seconds = 0, gather_wait = 0, reduce_wait = 0, collectives = 0, bytes_sent = 0;
  int64_t peak = 0, resident = 0;
  for (auto _ : state) {
    launch(c.ranks, [&](Group world) {
      const DeviceMesh mesh = c.hsdp ? DeviceMesh(world, {2, c.ranks / 2}, {"replicate", "dp"})
                              : c.tp && c.ranks == 2 ? DeviceMesh(world, {2}, {"tp"})
                              : c.tp                 ? DeviceMesh(world, {c.ranks / 2, 2}, {"dp", "tp"})
                                                     : DeviceMesh(world, {c.ranks}, {"dp"});
      const bool has_dp = mesh.names()[0] != "tp";
      const int64_t dp_size = c.tp ? c.ranks / 2 : c.ranks;
      const int64_t dp_rank = !has_dp ? 0 : c.tp ? mesh.coordinate(0) : mesh.linear_index();
      SyntheticLanguage data(config.vocab, config.block_size, 1024, 1);
      DistributedSampler sampler(data.size(), batch, dp_rank, dp_size, 1);
      const int64_t live_before = memory_stats().live_bytes;
      models::GPT model(mesh, config, 1);
      if (c.tp) parallel::parallelize_module(model, mesh["tp"], models::gpt_tp_plan(config));
      std::optional<DType> compute;
      if (c.compute != DType::F32) compute = c.compute;
      std::optional<parallel::DistributedDataParallel> ddp;
      std::optional<parallel::FSDPModule> fsdp;
      if (c.fsdp > 0) {
        parallel::FSDPOptions options{.stage = c.fsdp, .replicate_dim = c.hsdp ? "replicate" : "", .prefetch = c.prefetch};
        if (compute) options.mixed_precision = {.param_dtype = compute, .reduce_dtype = DType::F32};
        for (auto& [name, m] : model.named_modules()) {
          if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, options);
        }
        fsdp = parallel::fully_shard(model, mesh, options);
        compute.reset();  // the gathered parameters carry the compute dtype
      } else if (has_dp) {
        ddp.emplace(model, parallel::DDPOptions{.bucket_cap_mb = c.overlap ? 1.0 : 1e6, .dp_dim = "dp"});
      }
      AdamW optimizer(model.parameters(), 1e-3);
      parallel::GradientSync* sync = fsdp ? static_cast<parallel::GradientSync*>(&*fsdp)
                                     : ddp ? static_cast<parallel::GradientSync*>(&*ddp)
                                           : nullptr;
      parallel::Trainer trainer(optimizer, {.compute_dtype = compute, .sync = sync});
      const Shape shape{batch, config.block_size};
      Placements batch_placements(mesh.ndim(), Shard(0));
      if (c.tp) batch_placements.back() = Replicate();
      parallel::FSDPStats before;
      std::optional<CommDebugMode> comm;
      double elapsed = 0;
      int64_t step_peak = 0;
      for (int step = 0; step < kWarmup + kSteps; ++step) {
        barrier(world);
        const parallel::StepReport report = trainer.step(step, [&](int64_t) {
          const TokenBatch b = data.get_batch(sampler.batch_at(step));
          const DistTensor ids = DistTensor::from_local(b.inputs, mesh, batch_placements, shape);
          const DistTensor targets = DistTensor::from_local(b.targets, mesh, batch_placements, shape);
          return model.loss(ids, targets);
        });
        if (fsdp && step + 1 == kWarmup) before = fsdp->stats();
        if (step + 1 == kWarmup) comm.emplace();
        if (step < kWarmup) continue;
        elapsed += report.stats.seconds;
        for (int64_t bytes : report.stats.peak_memory_bytes) step_peak = std::max(step_peak, bytes);
      }
      // What stays between steps: parameters (and kept gathered copies), optimizer state.
      const double state_bytes = all_reduce(world, Tensor::full({1}, static_cast<double>(memory_stats().live_bytes - live_before), DType::F64),
                                            ReduceOp::Max).item<double>();
      const double slowest = all_reduce(world, Tensor::full({1}, elapsed, DType::F64), ReduceOp::Max).item<double>();
      if (world.rank() == 0) {
        collectives = static_cast<double>(comm->total_count() - comm->count("recv")) / kSteps;
        bytes_sent = static_cast<double>(comm->total_bytes() - comm->bytes("recv")) / kSteps;
        seconds = slowest;
        peak = step_peak;
        resident = static_cast<int64_t>(state_bytes);
        if (fsdp) {
          gather_wait = fsdp->stats().all_gather_wait_seconds - before.all_gather_wait_seconds;
          reduce_wait = fsdp->stats().reduce_scatter_wait_seconds - before.reduce_scatter_wait_seconds;
        }
      }
    });
    state.SetIterationTime(seconds / kSteps);
  }
  state.counters["tokens_per_s"] = static_cast<double>(batch * config.block_size * kSteps) / seconds;
  state.counters["step_ms"] = seconds / kSteps * 1e3;
  state.counters["peak_MiB_per_rank"] = peak / 1048576.0;
  state.counters["resident_MiB_per_rank"] = resident / 1048576.0;
  // Rank 0, per step: calls (a batch of sends counts each send) and bytes it sent.
  state.counters["collectives_per_step"] = collectives;
  state.counters["sent_KiB_per_step"] = bytes_sent / 1024.0;
  if (c.fsdp > 0) {
    // Rank 0's time blocked in all-gather and reduce-scatter waits, per step.
    state.counters["gather_wait_ms"] = gather_wait / kSteps * 1e3;
    state.counters["reduce_wait_ms"] = reduce_wait / kSteps * 1e3;
  }
  state.SetLabel(c.name);
}

}  // namespace

BENCHMARK(BM_TrainGpt)->DenseRange(0, static_cast<int>(cases().size()) - 1)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
