// parallel::Trainer: the one training step that train_gpt, the tests and bench_train
// share.
//
//   parallel::DistributedDataParallel ddp(model);
//   AdamW optimizer(model.parameters(), {.lr = 3e-3});
//   WarmupCosine schedule(3e-3, 20, steps, 3e-4);
//   parallel::Trainer trainer(optimizer, {.grad_accum = 2, .clip_grad_norm = 1.0,
//                                         .schedule = &schedule, .sync = &ddp});
//   for (int64_t step = 0; step < steps; ++step) {
//     parallel::StepReport r = trainer.step(step, [&](int64_t micro) {
//       return model.loss(ids_of(step, micro), targets_of(step, micro));
//     });
//     log.step(r.stats);
//   }
//
// A step sets the schedule's learning rate, then for every micro-batch computes the
// loss (inside the compute dtype's scope), divides it by grad_accum, scales it (F16
// loss scaling) and runs backward; gradients are synchronised only on the last
// micro-batch (GradientSync::set_accumulating: DDP's no_sync, FSDP's no_sync), so
// accumulation communicates once per step. Then it finishes the synchronisation, unscales and
// checks for overflow (a step with a non-finite gradient is skipped on every rank),
// clips by the global norm, steps the optimizer, updates the loss scale and drops the
// gradients. The loss of the step (the sum of the divided micro-batch losses) is
// reduced once, after the optimizer step. With a MicroBatchRunner (pipeline
// parallelism) the runner runs the micro-batches and the rest is the same.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dtensor/amp.h"
#include "dtensor/optim.h"
#include "dtensor/step_plan.h"

namespace dtensor {

// What one optimizer step did (the trainer's report; examples/common's TrainLog
// prints it).
struct StepStats {
  int64_t step = 0;  // 0-based; shown 1-based
  double loss = 0;
  int64_t tokens = 0;                      // tokens processed by the whole job in this step
  double seconds = 0;                      // wall time of the step
  // One per rank (may be empty), on the device the step computes on (its loss's; a
  // pipeline's: MicroBatchRunner::device).
  std::vector<int64_t> peak_memory_bytes;
  // The same on that device's host side (offloading's): the CPU for a GPU, cpu:1 for
  // the CPU (device.h); empty when no rank holds anything there.
  std::vector<int64_t> peak_host_memory_bytes;
  std::optional<double> lr;                // shown when set
};

}  // namespace dtensor

namespace dtensor::parallel {

class DelayedUpdate;  // delayed_update.h

// What synchronises gradients across data-parallel ranks (DDP, FSDP).
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // true: the coming forwards and backwards are micro-batches of one step; gradients
  // accumulate locally and nothing is communicated that can wait for the last one
  // (DDP skips its all-reduces, FSDP its reduce-scatters and its resharding). The
  // next backward after set_accumulating(false) reduces the sum.
  virtual void set_accumulating(bool accumulating) = 0;
  // Waits until every gradient of the last synchronised backward is reduced and in
  // place on its parameter.
  virtual void finish_gradient_sync() = 0;
};

// What runs the forwards and backwards of a step when they are spread over several
// meshes of one job: a pipeline schedule (parallel::Pipeline, pipeline.h). The
// trainer hands it the loss transform and the compute dtype, and asks it for what
// crosses the meshes: the loss, the gradient norm, and the group over which found-inf
// and the peak memory are agreed.
class MicroBatchRunner {
 public:
  virtual ~MicroBatchRunner() = default;
  // Runs every micro-batch's forward (under compute_dtype) and backward of `step`; each
  // micro-batch loss is weighted by its share of the step and passed through
  // `to_backward` (loss scaling) before its backward. Gradients accumulate over the
  // micro-batches. Returns the step's loss (the weighted sum, unscaled) on every rank.
  virtual double run(int64_t step, const std::function<DistTensor(const DistTensor&)>& to_backward,
                     std::optional<DType> compute_dtype) = 0;
  // Finishes the gradient synchronisation of every local stage (DDP, FSDP) and of
  // parameters that several stages share.
  virtual void finish_gradient_sync() = 0;
  // The global gradient norm of the whole model, each parameter counted once.
  virtual double grad_norm(const std::vector<DistTensor>& params) = 0;
  // Every rank of the job.
  virtual const Group& group() const = 0;
  // Where this rank computes: the step's peak memory is read there.
  virtual Device device() const { return Device::cpu(); }
};

struct TrainerOptions {
  int64_t grad_accum = 1;                         // micro-batches per optimizer step
  double clip_grad_norm = 0;                      // max global gradient norm; 0: no clipping
  std::optional<DType> compute_dtype;             // layers compute in it (nn::ComputeDtype)
  std::optional<LossScalerOptions> loss_scaling;  // dynamic loss scaling (for F16)
  const LRSchedule* schedule = nullptr;           // sets the learning rate of every step
  GradientSync* sync = nullptr;                   // DDP or FSDP; null: no data parallelism
  // Steps the optimizer through it (one step stale after its warm-up; its optimizer
  // must be the trainer's). The schedule's learning rate is then set just before the
  // step, not at the start, so that it does not wait for the update in flight.
  DelayedUpdate* delayed_update = nullptr;
  int64_t tokens_per_step = 0;                    // of the whole job, for StepStats::tokens
  // Whole-step layout planning (dtensor/step_plan.h) of the plain loop's steps: the
  // first step records, later ones replay its plan. Unset: DTENSOR_PLAN. Pipeline
  // steps (step with a runner) are not planned.
  std::optional<PlanMode> plan;
};

struct StepReport {
  // step, loss, tokens, seconds (this rank, the step without the report's own
  // all-gather), lr, and the peak memory of every rank of the parameters' mesh.
  StepStats stats;
  std::optional<double> grad_norm;  // when clipping: the norm before clipping
  bool applied = true;              // false: skipped for a non-finite gradient
  std::optional<StepPlanReport> plan;  // when the step was planned
};

class Trainer {
 public:
  // The loss of micro-batch `micro` (0-based, < grad_accum) of the current step.
  using MicroBatchLoss = std::function<DistTensor(int64_t micro)>;

  Trainer(Optimizer& optimizer, TrainerOptions options = {});

  // One optimizer step (collective over the parameters' meshes).
  StepReport step(int64_t step, const MicroBatchLoss& loss_of);
  // One optimizer step whose micro-batches `runner` runs (a pipeline schedule: the
  // runner's micro-batches replace grad_accum, which must be 1, and it synchronises
  // the gradients of its stages itself, so sync must be null). Collective over
  // runner.group().
  StepReport step(int64_t step, MicroBatchRunner& runner);

  const TrainerOptions& options() const { return options_; }
  // The loss scaler when loss scaling is on.
  const LossScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  LossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }

 private:
  // The step after its micro-batches: synchronisation, overflow check, clipping,
  // the optimizer and the report. `runner` is null for the plain loop.
  void finish_step(StepReport& report, MicroBatchRunner* runner);
  // The learning rate of `step`, set on the optimizer now unless a delayed update sets it later.
  double start_lr(int64_t step);

  Optimizer& optimizer_;
  TrainerOptions options_;
  std::optional<LossScaler> scaler_;
  std::unique_ptr<StepPlanner> planner_;  // PlanMode::Step
};

}  // namespace dtensor::parallel
