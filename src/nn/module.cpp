// nn::Module bookkeeping.
#include "dtensor/nn/module.h"

#include <set>
#include <stdexcept>
#include <string_view>
#include <typeinfo>
#include <unordered_set>

#include "dtensor/autograd.h"
#include "util/check.h"

namespace dtensor::nn {

namespace {

template <class Hook>
std::function<void()> remover(const std::shared_ptr<std::vector<std::pair<uint64_t, Hook>>>& list, uint64_t id) {
  return [weak = std::weak_ptr(list), id] {
    if (auto hooks = weak.lock()) std::erase_if(*hooks, [id](const auto& entry) { return entry.first == id; });
  };
}

}  // namespace

HookHandle Module::add_pre_hook(PreHook hook) {
  pre_hooks_->emplace_back(next_hook_id_, std::move(hook));
  return HookHandle(remover(pre_hooks_, next_hook_id_++));
}

HookHandle Module::add_post_hook(PostHook hook) {
  post_hooks_->emplace_back(next_hook_id_, std::move(hook));
  return HookHandle(remover(post_hooks_, next_hook_id_++));
}

void HookHandle::remove() {
  if (remove_) remove_();
  remove_ = nullptr;
}

Module::~Module() {
  for (auto& [_, child] : children_) {
    if (child->parent_ == this) child->parent_ = nullptr;
  }
}

void Module::adopt(const std::string& name, std::shared_ptr<Module> child) {
  DT_CHECK_ARG(child != nullptr, "register_module", "module '", name, "' is null");
  // A module registered in two places (shared weights) keeps its first path.
  if (!child->parent_) {
    child->parent_ = this;
    child->name_in_parent_ = name;
  }
  children_.emplace_back(name, std::move(child));
}

std::string Module::path() const {
  // A module whose parent went away first (a pipeline stage's slice outliving the
  // whole model) keeps the name it had there.
  std::string out;
  for (const Module* m = this; m; m = m->parent_) {
    if (m->name_in_parent_.empty()) continue;
    out = out.empty() ? m->name_in_parent_ : m->name_in_parent_ + "." + out;
  }
  return out;
}

namespace {

constexpr std::string_view kInModule = " (in module '";

}  // namespace

DistTensor Module::operator()(const DistTensor& x) {
  try {
    return call(x);
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    // The innermost module adds its path; the ones around it leave it.
    if (message.find(kInModule) != std::string::npos || typeid(e) != typeid(std::invalid_argument)) throw;
    const std::string where = path();
    throw std::invalid_argument(
        message + (where.empty() ? std::string(" (in the root module)") : std::string(kInModule) + where + "')"));
  }
}

DistTensor Module::call(const DistTensor& x) {
  DistTensor in = x;
  // Copies of the lists: a hook may remove itself (or others) while running.
  const HookList<PreHook> pre = *pre_hooks_;
  for (const auto& [_, hook] : pre) {
    if (std::optional<DistTensor> replaced = hook(*this, in)) in = std::move(*replaced);
  }
  DistTensor y = forward(in);
  const HookList<PostHook> post = *post_hooks_;
  for (const auto& [_, hook] : post) {
    if (std::optional<DistTensor> replaced = hook(*this, in, y)) y = std::move(*replaced);
  }
  return y;
}

DistTensor& Module::register_parameter(const std::string& name, DistTensor value) {
  DT_CHECK_ARG(value.defined(), "register_parameter", "parameter '", name, "' is undefined");
  DT_CHECK_ARG(!name.empty() && name.find('.') == std::string::npos, "register_parameter",
               "expected a parameter name without dots (sub-modules make the dotted names), got '", name, "'");
  for (const auto& [existing, _] : params_) {
    DT_CHECK_ARG(existing != name, "register_parameter", "parameter '", name, "' is registered twice");
  }
  value = value.detach();
  value.set_requires_grad(true);
  params_.emplace_back(name, value);
  return params_.back().second;
}

namespace {

// Depth first in registration order; a module registered in several places (a
// tied head holding the input embedding) is visited at its first path only, as
// PyTorch's named_modules and named_parameters do.
template <class ModuleT, class Visit>
void walk(ModuleT& module, const std::string& path, std::unordered_set<const Module*>& seen, const Visit& visit) {
  if (!seen.insert(&module).second) return;
  visit(path, module);
  for (const auto& [name, child] : module.children()) {
    walk(static_cast<ModuleT&>(*child), path.empty() ? name : path + "." + name, seen, visit);
  }
}

}  // namespace

std::vector<std::pair<std::string, DistTensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, DistTensor>> out;
  std::unordered_set<const Module*> seen;
  walk(*this, "", seen, [&](const std::string& path, const Module& m) {
    for (const auto& [name, p] : m.params_) out.emplace_back(path.empty() ? name : path + "." + name, p);
  });
  return out;
}

std::vector<DistTensor> Module::parameters() const {
  std::vector<DistTensor> out;
  for (auto& [_, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  std::unordered_set<const Module*> seen;
  walk(*this, "", seen, [&](const std::string& path, Module& m) { out.emplace_back(path, &m); });
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [_, p] : named_parameters()) n += p.numel();
  return n;
}

void Module::zero_grad() {
  for (const auto& [_, p] : named_parameters()) p.zero_grad();
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

std::pair<Module*, std::string> Module::owner_of(const std::string& dotted_name) {
  // Child names may contain dots themselves ("blocks.0"): the longest child name
  // that prefixes the rest wins.
  Module* module = this;
  std::string rest = dotted_name;
  for (;;) {
    Module* next = nullptr;
    size_t used = 0;
    for (auto& [name, child] : module->children_) {
      if (name.size() > used && rest.size() > name.size() && rest.compare(0, name.size(), name) == 0 &&
          rest[name.size()] == '.') {
        next = child.get();
        used = name.size();
      }
    }
    if (!next) return {module, rest};
    module = next;
    rest = rest.substr(used + 1);
  }
}

DistTensor& Module::checked_slot(const std::string& dotted_name, const DistTensor& value, const char* op) {
  auto [owner, name] = owner_of(dotted_name);
  for (auto& [own, p] : owner->params_) {
    if (own != name) continue;
    DT_CHECK_ARG(value.defined(), op, "the new value of '", dotted_name, "' is undefined");
    DT_CHECK_ARG(value.shape() == p.shape(), op, "parameter '", dotted_name, "' has shape ", p.shape(),
                 ", the new value ", value.shape());
    return p;
  }
  throw std::invalid_argument(std::string("[") + op + "] no parameter named '" + dotted_name + "'");
}

Module& Module::to(Device device) {
  const std::string where = path();
  for (const auto& [name, p] : named_parameters()) {
    if (p.device() == device) continue;
    mark_replaced(p, "'" + (where.empty() ? name : where + "." + name) + "' was moved to " + device.to_string() +
                         " by Module::to");
    set_parameter(name, p.detach().to(device));
  }
  return *this;
}

void Module::set_parameter(const std::string& dotted_name, const DistTensor& value) {
  DistTensor& p = checked_slot(dotted_name, value, "set_parameter");
  if (p.impl() != value.impl()) {
    const std::string where = path();
    mark_replaced(p,
                  "'" + (where.empty() ? dotted_name : where + "." + dotted_name) + "' was replaced by set_parameter");
  }
  p = value.detach();
  p.set_requires_grad(true);
}

DistTensor Module::swap_parameter(const std::string& dotted_name, const DistTensor& value) {
  DistTensor& p = checked_slot(dotted_name, value, "swap_parameter");
  DistTensor previous = p;
  p = value;
  return previous;
}

Module& Module::submodule(const std::string& dotted_name) {
  if (dotted_name.empty()) return *this;
  auto [owner, name] = owner_of(dotted_name);
  for (auto& [own, child] : owner->children_) {
    if (own == name) return *child;
  }
  throw std::invalid_argument("[submodule] no module named '" + dotted_name + "'");
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
  notify_state_loaded();
}

void Module::load_extra_state(const std::map<std::string, int64_t>& state) {
  DT_CHECK_ARG(state.empty(), "load_extra_state", "this module keeps no extra state, got '", state.begin()->first, "'");
}

std::map<std::string, int64_t> Module::named_extra_state() {
  std::map<std::string, int64_t> out;
  for (const auto& [path, m] : named_modules()) {
    for (const auto& [name, value] : m->extra_state()) out[path.empty() ? name : path + "." + name] = value;
  }
  return out;
}

void Module::load_named_extra_state(const std::map<std::string, int64_t>& state) {
  std::map<std::string, int64_t> left = state;
  for (const auto& [path, m] : named_modules()) {
    std::map<std::string, int64_t> own;
    for (const auto& [name, _] : m->extra_state()) {
      const std::string full = path.empty() ? name : path + "." + name;
      const auto it = left.find(full);
      DT_CHECK_ARG(it != left.end(), "load_extra_state", "missing extra state '", full, "'");
      own[name] = it->second;
      left.erase(it);
    }
    if (!own.empty()) m->load_extra_state(own);
  }
  DT_CHECK_ARG(left.empty(), "load_extra_state", "unexpected extra state '", left.begin()->first, "'");
}

HookHandle Module::register_state_loaded_hook(std::function<void(Module&)> hook) {
  loaded_hooks_->emplace_back(next_hook_id_, std::move(hook));
  return HookHandle(remover(loaded_hooks_, next_hook_id_++));
}

void Module::notify_state_loaded() {
  for (const auto& [_, m] : named_modules()) {
    const auto hooks = *m->loaded_hooks_;
    for (const auto& [id, hook] : hooks) hook(*m);
  }
}

uint64_t derive_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace dtensor::nn
