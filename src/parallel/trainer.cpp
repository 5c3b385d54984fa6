// The training step.
#include "dtensor/parallel/trainer.h"

#include <chrono>
#include <cmath>
#include <optional>

#include "dtensor/autograd.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/moe.h"
#include "dtensor/ops.h"
#include "dtensor/parallel/delayed_update.h"
#include "dtensor/trace.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

// The memory a step's peaks are read on: the device this rank computes on (the
// loss's) and its host side (offloading's: the CPU for a GPU, cpu:1 for the CPU,
// device.h; none for a model on cpu:1 itself).
struct PeakDevices {
  Device device;
  std::optional<Device> host;
  explicit PeakDevices(Device on) : device(on) {
    if (on.is_cuda()) host = Device::cpu();
    if (on == Device::cpu()) host = Device::cpu(1);
  }
};

// Every device's peak restarts at the step's start (where the step computes is known
// once its first loss is).
void reset_peaks() {
  for (const Device d : {Device::cpu(), Device::cpu(1), Device::cuda()}) reset_peak_memory(d);
}

// Every rank's peaks since reset_peaks, on the device and its host (one all-gather).
void gather_peaks(const Group& group, const PeakDevices& on, StepStats& stats) {
  const std::vector<int64_t> mine = {memory_stats(on.device).peak_bytes,
                                     on.host ? memory_stats(*on.host).peak_bytes : 0};
  const std::vector<int64_t> all =
      all_gather(group, Tensor::from_vector(mine, {1, 2})).contiguous().to_vector<int64_t>();
  bool host = false;
  for (size_t r = 0; r < all.size() / 2; ++r) {
    stats.peak_memory_bytes.push_back(all[2 * r]);
    stats.peak_host_memory_bytes.push_back(all[2 * r + 1]);
    host |= all[2 * r + 1] > 0;
  }
  if (!host) stats.peak_host_memory_bytes.clear();
}

}  // namespace

Trainer::Trainer(Optimizer& optimizer, TrainerOptions options) : optimizer_(optimizer), options_(options) {
  DT_CHECK_ARG(options_.grad_accum >= 1, "Trainer", "expected grad_accum >= 1, got ", options_.grad_accum);
  DT_CHECK_ARG(options_.clip_grad_norm >= 0 && std::isfinite(options_.clip_grad_norm), "Trainer",
               "expected clip_grad_norm >= 0 (0: off), got ", options_.clip_grad_norm);
  DT_CHECK_ARG(!optimizer_.params().empty(), "Trainer", "the optimizer has no parameters");
  DT_CHECK_ARG(!options_.delayed_update || &options_.delayed_update->optimizer() == &optimizer_, "Trainer",
               "option delayed_update steps another optimizer than the trainer's");
  if (options_.loss_scaling) scaler_.emplace(*options_.loss_scaling);
  if ((options_.plan ? *options_.plan : plan_mode_from_env()) == PlanMode::Step) {
    planner_ = std::make_unique<StepPlanner>();
  }
}

double Trainer::start_lr(int64_t step) {
  if (!options_.schedule) return optimizer_.lr();
  // A delayed update may be running with the previous step's rate: set this one later.
  if (options_.delayed_update) return options_.schedule->lr_at(step);
  return options_.schedule->apply(optimizer_, step);
}

StepReport Trainer::step(int64_t step, const MicroBatchLoss& loss_of) {
  Tracer::begin_step(step);
  StepReport report;
  report.stats.step = step;  // finish_step reads it
  DistTensor step_loss;  // F64, the micro-batch losses summed in their own layout
  Device compute_device;
  const auto t0 = std::chrono::steady_clock::now();
  {
    TraceSpan step_span("step", "train");
    std::optional<PlannedStep> planned;
    if (planner_) planned.emplace(*planner_);
    reset_peaks();
    report.stats.lr = start_lr(step);
    const int64_t accum = options_.grad_accum;
    for (int64_t micro = 0; micro < accum; ++micro) {
      DistTensor loss;
      {
        TraceSpan span("forward", "compute");
        std::optional<nn::ComputeDtype> precision;
        if (options_.compute_dtype) precision.emplace(*options_.compute_dtype);
        loss = loss_of(micro);
        DT_CHECK_ARG(loss.defined() && loss.numel() == 1, "Trainer",
                     "the micro-batch loss must be one value, got ", loss.defined() ? loss.shape() : Shape{});
        if (accum > 1) loss = div(loss, static_cast<double>(accum));
      }
      {
        TraceSpan span("backward", "compute");
        // Only the last micro-batch reduces: the others accumulate locally.
        if (options_.sync && accum > 1) options_.sync->set_accumulating(micro + 1 < accum);
        const nn::AuxLossScale aux_scale((scaler_ ? scaler_->scale_value() : 1.0) / static_cast<double>(accum));
        (scaler_ ? scaler_->scale(loss) : loss).backward();
      }
      NoGradGuard no_grad;
      compute_device = loss.device();
      const DistTensor value = loss.detach().to(DType::F64);
      step_loss = step_loss.defined() ? add(step_loss, value) : value;
    }
    finish_step(report, nullptr);
  }
  if (planner_) report.plan = planner_->last_report();
  report.stats.loss = step_loss.full_tensor().item<double>();
  report.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report.stats.tokens = options_.tokens_per_step;
  gather_peaks(optimizer_.params().front().mesh().group(), PeakDevices(compute_device), report.stats);
  Tracer::counter("loss", report.stats.loss);
  return report;
}

StepReport Trainer::step(int64_t step, MicroBatchRunner& runner) {
  DT_CHECK_ARG(options_.grad_accum == 1 && !options_.sync, "Trainer",
               "a pipeline runs the micro-batches and synchronises its stages' gradients itself: expected "
               "grad_accum 1 and no sync, got grad_accum ", options_.grad_accum, options_.sync ? " and a sync" : "");
  Tracer::begin_step(step);
  StepReport report;
  report.stats.step = step;  // finish_step reads it
  const auto t0 = std::chrono::steady_clock::now();
  {
    TraceSpan step_span("step", "train");
    reset_peaks();
    report.stats.lr = start_lr(step);
    // The pipeline weighs each micro-batch's auxiliary losses by its own weight on top.
    const nn::AuxLossScale aux_scale(scaler_ ? scaler_->scale_value() : 1.0);
    report.stats.loss = runner.run(
        step, [&](const DistTensor& loss) { return scaler_ ? scaler_->scale(loss) : loss; }, options_.compute_dtype);
    finish_step(report, &runner);
  }
  report.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report.stats.tokens = options_.tokens_per_step;
  gather_peaks(runner.group(), PeakDevices(runner.device()), report.stats);
  Tracer::counter("loss", report.stats.loss);
  return report;
}

void Trainer::finish_step(StepReport& report, MicroBatchRunner* runner) {
  TraceSpan span("optimizer", "compute");
  const std::vector<DistTensor>& params = optimizer_.params();
  if (options_.sync) options_.sync->finish_gradient_sync();
  if (runner) runner->finish_gradient_sync();
  report.applied = !scaler_ || scaler_->unscale_and_check(params, runner ? &runner->group() : nullptr);
  if (report.applied) {
    if (options_.clip_grad_norm > 0) {
      report.grad_norm = runner ? clip_grad_norm(params, options_.clip_grad_norm, runner->grad_norm(params))
                                : clip_grad_norm(params, options_.clip_grad_norm);
    }
    if (options_.delayed_update) {
      if (options_.schedule) optimizer_.set_lr(*report.stats.lr);  // waits for the update in flight
      options_.delayed_update->step(report.stats.step);
    } else {
      optimizer_.step();
    }
  }
  if (scaler_) scaler_->update();
  optimizer_.zero_grad();
}

}  // namespace dtensor::parallel
