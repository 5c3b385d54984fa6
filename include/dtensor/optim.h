// Optimizers, gradient clipping and learning-rate schedules over DistTensor parameters.
//
//   AdamW opt(model_params, 3e-4);
//   WarmupCosine schedule(3e-4, 100, 2000, 3e-5);
//   for (int64_t step = 0; step < 2000; ++step) {
//     loss.backward();
//     clip_grad_norm(model_params, 1.0);
//     opt.set_lr(schedule.lr_at(step));
//     opt.step();
//     opt.zero_grad();
//   }
//
// A parameter is a leaf DistTensor with requires_grad. Its gradient may arrive in
// another layout than the parameter: a replicated parameter used on data-parallel
// shards gets a Partial(sum) gradient. The optimizer first redistributes the gradient
// to the parameter's placements (Partial -> Replicate is the data-parallel all-reduce)
// and stores it back as the parameter's gradient, so clipping and stepping communicate
// once between them. The update itself is local: it reads this rank's piece of the
// parameter, gradient and state and writes the parameter's local tensor in place, so
// it needs no communication. State tensors (momentum, Adam's m and v) are DistTensors
// with the parameter's placements: a sharded parameter has sharded state for free.
//
// Mixed precision (`master_weights`): for a BF16/F16 parameter the optimizer keeps an
// FP32 copy (state "master", the parameter's placements). The update runs on the
// FP32 master with an FP32 gradient and FP32 state; the parameter then receives the
// master rounded to its dtype (round-to-nearest-even). Without master_weights a
// 16-bit parameter is updated in its own dtype (the kernels compute in FP32 and round
// each op back), which loses small updates: that is why the option exists. FP32 and
// F64 parameters ignore the option.
//
// The formulas are PyTorch's (torch.optim.SGD, torch.optim.AdamW with
// maximize=False, amsgrad=False), so a step here matches a step there.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor {

// The per-parameter state of an optimizer: named tensors in the parameter's
// placements ("momentum_buffer"; "exp_avg", "exp_avg_sq"; "master") and the number
// of updates this parameter has received.
struct ParamState {
  std::map<std::string, DistTensor> tensors;
  int64_t step = 0;
};

// The parameter's gradient in the parameter's placements (collective when the layouts
// differ), also stored back as param.grad(). Undefined when the parameter has none.
DistTensor gradient_in_param_layout(const DistTensor& param);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (others are skipped and keep
  // their state untouched). Collective over the parameters' meshes when gradients need
  // redistribution; runs without recording autograd.
  void step();
  // One update with `grads` in place of the parameters' gradients: one per parameter,
  // in order, each in its parameter's layout (mesh, placements, shape; undefined: the
  // parameter is skipped). Local: no communication, and the parameters' .grad() are
  // neither read nor written, so it may run on another thread while the next backward
  // produces new ones (parallel::DelayedUpdate).
  void step(const std::vector<DistTensor>& grads);
  // Drops every parameter's gradient (PyTorch's set_to_none=True).
  void zero_grad();

  // A step to run on another thread (parallel::DelayedUpdate), reserved on this one:
  // from reserve_step() until the reservation has run (or is dropped unrun), step,
  // set_lr, state, state_dict, step_counts and load_state_dict wait for it, so none of
  // them sees a half-done step and a new rate cannot reach the step in flight.
  class StepReservation {
   public:
    StepReservation() = default;
    StepReservation(StepReservation&& other) noexcept : optimizer_(std::exchange(other.optimizer_, nullptr)) {}
    StepReservation& operator=(StepReservation&& other) noexcept;
    ~StepReservation() { release(); }
    // step(grads), on any thread, then the waiting methods go on.
    void run(const std::vector<DistTensor>& grads);

   private:
    friend class Optimizer;
    explicit StepReservation(Optimizer* optimizer) : optimizer_(optimizer) {}
    void release();
    Optimizer* optimizer_ = nullptr;
  };
  StepReservation reserve_step();

  double lr() const { return lr_; }
  void set_lr(double lr);

  const std::vector<DistTensor>& params() const { return params_; }
  // The state of parameter `index` (empty until its first update); the reference is
  // not protected by the lock (read it while no step runs).
  const ParamState& state(size_t index) const;
  // Every state tensor as "<param index>.<name>" (e.g. "3.exp_avg"), for checkpoints
  // and tests; the step counts as "<param index>.step" in step_counts().
  std::map<std::string, DistTensor> state_dict() const;
  std::map<std::string, int64_t> step_counts() const;
  // Restores what state_dict()/step_counts() returned (values are copied into this
  // optimizer's own tensors, which are created in the parameters' layouts when
  // missing). Shapes must match the parameters. A key naming no parameter or a state
  // this optimizer does not keep ("3.momentum" for AdamW) is an error; with `strict`
  // so is a missing one: every parameter's "<i>.step", and for a parameter that has
  // taken steps every state it keeps (state_names). Nothing is changed when a key is
  // rejected.
  void load_state_dict(const std::map<std::string, DistTensor>& tensors, const std::map<std::string, int64_t>& steps,
                       bool strict = true);
  // The state tensors parameter `index` holds once it has been updated.
  std::vector<std::string> state_names(size_t index) const;

  const std::string& name() const { return name_; }

 protected:
  Optimizer(std::vector<DistTensor> params, double lr, bool master_weights, std::string name);

  // Computes the new value of one parameter from local pieces: `param` is the value
  // being optimized (the FP32 master under master_weights), `grad` the gradient in
  // param's dtype, `local_state` this rank's pieces of the state tensors (written in
  // place with Tensor::copy_). `state.step` already counts this update. A tensor the
  // update adds to local_state becomes a new state DistTensor in the parameter's
  // layout (SGD's momentum buffer starts as a copy of the first gradient, as in
  // PyTorch). Returns the new parameter value.
  virtual Tensor update(const Tensor& param, const Tensor& grad, const ParamState& state,
                        std::map<std::string, Tensor>& local_state) = 0;
  // State tensors created as zeros (parameter layout, optimized dtype) before the
  // first update.
  virtual std::vector<std::string> zero_state_names() const { return {}; }
  // State tensors the update itself adds (SGD's momentum buffer).
  virtual std::vector<std::string> created_state_names() const { return {}; }

 private:
  // The lock, once no reserved step is pending.
  std::unique_lock<std::mutex> lock_when_idle() const;
  // step(grads) with the lock held.
  void apply(const std::vector<DistTensor>& grads);
  // One parameter's update from its gradient in its own layout.
  void update_one(size_t index, const DistTensor& grad);
  void ensure_state(size_t index);
  // Throws when parameter `index` was replaced in its module (autograd::replaced_note).
  void check_in_place(size_t index) const;

  std::vector<DistTensor> params_;
  std::vector<ParamState> states_;
  mutable std::mutex mutex_;  // held by a step and by whatever reads or writes the state or lr_
  mutable std::condition_variable idle_;
  bool reserved_ = false;   // a StepReservation is pending
  std::atomic<double> lr_;  // read without the lock; written under it
  bool master_weights_;
  std::string name_;
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  // L2 (added to the gradient), as torch.optim.SGD
  bool nesterov = false;    // needs momentum > 0 and dampening == 0
  bool master_weights = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<DistTensor> params, double lr, double momentum = 0, double weight_decay = 0,
      bool nesterov = false);
  SGD(std::vector<DistTensor> params, const SGDOptions& options);
  const SGDOptions& options() const { return options_; }

 protected:
  Tensor update(const Tensor& param, const Tensor& grad, const ParamState& state,
                std::map<std::string, Tensor>& local_state) override;
  std::vector<std::string> created_state_names() const override;

 private:
  SGDOptions options_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p *= 1 - lr * weight_decay before the Adam step
  bool master_weights = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<DistTensor> params, double lr, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 0.01);
  AdamW(std::vector<DistTensor> params, const AdamWOptions& options);
  const AdamWOptions& options() const { return options_; }

 protected:
  Tensor update(const Tensor& param, const Tensor& grad, const ParamState& state,
                std::map<std::string, Tensor>& local_state) override;
  std::vector<std::string> zero_state_names() const override;

 private:
  AdamWOptions options_;
};

// Scales the gradients of `params` in place so that their global L2 norm is at most
// `max_norm`, and returns the norm before scaling. The norm is over the full
// gradients: per gradient sum(square(g)) is Partial(sum) over the mesh dims that
// shard it and plain over replicated ones, so nothing is counted twice; one
// all-reduce per distinct (mesh, layout) of those sums gives the total. Partial
// gradients are first redistributed to their parameter's layout (and stored back,
// see gradient_in_param_layout). Parameters without gradients do not count. A
// non-finite norm is returned and the gradients are left as they are (a loss scaler
// decides what to do with an overflow; scaling by NaN would destroy them).
// All parameters must live on meshes over the same ranks (pipeline stages need a
// further reduction across stages).
double clip_grad_norm(const std::vector<DistTensor>& params, double max_norm);
// Scales by a norm the caller computed (a pipeline's, over every stage); returns it.
double clip_grad_norm(const std::vector<DistTensor>& params, double max_norm, double total_norm);
// The same norm without scaling.
double grad_norm(const std::vector<DistTensor>& params);

// ---- learning-rate schedules -----------------------------------------------------------

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  // The learning rate of optimizer step `step` (0-based).
  virtual double lr_at(int64_t step) const = 0;
  // Sets the optimizer's lr for `step`; returns it.
  double apply(Optimizer& optimizer, int64_t step) const;
};

class ConstantLR : public LRSchedule {
 public:
  explicit ConstantLR(double lr);
  double lr_at(int64_t step) const override;

 private:
  double lr_;
};

// Linear warmup then cosine decay (the GPT-2/3 and nanoGPT schedule):
//   step <  warmup:          base_lr * (step + 1) / warmup_steps
//   warmup <= step < total:  min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2,
//                            p = (step - warmup) / (total - warmup)
//   step >= total:           min_lr
// So the last warmup step and the first decay step both use base_lr.
class WarmupCosine : public LRSchedule {
 public:
  WarmupCosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  double lr_at(int64_t step) const override;

 private:
  double base_lr_, min_lr_;
  int64_t warmup_steps_, total_steps_;
};

}  // namespace dtensor
