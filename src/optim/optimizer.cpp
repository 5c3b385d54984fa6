// The Optimizer base: gradient layout, state creation, master weights, the step loop.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "dist_tensor/dist_tensor_impl.h"
#include "dtensor/autograd.h"
#include "dtensor/optim.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {

namespace {

bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }

// A DistTensor in `like`'s layout around `local` (no communication: the global shape
// is known, so from_local only checks the local shape).
DistTensor wrap_like(const Tensor& local, const DistTensor& like) {
  return DistTensor::from_local(local, like.mesh(), like.placements(), like.shape());
}

std::string names_to_string(const std::vector<std::string>& names) {
  if (names.empty()) return "none";
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

DistTensor gradient_in_param_layout(const DistTensor& param) {
  DistTensor grad = param.grad();
  if (!grad.defined()) return grad;
  DT_CHECK_ARG(grad.mesh() == param.mesh(), "optimizer", "gradient lives on mesh ",
               grad.mesh().to_string(), ", expected the parameter's mesh ", param.mesh().to_string());
  if (grad.placements() == param.placements()) return grad;
  // Partial(sum) -> Replicate is the data-parallel all-reduce; Partial -> Shard a
  // reduce-scatter (ZeRO-2 style). Stored back so that clipping and step share it.
  NoGradGuard no_grad;
  DistTensor moved = grad.redistribute(param.placements());
  param.set_grad(moved);
  return moved;
}

Optimizer::Optimizer(std::vector<DistTensor> params, double lr, bool master_weights, std::string name)
    : params_(std::move(params)), lr_(lr), master_weights_(master_weights), name_(std::move(name)) {
  DT_CHECK_ARG(std::isfinite(lr) && lr >= 0, name_, "expected a learning rate >= 0, got ", lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const DistTensor& p = params_[i];
    DT_CHECK_ARG(p.defined(), name_, "parameter ", i, " is an undefined DistTensor");
    DT_CHECK_ARG(is_floating(p.dtype()), name_, "parameter ", i, " must be floating point, got ",
                 dtype_name(p.dtype()));
    DT_CHECK_ARG(p.is_leaf(), name_, "parameter ", i, " must be a leaf (produced by no op), got one from ",
                 p.grad_fn_name());
    check_in_place(i);
    for (size_t j = 0; j < i; ++j) {
      DT_CHECK_ARG(params_[j].impl() != p.impl(), name_, "parameter ", i, " repeats parameter ", j);
    }
  }
  states_.resize(params_.size());
}

void Optimizer::set_lr(double lr) {
  DT_CHECK_ARG(std::isfinite(lr) && lr >= 0, name_, "expected a learning rate >= 0, got ", lr);
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  lr_ = lr;
}

const ParamState& Optimizer::state(size_t index) const {
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  DT_CHECK_ARG(index < states_.size(), name_, "parameter index ", index, " out of range: ",
               states_.size(), " parameters");
  return states_[index];
}

void Optimizer::ensure_state(size_t index) {
  ParamState& st = states_[index];
  const DistTensor& p = params_[index];
  if (master_weights_ && is_half(p.dtype()) && !st.tensors.count("master")) {
    st.tensors["master"] = wrap_like(p.to_local().to(DType::F32).clone(), p);
  }
  const DType dtype = st.tensors.count("master") ? DType::F32 : p.dtype();
  for (const std::string& name : zero_state_names()) {
    if (!st.tensors.count(name)) {
      st.tensors[name] = wrap_like(Tensor::zeros(p.to_local().shape(), dtype, p.device()), p);
    }
  }
}

void Optimizer::check_in_place(size_t index) const {
  const std::string& note = replaced_note(params_[index]);
  DT_CHECK_ARG(note.empty(), name_, "parameter ", index, " (shape ", params_[index].shape(), "): ", note,
               ", so no forward reads this tensor any more; build the optimizer from model.parameters() after "
               "parallelize_module, fully_shard, DDP and Module::to");
}

void Optimizer::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) check_in_place(i);
  // The gradients first (collective when a layout differs), then the updates (local).
  std::vector<DistTensor> grads;
  grads.reserve(params_.size());
  for (const DistTensor& p : params_) grads.push_back(gradient_in_param_layout(p));
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  apply(grads);
}

void Optimizer::step(const std::vector<DistTensor>& grads) {
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  apply(grads);
}

void Optimizer::apply(const std::vector<DistTensor>& grads) {
  DT_CHECK_ARG(grads.size() == params_.size(), name_, "step: expected one gradient per parameter (", params_.size(),
               "), got ", grads.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const DistTensor& g = grads[i];
    const DistTensor& p = params_[i];
    if (!g.defined()) continue;
    DT_CHECK_ARG(g.mesh() == p.mesh() && g.placements() == p.placements() && g.shape() == p.shape(), name_,
                 "step: gradient ", i, " is ", g.shape(), " ", placements_to_string(g.placements()), " on mesh ",
                 g.mesh().to_string(), ", expected its parameter's ", p.shape(), " ",
                 placements_to_string(p.placements()), " on mesh ", p.mesh().to_string());
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (grads[i].defined()) update_one(i, grads[i]);
  }
}

std::unique_lock<std::mutex> Optimizer::lock_when_idle() const {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return !reserved_; });
  return lock;
}

Optimizer::StepReservation Optimizer::reserve_step() {
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  reserved_ = true;
  return StepReservation(this);
}

void Optimizer::StepReservation::run(const std::vector<DistTensor>& grads) {
  DT_CHECK_ARG(optimizer_ != nullptr, "optimizer", "StepReservation::run: this reservation is empty or has run");
  struct Release {
    StepReservation* r;
    ~Release() { r->release(); }
  } release{this};
  const std::lock_guard<std::mutex> lock(optimizer_->mutex_);
  optimizer_->apply(grads);
}

void Optimizer::StepReservation::release() {
  Optimizer* o = std::exchange(optimizer_, nullptr);
  if (!o) return;
  {
    const std::lock_guard<std::mutex> lock(o->mutex_);
    o->reserved_ = false;
  }
  o->idle_.notify_all();
}

Optimizer::StepReservation& Optimizer::StepReservation::operator=(StepReservation&& other) noexcept {
  if (this != &other) {
    release();
    optimizer_ = std::exchange(other.optimizer_, nullptr);
  }
  return *this;
}

void Optimizer::update_one(size_t i, const DistTensor& grad) {
  const DistTensor& p = params_[i];
  ensure_state(i);
  ParamState& st = states_[i];
  const auto master = st.tensors.find("master");
  // The tensor being optimized: the FP32 master or the parameter itself.
  const Tensor target = master != st.tensors.end() ? master->second.to_local() : p.to_local();
  std::map<std::string, Tensor> local_state;
  for (const auto& [name, t] : st.tensors) {
    if (name != "master") local_state[name] = t.to_local();
  }
  ++st.step;
  // The gradient is in the parameter's layout (gradient_in_param_layout checked it).
  const Tensor updated = update(target, local_of(grad).to(target.dtype()), st, local_state);
  Tensor(target).copy_(updated);
  if (master != st.tensors.end()) Tensor(p.to_local()).copy_(target);  // rounds to 16 bits
  for (const auto& [name, local] : local_state) {
    if (!st.tensors.count(name)) st.tensors[name] = wrap_like(local, p);
  }
}

void Optimizer::zero_grad() {
  for (const DistTensor& p : params_) p.zero_grad();
}

std::map<std::string, DistTensor> Optimizer::state_dict() const {
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  std::map<std::string, DistTensor> out;
  for (size_t i = 0; i < states_.size(); ++i) {
    for (const auto& [name, t] : states_[i].tensors) out[std::to_string(i) + "." + name] = t;
  }
  return out;
}

std::map<std::string, int64_t> Optimizer::step_counts() const {
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  std::map<std::string, int64_t> out;
  for (size_t i = 0; i < states_.size(); ++i) out[std::to_string(i) + ".step"] = states_[i].step;
  return out;
}

namespace {

// "3.exp_avg" -> (3, "exp_avg"); throws naming the key when it is not of that form.
std::pair<size_t, std::string> split_state_key(const std::string& key, size_t num_params,
                                               const std::string& op) {
  const size_t dot = key.find('.');
  size_t index = 0;
  bool ok = dot != std::string::npos && dot > 0;
  for (size_t c = 0; ok && c < dot; ++c) {
    ok = key[c] >= '0' && key[c] <= '9';
    index = index * 10 + static_cast<size_t>(key[c] - '0');
  }
  DT_CHECK_ARG(ok && dot + 1 < key.size(), op, "state key \"", key,
               "\": expected \"<param index>.<name>\"");
  DT_CHECK_ARG(index < num_params, op, "state key \"", key, "\": parameter index ", index,
               " out of range, the optimizer has ", num_params, " parameters");
  return {index, key.substr(dot + 1)};
}

}  // namespace

std::vector<std::string> Optimizer::state_names(size_t index) const {
  const DistTensor& p = params_.at(index);
  std::vector<std::string> names = zero_state_names();
  for (std::string& name : created_state_names()) names.push_back(std::move(name));
  if (master_weights_ && is_half(p.dtype())) names.emplace_back("master");
  return names;
}

void Optimizer::load_state_dict(const std::map<std::string, DistTensor>& tensors,
                                const std::map<std::string, int64_t>& steps, bool strict) {
  const std::unique_lock<std::mutex> lock = lock_when_idle();
  // Every key is checked before anything is written, so a rejected state changes nothing.
  std::vector<std::optional<int64_t>> new_steps(params_.size());
  for (const auto& [key, value] : steps) {
    const auto [index, name] = split_state_key(key, params_.size(), name_);
    DT_CHECK_ARG(name == "step" && value >= 0, name_, "step key \"", key,
                 "\": expected \"<param index>.step\" with a count >= 0, got ", value);
    new_steps[index] = value;
  }
  std::vector<std::vector<std::string>> given(params_.size());
  for (const auto& [key, value] : tensors) {
    const auto [index, name] = split_state_key(key, params_.size(), name_);
    const std::vector<std::string> known = state_names(index);
    DT_CHECK_ARG(std::find(known.begin(), known.end(), name) != known.end(), name_, "state \"", key, "\": parameter ",
                 index, " keeps no state named \"", name, "\" (it keeps: ", names_to_string(known), ")");
    DT_CHECK_ARG(value.shape() == params_[index].shape(), name_, "state \"", key, "\" has shape ", value.shape(),
                 ", expected the parameter's ", params_[index].shape());
    given[index].push_back(name);
  }
  if (strict) {
    for (size_t i = 0; i < params_.size(); ++i) {
      DT_CHECK_ARG(new_steps[i].has_value(), name_, "missing \"", i, ".step\" (the state has ", steps.size(),
                   " step counts for ", params_.size(), " parameters; pass strict = false to load a part)");
      if (*new_steps[i] == 0) continue;
      for (const std::string& name : state_names(i)) {
        DT_CHECK_ARG(std::find(given[i].begin(), given[i].end(), name) != given[i].end(), name_, "missing state \"", i,
                     ".", name, "\" of parameter ", i, ", which has taken ", *new_steps[i], " steps");
      }
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (new_steps[i]) states_[i].step = *new_steps[i];
  }
  NoGradGuard no_grad;
  for (const auto& [key, value] : tensors) {
    const auto [index, name] = split_state_key(key, params_.size(), name_);
    const DistTensor& p = params_[index];
    // Any layout is accepted; the state lives in the parameter's.
    const DistTensor moved = value.placements() == p.placements() && value.mesh() == p.mesh()
                                 ? value
                                 : value.redistribute(p.mesh(), p.placements());
    ParamState& st = states_[index];
    auto it = st.tensors.find(name);
    if (it == st.tensors.end()) {
      st.tensors[name] = wrap_like(moved.to_local().clone(), p);
    } else {
      Tensor(it->second.to_local()).copy_(moved.to_local());
    }
  }
}

}  // namespace dtensor
