// The state of a training run as one StateDict, and loading it back (checkpoint.h,
// TrainState).
#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "checkpoint/load_entries.h"
#include "dtensor/amp.h"
#include "dtensor/autograd.h"
#include "dtensor/checkpoint.h"
#include "dtensor/data.h"
#include "dtensor/nn/module.h"
#include "dtensor/optim.h"
#include "util/check.h"

namespace dtensor::checkpoint {

namespace {

constexpr const char* kOp = "checkpoint::TrainState";

// Every parameter of the modules by name; a name met twice on this rank (a tied copy)
// is kept once in `params`, the later handles in `aliases`.
struct NamedParams {
  std::vector<std::pair<std::string, DistTensor>> params;
  std::vector<std::pair<std::string, DistTensor>> aliases;
  std::unordered_map<const DistTensor::Impl*, std::string> name_of;
};

NamedParams named_params(const TrainState& state) {
  NamedParams out;
  std::map<std::string, size_t> seen;
  for (nn::Module* m : state.modules) {
    DT_CHECK_ARG(m != nullptr, kOp, "a module pointer is null");
    for (auto& [name, p] : m->named_parameters()) {
      out.name_of[p.impl().get()] = name;
      if (seen.count(name)) {
        out.aliases.emplace_back(name, p);
      } else {
        seen[name] = out.params.size();
        out.params.emplace_back(name, p);
      }
    }
  }
  return out;
}

// The name of each optimizer parameter, through the modules.
std::vector<std::string> optimizer_param_names(const Optimizer& optimizer, const NamedParams& named) {
  std::vector<std::string> names;
  for (size_t i = 0; i < optimizer.params().size(); ++i) {
    const auto it = named.name_of.find(optimizer.params()[i].impl().get());
    DT_CHECK_ARG(it != named.name_of.end(), kOp, "optimizer parameter ", i, " (", optimizer.params()[i].to_string(),
                 ") is held by none of the modules: build the optimizer from their parameters after the parallel "
                 "wrappers re-laid them out");
    names.push_back(it->second);
  }
  return names;
}

int64_t seed_bits(uint64_t seed) {
  int64_t bits;
  std::memcpy(&bits, &seed, sizeof bits);
  return bits;
}

// The sampler's identity against the checkpoint's (before anything is loaded).
void check_sampler(const DistributedSampler& sampler, const Manifest& manifest, const std::string& dir) {
  const auto saved = [&](const char* name) -> std::optional<int64_t> {
    const auto it = manifest.entries.find(name);
    if (it == manifest.entries.end() || !it->second.value) return std::nullopt;
    if (const auto* v = std::get_if<int64_t>(&*it->second.value)) return *v;
    return std::nullopt;
  };
  const std::pair<const char*, int64_t> mine[] = {{"data.global_batch", sampler.global_batch()},
                                                  {"data.seed", seed_bits(sampler.seed())},
                                                  {"data.dataset_size", sampler.dataset_size()},
                                                  {"data.shuffle", sampler.shuffle() ? 1 : 0}};
  for (const auto& [name, value] : mine) {
    const std::optional<int64_t> theirs = saved(name);
    DT_CHECK_ARG(theirs.has_value(), "checkpoint::load", "\"", dir, "\" has no entry '", name,
                 "' (saved without a sampler)");
    DT_CHECK_ARG(*theirs == value, "checkpoint::load", "\"", dir, "\": the sampler's ", name + 5, " is ", value,
                 ", the checkpoint was saved with ", *theirs,
                 " (the resumed run would see other samples; keep the global batch, seed and dataset)");
  }
}

}  // namespace

StateDict train_state_dict(const TrainState& state) {
  StateDict out;
  const NamedParams named = named_params(state);
  for (const auto& [name, p] : named.params) out["model." + name] = p;
  for (nn::Module* m : state.modules) {
    for (const auto& [name, value] : m->named_extra_state()) out.emplace("model." + name, value);
  }
  if (state.optimizer) {
    const std::vector<std::string> names = optimizer_param_names(*state.optimizer, named);
    for (size_t i = 0; i < names.size(); ++i) {
      const ParamState& st = state.optimizer->state(i);
      if (st.step == 0 && st.tensors.empty()) continue;
      for (const auto& [key, t] : st.tensors) out.emplace("optim." + names[i] + "." + key, t);
      out.emplace("optim." + names[i] + ".step", st.step);
    }
    out["optim.lr"] = state.optimizer->lr();
  }
  if (state.scaler) {
    const LossScalerState s = state.scaler->state();
    out["scaler.scale"] = s.scale;
    out["scaler.clean_steps"] = s.clean_steps;
    out["scaler.skipped_steps"] = s.skipped_steps;
  }
  if (state.sampler) {
    out["data.global_batch"] = state.sampler->global_batch();
    out["data.seed"] = seed_bits(state.sampler->seed());
    out["data.dataset_size"] = state.sampler->dataset_size();
    out["data.shuffle"] = int64_t{state.sampler->shuffle() ? 1 : 0};
  }
  out["train.step"] = state.step;
  for (const auto& [name, value] : state.extra) {
    DT_CHECK_ARG(!out.count(name), kOp, "extra entry '", name, "' has the name of an entry the state already holds");
    out[name] = value;
  }
  return out;
}

SaveStats save(const std::string& dir, const TrainState& state, const Group& group, const SaveOptions& options) {
  return save(dir, train_state_dict(state), group, options);
}

LoadStats load(const std::string& dir, TrainState& state, const Group& group, const LoadOptions& options) {
  // The manifest is read once: for the targets here and for the load itself.
  const detail::ManifestData data = detail::read_manifest_data(dir, "checkpoint::load");
  const Manifest manifest = detail::summarize(data);
  if (state.sampler) check_sampler(*state.sampler, manifest, dir);
  const NamedParams named = named_params(state);

  // Targets: the parameters in place, the rest in fresh values.
  StateDict targets;
  for (const auto& [name, p] : named.params) targets["model." + name] = p;
  for (nn::Module* m : state.modules) {
    for (const auto& [name, value] : m->named_extra_state()) targets.emplace("model." + name, value);
  }
  std::vector<std::string> names;
  if (state.optimizer) {
    names = optimizer_param_names(*state.optimizer, named);
    for (size_t i = 0; i < names.size(); ++i) {
      const DistTensor& p = state.optimizer->params()[i];
      const std::string prefix = "optim." + names[i] + ".";
      for (auto it = manifest.entries.lower_bound(prefix);
           it != manifest.entries.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
        const std::string key = it->first.substr(prefix.size());
        if (key.find('.') != std::string::npos || targets.count(it->first)) continue;  // another parameter's
        if (it->second.kind == EntryKind::DistTensor || it->second.kind == EntryKind::Tensor) {
          // In the parameter's layout and on its device, in the saved dtype.
          const Shape local = local_shape(p.shape(), p.mesh().shape(), p.placements(), p.mesh().coordinate());
          targets[it->first] = DistTensor::from_local(Tensor::empty(local, it->second.dtype, p.device()), p.mesh(),
                                                      p.placements(), p.shape());
        } else {
          targets[it->first] = int64_t{0};
        }
      }
    }
    targets["optim.lr"] = 0.0;
  }
  if (state.scaler) {
    targets["scaler.scale"] = 0.0;
    targets["scaler.clean_steps"] = int64_t{0};
    targets["scaler.skipped_steps"] = int64_t{0};
  }
  targets["train.step"] = int64_t{0};
  for (const auto& [name, value] : state.extra) {
    DT_CHECK_ARG(!targets.count(name), kOp, "extra entry '", name,
                 "' has the name of an entry the state already holds");
    targets[name] = value;
  }

  LoadStats stats = detail::load_entries(
      "checkpoint::load", dir, dir, [&] { return data; }, targets, group, options);
  const std::set<std::string> missing(stats.missing.begin(), stats.missing.end());
  const auto loaded = [&](const std::string& name) { return targets.count(name) && !missing.count(name); };

  // Apply what is not loaded in place (every rank succeeded; nothing below reads files).
  NoGradGuard no_grad;
  for (const auto& [name, alias] : named.aliases) {
    const DistTensor& first = std::get<DistTensor>(targets.at("model." + name));
    DT_CHECK_SUPPORTED(first.mesh() == alias.mesh() && first.placements() == alias.placements(), kOp, "parameter '",
                       name, "' appears twice on this rank in different layouts");
    Tensor(alias.to_local()).copy_(first.to_local());
  }
  for (nn::Module* m : state.modules) {
    std::map<std::string, int64_t> extra;
    for (const auto& [name, value] : m->named_extra_state()) {
      extra[name] = loaded("model." + name) ? std::get<int64_t>(targets.at("model." + name)) : value;
    }
    m->load_named_extra_state(extra);
  }
  if (state.optimizer) {
    std::map<std::string, DistTensor> tensors;
    std::map<std::string, int64_t> steps;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string prefix = "optim." + names[i] + ".";
      for (auto it = targets.lower_bound(prefix);
           it != targets.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
        const std::string key = it->first.substr(prefix.size());
        if (key.find('.') != std::string::npos || missing.count(it->first)) continue;
        if (const auto* t = std::get_if<DistTensor>(&it->second)) {
          tensors[std::to_string(i) + "." + key] = *t;
        } else if (key == "step") {
          steps[std::to_string(i) + ".step"] = std::get<int64_t>(it->second);
        }
      }
    }
    // Under LoadOptions::allow_missing a part of the optimizer's state may be absent.
    const bool complete = std::none_of(missing.begin(), missing.end(),
                                       [](const std::string& name) { return name.rfind("optim.", 0) == 0; });
    state.optimizer->load_state_dict(tensors, steps, complete);
    if (loaded("optim.lr")) state.optimizer->set_lr(std::get<double>(targets.at("optim.lr")));
  }
  if (state.scaler && loaded("scaler.scale")) {
    state.scaler->load_state({std::get<double>(targets.at("scaler.scale")),
                              std::get<int64_t>(targets.at("scaler.clean_steps")),
                              std::get<int64_t>(targets.at("scaler.skipped_steps"))});
  }
  if (loaded("train.step")) state.step = std::get<int64_t>(targets.at("train.step"));
  for (auto& [name, value] : state.extra) {
    if (loaded(name)) value = targets.at(name);
  }
  for (nn::Module* m : state.modules) m->notify_state_loaded();
  return stats;
}

}  // namespace dtensor::checkpoint
