// One-step delayed parameter update: the optimizer step of step k on a thread of its
// own while step k + 1 computes (delayed_update.h).
#include "dtensor/parallel/delayed_update.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <set>
#include <thread>
#include <utility>

#include "dtensor/allocator.h"
#include "dtensor/autograd.h"
#include "dtensor/trace.h"
#include "parallel/fsdp_group.h"
#include "util/check.h"

namespace dtensor::parallel {

namespace {
const char* kOp = "DelayedUpdate";
}  // namespace

using detail::seconds_since;

struct DelayedUpdate::State {
  Optimizer* optimizer = nullptr;
  DelayedUpdateOptions options;
  // The FSDP trees whose shards the optimizer writes (each context: the gate, and its
  // root: the device copies to refresh).
  std::vector<std::weak_ptr<detail::Context>> contexts;
  std::thread worker;
  std::exception_ptr error;   // of the background update, rethrown on the rank's thread
  double worker_seconds = 0;  // written by the worker, read after join
  DelayedUpdateStats stats;

  // Lands the update in flight (if any); rethrows its error.
  void join() {
    if (!worker.joinable()) return;
    TraceSpan span("delayed_update_wait", "compute");
    const auto t0 = std::chrono::steady_clock::now();
    worker.join();
    stats.wait_seconds += seconds_since(t0);
    stats.update_seconds += worker_seconds;
    if (error) std::rethrow_exception(std::exchange(error, nullptr));
  }

  void refresh() {
    for (const std::weak_ptr<detail::Context>& c : contexts) {
      const std::shared_ptr<detail::Context> ctx = c.lock();
      if (const std::shared_ptr<detail::ParamGroup> root = ctx ? ctx->root.lock() : nullptr) {
        detail::refresh_device_shards(*root);
      }
    }
  }
};

DelayedUpdate::DelayedUpdate(Optimizer& optimizer, nn::Module& model, DelayedUpdateOptions options)
    : DelayedUpdate(optimizer, std::vector<nn::Module*>{&model}, options) {}

DelayedUpdate::DelayedUpdate(Optimizer& optimizer, const std::vector<nn::Module*>& models, DelayedUpdateOptions options)
    : state_(std::make_shared<State>()) {
  DT_CHECK_ARG(options.warmup_steps >= 0, kOp, "option warmup_steps: expected 0 or more, got ", options.warmup_steps);
  DT_CHECK_ARG(!models.empty(), kOp, "expected at least one model");
  state_->optimizer = &optimizer;
  state_->options = options;
  // The offloaded shards under the models, and their trees.
  std::set<const DistTensor::Impl*> offloaded;
  std::set<const detail::Context*> seen;
  for (nn::Module* model : models) {
    DT_CHECK_ARG(model != nullptr, kOp, "a model is null");
    bool any = false;
    for (auto& [path, m] : model->named_modules()) {
      const std::shared_ptr<detail::ParamGroup> group = detail::group_of(m);
      if (!group) continue;
      any = true;
      if (group->offloaded()) {
        for (const detail::ParamGroup::Param& p : group->params) offloaded.insert(p.sharded.impl().get());
      }
      if (seen.insert(group->context.get()).second) {
        DT_CHECK_ARG(!group->context->shard_writer, kOp, "the model's FSDP modules already have a DelayedUpdate");
        state_->contexts.push_back(group->context);
      }
    }
    DT_CHECK_ARG(any, kOp, "module '", model->path(),
                 "' holds no fully_shard'ed module; the delayed update runs the "
                 "host optimizer of FSDP with offload (FSDPOptions::offload) beside the device's work");
  }
  const std::vector<DistTensor>& params = optimizer.params();
  for (size_t i = 0; i < params.size(); ++i) {
    DT_CHECK_ARG(offloaded.count(params[i].impl().get()), kOp, "parameter ", i, " of the optimizer (shape ",
                 params[i].shape(),
                 ") is not an offloaded FSDP shard of the model; the device would read it while "
                 "the background update writes it (fully_shard every module that holds parameters with .offload, "
                 "and build the optimizer from model.parameters() after)");
  }
  // Whatever touches the shards while an update runs waits for it.
  const std::weak_ptr<State> weak = state_;
  for (const std::weak_ptr<detail::Context>& c : state_->contexts) {
    if (const std::shared_ptr<detail::Context> ctx = c.lock()) {
      ctx->shard_writer = [weak] {
        if (const std::shared_ptr<State> s = weak.lock()) s->join();
      };
    }
  }
}

DelayedUpdate::~DelayedUpdate() {
  try {
    state_->join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[DelayedUpdate] the last background update failed: %s\n", e.what());
  }
  for (const std::weak_ptr<detail::Context>& c : state_->contexts) {
    if (const std::shared_ptr<detail::Context> ctx = c.lock()) ctx->shard_writer = nullptr;
  }
}

void DelayedUpdate::step() { step(state_->stats.steps); }

void DelayedUpdate::step(int64_t index) {
  State& s = *state_;
  DT_CHECK_ARG(index >= 0, kOp, "step: expected a step index >= 0, got ", index);
  ++s.stats.steps;
  s.join();
  if (index < s.options.warmup_steps) {
    s.optimizer->step();
    return;
  }
  // The values step k + 1 computes with: everything up to step k - 1's update.
  s.refresh();
  std::vector<DistTensor> grads;
  grads.reserve(s.optimizer->params().size());
  for (const DistTensor& p : s.optimizer->params()) grads.push_back(gradient_in_param_layout(p));
  ++s.stats.delayed_steps;
  // Reserved here, so that whatever this rank asks of the optimizer from now on waits
  // for this step even before the worker has started.
  Optimizer::StepReservation reservation = s.optimizer->reserve_step();
  State* raw = &s;  // outlives the worker: join() runs before the state goes
  s.worker = std::thread([raw, grads = std::move(grads), reservation = std::move(reservation),
                          counters = current_memory_counters()]() mutable {
    const ScopedMemoryCounters scope(counters);  // the rank's bytes
    const auto t0 = std::chrono::steady_clock::now();
    try {
      reservation.run(grads);
    } catch (...) {
      raw->error = std::current_exception();
    }
    raw->worker_seconds = seconds_since(t0);
  });
}

void DelayedUpdate::finish() {
  State& s = *state_;
  if (!s.worker.joinable()) return;
  s.join();
  s.refresh();
}

bool DelayedUpdate::in_flight() const { return state_->worker.joinable(); }

Optimizer& DelayedUpdate::optimizer() const { return *state_->optimizer; }

const DelayedUpdateStats& DelayedUpdate::stats() const { return state_->stats; }

}  // namespace dtensor::parallel
