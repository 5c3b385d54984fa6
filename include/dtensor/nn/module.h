// nn::Module: named parameters and sub-modules, train/eval, state dicts and hooks.
//
// Parameters are DistTensors on a DeviceMesh. Modules create them replicated and
// initialise them through layout-independent randomness (randn on a mesh), so the
// same seed gives the same model on one rank or on any mesh; parallel wrappers
// (DDP, later FSDP and tensor parallel) change the layouts, not the values.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's computation on one input (multi-input modules add their own
  // entry points). operator() runs the hooks around it.
  virtual DistTensor forward(const DistTensor& x) = 0;
  DistTensor operator()(const DistTensor& x);

  // "blocks.0.attn.q.weight" -> parameter, depth first in registration order.
  std::vector<std::pair<std::string, DistTensor>> named_parameters() const;
  std::vector<DistTensor> parameters() const;
  std::vector<std::pair<std::string, Module*>> named_modules();
  int64_t num_parameters() const;  // global element count

  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // Full tensors by name (collective: gathers sharded parameters).
  std::map<std::string, Tensor> state_dict() const;
  // Copies full tensors into the parameters, keeping their layouts. With strict,
  // missing and unexpected names and shape mismatches are errors naming them.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  using PreHook = std::function<void(Module&, const DistTensor& input)>;
  using PostHook = std::function<void(Module&, const DistTensor& input, const DistTensor& output)>;
  void register_forward_pre_hook(PreHook hook) { pre_hooks_.push_back(std::move(hook)); }
  void register_forward_post_hook(PostHook hook) { post_hooks_.push_back(std::move(hook)); }

  // Replaces a parameter's tensor (same name; e.g. a parallel wrapper changing its
  // layout). The new tensor becomes a leaf that requires grad.
  void set_parameter(const std::string& dotted_name, const DistTensor& value);

 protected:
  // Registers a parameter (made a leaf that requires grad) and returns it.
  DistTensor& register_parameter(const std::string& name, DistTensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

 private:
  // A deque: layers keep pointers to their parameters, which push_back must not move.
  std::deque<std::pair<std::string, DistTensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<PreHook> pre_hooks_;
  std::vector<PostHook> post_hooks_;
  bool training_ = true;
};

// A seed for parameter `index` of a module seeded with `seed` (splitmix64), so
// every parameter draws from its own stream.
uint64_t derive_seed(uint64_t seed, uint64_t index);

}  // namespace dtensor::nn
