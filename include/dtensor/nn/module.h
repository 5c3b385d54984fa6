// nn::Module: named parameters and sub-modules, train/eval, state dicts and hooks.
//
// Parameters are DistTensors on a DeviceMesh. Modules create them replicated and
// initialise them through layout-independent randomness (randn on a mesh), so the
// same seed gives the same model on one rank or on any mesh; parallel wrappers
// (DDP, later FSDP and tensor parallel) change the layouts, not the values.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor::nn {

class Module;

// Returned by the hook registrations; remove() unregisters the hook (idempotent,
// safe after the module is gone).
class HookHandle {
 public:
  HookHandle() = default;
  void remove();

 private:
  friend class Module;
  explicit HookHandle(std::function<void()> remove) : remove_(std::move(remove)) {}
  std::function<void()> remove_;
};

class Module {
 public:
  virtual ~Module();
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's computation on one input (multi-input modules add their own
  // entry points). operator() runs the hooks around it; a std::invalid_argument from
  // inside it leaves with the module's path added ("... (in module 'blocks.0.fc1')"),
  // that of the innermost module it came through.
  virtual DistTensor forward(const DistTensor& x) = 0;
  DistTensor operator()(const DistTensor& x);
  // "blocks.0.fc1" from the outermost module this one is registered in ("" for that
  // module itself). A module registered in several places keeps its first path.
  std::string path() const;

  // "blocks.0.attn.q.weight" -> parameter, depth first in registration order. A
  // module registered in several places (a tied output head holding the input
  // embedding) is listed at its first path only, and its parameters once, as
  // PyTorch's named_modules and named_parameters do.
  std::vector<std::pair<std::string, DistTensor>> named_parameters() const;
  std::vector<DistTensor> parameters() const;
  std::vector<std::pair<std::string, Module*>> named_modules();
  int64_t num_parameters() const;  // global element count

  // Drops every parameter's gradient.
  void zero_grad();
  // Moves every parameter to `device` (layouts and values unchanged; each stays a
  // leaf that requires grad), as PyTorch's module.to(device). Gradients are
  // dropped: move the model before wrapping it in a parallel module or building its
  // optimizer, whose state follows the parameters' device. Returns *this.
  Module& to(Device device);

  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // Full tensors by name (collective: gathers sharded parameters).
  std::map<std::string, Tensor> state_dict() const;
  // Copies full tensors into the parameters, keeping their layouts. With strict,
  // missing and unexpected names and shape mismatches are errors naming them. Then
  // notify_state_loaded().
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

  // Numbers a module keeps beside its parameters that a resumed run needs to continue
  // exactly (Dropout: how many masks it has drawn), by name relative to the module.
  virtual std::map<std::string, int64_t> extra_state() const { return {}; }
  // Restores what extra_state() returned; names it does not know are errors.
  virtual void load_extra_state(const std::map<std::string, int64_t>& state);
  // Every module's extra_state as "<module path>.<name>" ("blocks.0.attn.dropout.calls"),
  // and loading it back (each module receives its own names; unknown ones are errors).
  std::map<std::string, int64_t> named_extra_state();
  void load_named_extra_state(const std::map<std::string, int64_t>& state);

  // Hooks run after the parameters were written in place from outside the optimizer
  // (load_state_dict, a checkpoint load), so that a wrapper keeping copies derived from
  // them (FSDP's gathered parameters) refreshes those. notify_state_loaded() runs the
  // hooks of this module and of every sub-module (local, no communication).
  HookHandle register_state_loaded_hook(std::function<void(Module&)> hook);
  void notify_state_loaded();

  // Forward hooks run in registration order around forward(). A pre-hook sees the
  // input and may replace it; a post-hook sees the input forward got and the
  // output, and may replace the output. A hook returns the replacement, or
  // std::nullopt to keep what it saw; hooks returning void only observe. Tensor
  // parallel styles move inputs and outputs between layouts this way.
  using PreHook = std::function<std::optional<DistTensor>(Module&, const DistTensor& input)>;
  using PostHook = std::function<std::optional<DistTensor>(Module&, const DistTensor& input, const DistTensor& output)>;
  template <class F>
  HookHandle register_forward_pre_hook(F&& hook) {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, Module&, const DistTensor&>>) {
      return add_pre_hook([h = std::forward<F>(hook)](Module& m, const DistTensor& in) -> std::optional<DistTensor> {
        h(m, in);
        return std::nullopt;
      });
    } else {
      return add_pre_hook(PreHook(std::forward<F>(hook)));
    }
  }
  template <class F>
  HookHandle register_forward_post_hook(F&& hook) {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, Module&, const DistTensor&, const DistTensor&>>) {
      return add_post_hook([h = std::forward<F>(hook)](Module& m, const DistTensor& in,
                                                       const DistTensor& out) -> std::optional<DistTensor> {
        h(m, in, out);
        return std::nullopt;
      });
    } else {
      return add_post_hook(PostHook(std::forward<F>(hook)));
    }
  }

  // Replaces a parameter's tensor (same name; e.g. a parallel wrapper changing its
  // layout). The new tensor becomes a leaf that requires grad. Names are the ones
  // named_parameters() gives ("blocks.0.attn.q.weight").
  void set_parameter(const std::string& dotted_name, const DistTensor& value);
  // Stores `value` itself as the parameter (no detach, requires_grad untouched) and
  // returns the handle it replaces: for wrappers that let forward compute with a
  // stand-in (FSDP installs the gathered parameter, the output of its all-gather
  // node, before a module's forward and puts the sharded leaf back after). Same
  // name and shape checks as set_parameter.
  DistTensor swap_parameter(const std::string& dotted_name, const DistTensor& value);
  // The sub-module at a name named_modules() gives ("" is this module).
  Module& submodule(const std::string& dotted_name);

  // The parallel modules that took this module's parameters over, in the order they
  // were applied ("fully_shard over dp", "DistributedDataParallel over dp",
  // "parallelize_module over tp"), so that a later one can refuse an order that
  // cannot work and name the module and the right order.
  const std::vector<std::string>& parallel_wrappers() const { return parallel_wrappers_; }
  // The modules registered in this one, by the name each was registered under.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  // The module this one is registered in (null for the outermost).
  const Module* parent() const { return parent_; }
  void add_parallel_wrapper(std::string description) { parallel_wrappers_.push_back(std::move(description)); }

 protected:
  // Registers a parameter (made a leaf that requires grad) and returns it.
  DistTensor& register_parameter(const std::string& name, DistTensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    adopt(name, module);
    return module;
  }

 private:
  void adopt(const std::string& name, std::shared_ptr<Module> child);
  DistTensor call(const DistTensor& x);  // the hooks and forward
  // Where this module is registered (cleared when that module goes away first).
  Module* parent_ = nullptr;
  std::string name_in_parent_;
  std::vector<std::string> parallel_wrappers_;
  // A deque: layers keep pointers to their parameters, which push_back must not move.
  std::deque<std::pair<std::string, DistTensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  // The module that owns the last component of a dotted name, and that component.
  std::pair<Module*, std::string> owner_of(const std::string& dotted_name);
  // The slot of parameter `dotted_name`, after checking that `value` may replace it.
  DistTensor& checked_slot(const std::string& dotted_name, const DistTensor& value, const char* op);
  template <class Hook>
  using HookList = std::vector<std::pair<uint64_t, Hook>>;
  HookHandle add_pre_hook(PreHook hook);
  HookHandle add_post_hook(PostHook hook);
  // Shared so that a HookHandle can outlive the module.
  std::shared_ptr<HookList<PreHook>> pre_hooks_ = std::make_shared<HookList<PreHook>>();
  std::shared_ptr<HookList<PostHook>> post_hooks_ = std::make_shared<HookList<PostHook>>();
  std::shared_ptr<HookList<std::function<void(Module&)>>> loaded_hooks_ =
      std::make_shared<HookList<std::function<void(Module&)>>>();
  uint64_t next_hook_id_ = 0;
  bool training_ = true;
};

// A seed for parameter `index` of a module seeded with `seed` (splitmix64), so
// every parameter draws from its own stream.
uint64_t derive_seed(uint64_t seed, uint64_t index);

}  // namespace dtensor::nn
