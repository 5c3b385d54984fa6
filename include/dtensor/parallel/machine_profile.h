// This machine's measured rates, for the auto-parallel estimator (plan.h): the GEMM rate
// and how it falls for small GEMMs, the memory bandwidth, and the collectives' latency
// and bandwidth, each measured with every rank busy at once as in training.
//
//   MachineProfile p = calibrate();                 // ~5 s on 2 ranks (dtensor-plan --calibrate)
//   p.save("machine.json");                         // atomically
//   ClusterSpec c = MachineProfile::load("machine.json").cluster(/*devices=*/2);
//
// The fits (fit_profile) are the estimator's own forms, so a profile is exactly what it
// reads: an [m, k] x [k, n] GEMM runs at R / (1 + d0 (1/m + 1/n + 1/k)) per rank (a fixed
// cost per row, column and depth step; d_half = 3 d0 is the square size at R / 2),
// fitted on square and transformer-shaped (tall, thin) GEMMs as the line
// 1/rate = 1/R + (d0/R) (1/m + 1/n + 1/k); an all-reduce of B bytes over n ranks takes
// 2(n-1) alpha + 2(n-1)/n B / beta (cost_model.h's ring), fitted as a line in B. Both
// lines are fitted in relative error, as the estimator's predictions are judged.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/parallel/plan.h"

namespace dtensor::parallel {

// What calibrate measured: the points the profile is fitted to, each the slowest
// rank's (a step waits for it at every collective).
struct CalibrationSamples {
  struct Gemm {
    int64_t m = 0, n = 0, k = 0;  // an [m, k] x [k, n] product
    double flops_per_s = 0;       // per rank, the median of a few trials, the slowest rank's
  };
  struct Collective {
    int64_t bytes = 0;   // the all-reduced buffer
    double seconds = 0;  // per call, the median of a few trials
  };
  int64_t ranks = 0;  // busy at once while measuring, and the all-reduce's group
  std::string backend;
  std::string machine;  // cpu::summary() on a measuring rank
  std::vector<Gemm> gemm;
  std::vector<Collective> all_reduce;
  double copy_bytes_per_s = 0;  // per rank: buffer bytes copied per second (read + write)
  // Per dispatched op of a tiny transformer block's forward and backward (batch sharded
  // over the ranks): the host's cost of a model's op that does almost no work.
  double op_seconds = 0;
  // The same block under tensor parallelism over the ranks (Megatron's column- and
  // row-parallel linears, input replicated), per op of the plain block: sharding, the
  // collectives' host side and the ranks' waits for each other. The plain op's time
  // with one rank or where the block does not divide.
  double tp_op_seconds = 0;
  // Per parameter tensor of that block's optimizer step (clipping by the global norm,
  // AdamW): the host's cost of a tensor's norm, update and state.
  double optimizer_tensor_seconds = 0;
  // Per collective of that block under FSDP (ZeRO-3, one unit: two all-gathers and a
  // reduce-scatter a step), what FSDP adds to its step: hooks, the collectives' launch
  // and wait, packing and unpacking a unit.
  double fsdp_collective_seconds = 0;
};

struct MachineProfile {
  std::string machine;      // the CPU and GEMM engines (cpu::summary())
  std::string measured_at;  // UTC, ISO 8601
  std::string backend = "threads";
  int64_t ranks = 0;                    // busy at once while measuring
  double memory_bytes = 0;              // the host's, shared by its ranks
  double gemm_flops = 0;                // R: a large GEMM's rate per rank, FLOP/s (FP32)
  double gemm_half_dim = 0;             // d_half: the square GEMM size that runs at R / 2 (3 d0)
  double memory_bandwidth = 0;          // per rank, bytes copied per second
  double latency = 0;                   // alpha: seconds per hop of a collective
  double bandwidth = 0;                 // beta: bytes per second per rank, one direction
  double op_seconds = 0;                // host time per dispatched op (ClusterSpec::op_seconds)
  double tp_op_seconds = 0;             // under tensor parallelism (ClusterSpec::tp_op_seconds)
  double optimizer_tensor_seconds = 0;  // per parameter tensor (ClusterSpec::optimizer_tensor_seconds)
  double fsdp_collective_seconds = 0;   // per FSDP collective (ClusterSpec::fsdp_collective_seconds)
  CalibrationSamples samples;           // what it was fitted to

  // The cluster of `devices` ranks on this host: the rates per rank as measured with
  // `ranks` busy, shared further by more ranks than that (x ranks / devices).
  ClusterSpec cluster(int64_t devices) const;
  std::string to_string() const;
  // Writes a JSON file next to `path` and renames it over `path`: never half-written.
  void save(const std::string& path) const;
  // Throws std::invalid_argument naming the file and the field that is missing or wrong.
  static MachineProfile load(const std::string& path);
};

struct CalibrationOptions {
  int64_t ranks = 0;                // 0: the host's cores
  std::string backend = "threads";  // ranks are threads of this process
  // {m, n, k}: squares, and a layer's products at 1024 and 2048 tokens (tall and thin,
  // as tensor parallelism makes them).
  std::vector<std::array<int64_t, 3>> gemm_shapes{{32, 32, 32},     {64, 64, 64},    {128, 128, 128}, {256, 256, 256},
                                                  {512, 512, 512},  {1024, 64, 256}, {1024, 256, 64}, {1024, 128, 512},
                                                  {1024, 512, 128}, {2048, 256, 256}};
  std::vector<int64_t> all_reduce_bytes{4096, 65536, 1 << 20, 4 << 20, 16 << 20};
  int64_t copy_bytes = 64 << 20;  // per rank, larger than the caches
  int64_t op_block_dim = 8;       // width of the transformer block whose ops are timed (almost no arithmetic)
  double seconds_per_sample = 0.05;
  int trials = 5;  // each sample the median of these
};

// Measures this machine (collective over its own `ranks` threads; call it outside
// any launch) and fits the profile.
MachineProfile calibrate(const CalibrationOptions& options = {});
// The fit alone (exposed so that it can be checked on known rates). Throws when there
// are fewer than two GEMM sizes or collective sizes, or a rate is not positive.
MachineProfile fit_profile(const CalibrationSamples& samples);

}  // namespace dtensor::parallel
