// nn::Module bookkeeping.
#include "dtensor/nn/module.h"

#include <set>

#include "dtensor/autograd.h"

namespace dtensor::nn {

DistTensor Module::operator()(const DistTensor& x) {
  for (const PreHook& hook : pre_hooks_) hook(*this, x);
  DistTensor y = forward(x);
  for (const PostHook& hook : post_hooks_) hook(*this, x, y);
  return y;
}

DistTensor& Module::register_parameter(const std::string& name, DistTensor value) {
  DT_CHECK_ARG(value.defined(), "register_parameter", "parameter '", name, "' is undefined");
  for (const auto& [existing, _] : params_) {
    DT_CHECK_ARG(existing != name, "register_parameter", "parameter '", name, "' is registered twice");
  }
  value = value.detach();
  value.set_requires_grad(true);
  params_.emplace_back(name, value);
  return params_.back().second;
}

std::vector<std::pair<std::string, DistTensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, DistTensor>> out(params_.begin(), params_.end());
  for (const auto& [name, child] : children_) {
    for (auto& [sub, p] : child->named_parameters()) out.emplace_back(name + "." + sub, p);
  }
  return out;
}

std::vector<DistTensor> Module::parameters() const {
  std::vector<DistTensor> out;
  for (auto& [_, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [name, child] : children_) {
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [_, p] : named_parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, child] : children_) child->train(on);
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, p] : named_parameters()) out[name] = p.full_tensor();
  return out;
}

void Module::set_parameter(const std::string& dotted_name, const DistTensor& value) {
  const size_t dot = dotted_name.find('.');
  if (dot == std::string::npos) {
    for (auto& [name, p] : params_) {
      if (name != dotted_name) continue;
      DT_CHECK_ARG(value.shape() == p.shape(), "set_parameter", "parameter '", dotted_name, "' has shape ",
                   p.shape(), ", the new value ", value.shape());
      p = value.detach();
      p.set_requires_grad(true);
      return;
    }
  } else {
    const std::string head = dotted_name.substr(0, dot);
    for (auto& [name, child] : children_) {
      if (name == head) return child->set_parameter(dotted_name.substr(dot + 1), value);
    }
  }
  throw std::invalid_argument("[set_parameter] no parameter named '" + dotted_name + "'");
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  std::set<std::string> seen;
  for (const auto& [name, p] : named_parameters()) {
    auto it = state.find(name);
    if (it == state.end()) {
      DT_CHECK_ARG(!strict, "load_state_dict", "missing parameter '", name, "'");
      continue;
    }
    DT_CHECK_ARG(it->second.shape() == p.shape(), "load_state_dict", "parameter '", name, "': expected shape ",
                 p.shape(), ", got ", it->second.shape());
    seen.insert(name);
    NoGradGuard no_grad;
    const DistTensor loaded = distribute(it->second.to(p.dtype()), p.mesh(), p.placements());
    Tensor local = p.to_local();
    local.copy_(loaded.to_local());
  }
  if (strict) {
    for (const auto& [name, _] : state) {
      DT_CHECK_ARG(seen.count(name), "load_state_dict", "unexpected parameter '", name, "'");
    }
  }
}

uint64_t derive_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace dtensor::nn
