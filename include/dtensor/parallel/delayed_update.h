// One-step delayed parameter update (ZeRO-Offload's DPU): with the optimizer on the
// host (FSDPOptions::offload), the optimizer step of step k runs on a thread of its own
// while the device computes the forward and backward of step k + 1, so the host step is
// hidden behind the device's work.
//
//   parallel::fully_shard(block, mesh, {.offload = parallel::OffloadPolicy{}});  // each block
//   parallel::fully_shard(model, mesh, {.offload = parallel::OffloadPolicy{}});
//   AdamW optimizer(model.parameters(), {.lr = 1e-3});
//   parallel::DelayedUpdate delayed(optimizer, model, {.warmup_steps = 40});
//   for (int64_t step = 0; step < steps; ++step) {
//     model.loss(ids, targets).backward();
//     delayed.step();          // instead of optimizer.step()
//     optimizer.zero_grad();
//   }
//   delayed.finish();          // the last update lands
//
// The first warmup_steps steps are ordinary steps. From then on, step() of step k
//   1. waits for the update of step k - 1 (started by the previous step()),
//   2. copies the updated shards to their device copies (the values step k + 1's
//      gathers read),
//   3. starts the optimizer step with step k's gradients on another thread and returns.
// So the forward and backward of step k + 1 see the parameters without step k's update:
// one step stale, as DeepSpeed's delayed update. The gradients are taken by reference;
// the next backward makes new ones (zero_grad drops them from the parameters, and
// accumulating into them builds new tensors), so nothing is copied.
//
// Whatever reads or writes the shards before the update lands (an evaluation forward
// without step(), FSDPModule::state_dict, a checkpoint load) waits for it first, and so
// do the optimizer's set_lr, state_dict and load_state_dict (Optimizer's lock): a
// checkpoint taken between steps holds the updated parameters and state. finish() lands
// the update in flight and refreshes the device copies, so the next step() starts none
// to wait for: call it before saving a checkpoint, so that the run that goes on and the
// run resumed from the checkpoint take the same steps.
//
// Every parameter of the optimizer must be an offloaded FSDP shard under `model` (a
// parameter the device reads directly would change under a forward). Gradient clipping
// and loss scaling run before step() as usual, on step k's gradients. Memory: the
// gradients of one more step are alive while the update runs (the host side of one
// step's gradient shards).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dtensor/nn/module.h"
#include "dtensor/optim.h"

namespace dtensor::parallel {

struct DelayedUpdateOptions {
  // Ordinary (undelayed) steps first: the update's staleness matters most while the
  // loss falls fast (DeepSpeed starts it after a few dozen steps).
  int64_t warmup_steps = 40;
};

struct DelayedUpdateStats {
  int64_t steps = 0;          // step() calls
  int64_t delayed_steps = 0;  // of those, updates started on the background thread
  double update_seconds = 0;  // in the background updates (finished ones)
  double wait_seconds = 0;    // waiting for an update that had not finished (exposed)
};

class DelayedUpdate {
 public:
  // `model`: a module that fully_shard (with offload) was applied to, or one holding
  // such modules (each pipeline stage's, say). Local: no communication. The optimizer
  // must outlive this object (declare it first), whose destructor waits for its step.
  DelayedUpdate(Optimizer& optimizer, nn::Module& model, DelayedUpdateOptions options = {});
  DelayedUpdate(Optimizer& optimizer, const std::vector<nn::Module*>& models, DelayedUpdateOptions options = {});
  // Waits for the update in flight (an error in it is reported on stderr: a destructor
  // does not throw; finish() reports it as an exception).
  ~DelayedUpdate();
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;

  // The optimizer step of this step's gradients: ordinary during warm-up, then started
  // in the background after the previous one lands (above). An exception thrown by the
  // background update is rethrown here (or by whatever waited for it).
  void step();
  // The same for the step of this (0-based) index in the whole run, which decides the
  // warm-up: a run resumed from a checkpoint passes its own step numbers (Trainer does).
  void step(int64_t index);
  // Lands the update in flight and refreshes the device copies; idempotent.
  void finish();
  bool in_flight() const;
  Optimizer& optimizer() const;
  const DelayedUpdateStats& stats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dtensor::parallel
