// Weight streaming (ZeRO-Inference): each unit's weight storages live on the host and
// are restored on the device, filled and released around the unit's forward.
#include "dtensor/parallel/weight_streaming.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>

#include "dtensor/autograd.h"
#include "dtensor/trace.h"
#include "util/check.h"

namespace dtensor::parallel {

namespace {
const char* kOp = "stream_weights";

std::string module_name(const nn::Module& m) {
  const std::string path = m.path();
  return path.empty() ? "the root module" : "module '" + path + "'";
}
}  // namespace

struct WeightStream::State {
  struct Weights {
    std::shared_ptr<Storage> storage;  // the device block the parameter views (released between uses)
    Tensor device;                     // all of it, as one flat tensor
    Tensor host;                       // its copy on the host
  };
  struct Unit {
    nn::Module* module = nullptr;
    std::string name;  // for errors
    std::vector<Weights> weights;
    std::vector<std::pair<std::string, std::shared_ptr<Storage>>> params;  // to notice a replaced parameter
    int64_t bytes = 0;
    bool resident = false;
  };
  std::vector<Unit> units;
  Device host;
  int prefetch = 1;
  std::vector<size_t> order;  // units in the order the first forward ran them
  bool order_frozen = false;
  bool detached = false;
  WeightStreamStats stats;
  std::vector<nn::HookHandle> hooks;

  void fetch(Unit& u, bool ahead) {
    if (u.resident) return;
    TraceSpan span("stream_weights_fetch", "comm");
    const auto t0 = std::chrono::steady_clock::now();
    for (Weights& w : u.weights) {
      w.storage->restore_memory();
      w.device.copy_(w.host);
    }
    u.resident = true;
    stats.fetch_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++stats.fetches;
    if (ahead) ++stats.prefetches;
    stats.bytes_fetched += u.bytes;
  }

  void release(Unit& u) {
    for (Weights& w : u.weights) w.storage->release_memory();
    u.resident = false;
  }

  void pre_forward(size_t index) {
    Unit& u = units[index];
    DT_CHECK_ARG(!grad_enabled(), kOp, u.name,
                 ": forward with gradients enabled; streamed weights are freed after forward, so run inference "
                 "under NoGradGuard (training with the weights on the host: FSDPOptions::offload)");
    const std::vector<std::pair<std::string, DistTensor>> now = u.module->named_parameters();
    for (size_t k = 0; k < u.params.size(); ++k) {
      const bool same = k < now.size() && now[k].second.to_local().storage() == u.params[k].second;
      DT_CHECK_ARG(same, kOp, u.name, ": parameter '", u.params[k].first,
                   "' was replaced after stream_weights took it; change parameters before stream_weights, or "
                   "detach() first");
    }
    if (!order_frozen && std::find(order.begin(), order.end(), index) == order.end()) order.push_back(index);
    fetch(u, false);
    if (!order_frozen) return;
    auto it = std::find(order.begin(), order.end(), index);
    int depth = prefetch;
    for (++it; depth > 0 && it != order.end(); ++it, --depth) fetch(units[*it], true);
  }
};

WeightStream stream_weights(nn::Module& module, const std::vector<nn::Module*>& units,
                            const WeightStreamOptions& options) {
  const std::string root = module_name(module);
  DT_CHECK_ARG(!units.empty(), kOp, root, ": expected at least one unit");
  DT_CHECK_ARG(options.prefetch >= 0, kOp, root, ": option prefetch is a number of units, expected 0 or more, got ",
               options.prefetch);
  const std::set<const nn::Module*> unit_set(units.begin(), units.end());
  DT_CHECK_ARG(unit_set.size() == units.size(), kOp, root, ": a unit is given twice");
  DT_CHECK_ARG(!unit_set.count(nullptr), kOp, root, ": a unit is null");
  // Every place a module is registered under `module` (a pipeline stage's blocks have
  // the whole model as parent(), so the tree is walked from `module`), with the unit
  // it sits in there (null: none). A module registered twice, as TiedLinear holds the
  // embedding, must sit in one unit at both places.
  std::map<const nn::Module*, const nn::Module*> enclosing;
  std::map<const nn::Module*, std::string> place;
  std::vector<const nn::Module*> visited;  // in walk order
  const std::function<void(const nn::Module*, const std::string&, const nn::Module*, const nn::Module*,
                           const std::string&)>
      walk = [&](const nn::Module* m, const std::string& path, const nn::Module* outer, const nn::Module* parent,
                 const std::string& name) {
        const bool is_unit = unit_set.count(m) > 0;
        DT_CHECK_ARG(!is_unit || !outer, kOp, module_name(*m), " is inside unit ", outer ? module_name(*outer) : "",
                     " (units are disjoint)");
        const nn::Module* unit = is_unit ? m : outer;
        auto [at, fresh] = enclosing.emplace(m, unit);
        if (!fresh) {
          // A unit's weights are read at the other place outside its forward.
          DT_CHECK_ARG(!is_unit && at->second == unit, kOp, module_name(*m), " is also registered as '", name, "' in ",
                       module_name(*parent), outer ? ", another unit" : ", outside the units",
                       " (a tied weight: put both users in one unit, or leave it out of the units)");
          return;
        }
        place[m] = path;
        visited.push_back(m);
        for (const auto& [child_name, child] : m->children()) {
          walk(child.get(), path.empty() ? child_name : path + "." + child_name, unit, m, child_name);
        }
      };
  walk(&module, "", nullptr, nullptr, "");
  for (nn::Module* u : units) {
    DT_CHECK_ARG(enclosing.count(u), kOp, module_name(*u), " is not ", root, " or one of its sub-modules");
    for (const nn::Module* m = u; m; m = m->parent()) {
      for (const std::string& w : m->parallel_wrappers()) {
        DT_CHECK_ARG(w.rfind("fully_shard", 0) != 0, kOp, module_name(*u), ": ", module_name(*m), " is wrapped by ", w,
                     "; FSDP gathers its own parameters (for training with them on the host: "
                     "FSDPOptions::offload)");
      }
    }
  }

  auto state = std::make_shared<WeightStream::State>();
  state->prefetch = options.prefetch;
  // Which unit owns each storage, to refuse sharing across units and with the rest.
  std::map<const Storage*, std::string> owner;
  std::optional<Device> device;
  for (nn::Module* u : units) {
    WeightStream::State::Unit unit;
    unit.module = u;
    unit.name = module_name(*u);
    for (auto& [name, p] : u->named_parameters()) {
      const Tensor local = p.to_local();
      const std::shared_ptr<Storage>& storage = local.storage();
      unit.params.emplace_back(name, storage);
      if (!storage || storage->bytes() == 0) continue;  // nothing to move
      if (!device) device = local.device();
      DT_CHECK_ARG(local.device() == *device, kOp, unit.name, ": parameter '", name, "' is on ",
                   local.device().to_string(), ", the units' others on ", device->to_string(),
                   " (one device per model: Module::to first)");
      auto [at, fresh] = owner.emplace(storage.get(), unit.name + " ('" + name + "')");
      if (!fresh) {
        // Tied within the unit: one copy serves both.
        DT_CHECK_ARG(at->second.rfind(unit.name + " (", 0) == 0, kOp, unit.name, ": parameter '", name,
                     "' shares its memory with ", at->second, " (a tied weight cannot live in two units)");
        continue;
      }
      DT_CHECK_ARG(local.offset() == 0 && local.is_contiguous() && local.nbytes() == storage->bytes(), kOp, unit.name,
                   ": parameter '", name, "' views part of a larger buffer (", storage->bytes(),
                   " bytes); streaming moves whole storages");
      WeightStream::State::Weights w;
      w.storage = storage;
      w.device = Tensor::from_storage(storage, local.dtype(), {local.numel()}, {1}, 0);
      unit.weights.push_back(std::move(w));
      unit.bytes += static_cast<int64_t>(storage->bytes());
    }
    state->units.push_back(std::move(unit));
  }
  const Device on = device.value_or(Device::cpu());
  state->host = options.host.value_or(on.is_cuda() ? Device::cpu() : Device::cpu(1));
  DT_CHECK_ARG(state->host.is_cpu() && state->host.index >= 0 && state->host.index < Device::kCpuDevices, kOp, root,
               ": option host must be cpu or cpu:1, got ", state->host.to_string());
  DT_CHECK_ARG(state->host != on, kOp, root, ": option host is ", state->host.to_string(),
               ", the device the weights compute on (the host stand-in for a CPU model is cpu:1)");
  // A parameter outside the units over a unit's memory would be freed under its user
  // (a weight shared by storage rather than by module).
  for (const nn::Module* m : visited) {
    if (enclosing[m]) continue;
    for (const auto& [name, p] : m->named_parameters()) {
      if (name.find('.') != std::string::npos) continue;  // a sub-module's: checked with it
      auto it = owner.find(p.to_local().storage().get());
      const std::string& path = place[m];
      DT_CHECK_ARG(it == owner.end(), kOp, root, ": parameter '", path.empty() ? name : path + "." + name,
                   "' outside the units shares its memory with ", it->second,
                   " (a tied weight: put both users in one unit, or leave it out of the units)");
    }
  }

  // Move: a host copy of each storage, then the device block is released.
  for (WeightStream::State::Unit& u : state->units) {
    for (WeightStream::State::Weights& w : u.weights) {
      w.host = Tensor::empty(w.device.shape(), w.device.dtype(), state->host).copy_(w.device);
    }
    state->release(u);
  }
  // The hooks own the state (the handle returned is optional to keep).
  for (size_t i = 0; i < state->units.size(); ++i) {
    nn::Module& m = *state->units[i].module;
    state->hooks.push_back(
        m.register_forward_pre_hook([state, i](nn::Module&, const DistTensor&) { state->pre_forward(i); }));
    state->hooks.push_back(m.register_forward_post_hook(
        [state, i](nn::Module&, const DistTensor&, const DistTensor&) { state->release(state->units[i]); }));
    m.add_parallel_wrapper("stream_weights to " + state->host.to_string());
  }
  // The first complete forward of the module fixes the order prefetching follows.
  state->hooks.push_back(module.register_forward_post_hook(
      [state](nn::Module&, const DistTensor&, const DistTensor&) { state->order_frozen = true; }));
  return WeightStream(state);
}

namespace {
WeightStream::State& checked(const std::shared_ptr<WeightStream::State>& state, const char* op) {
  DT_CHECK_ARG(state != nullptr, op, "this WeightStream handle is empty (made by its default constructor)");
  return *state;
}
}  // namespace

std::vector<std::string> WeightStream::unit_names() const {
  std::vector<std::string> out;
  for (const State::Unit& u : checked(state_, "WeightStream").units) out.push_back(u.module->path());
  return out;
}

Device WeightStream::host() const { return checked(state_, "WeightStream").host; }

int64_t WeightStream::host_bytes() const {
  int64_t n = 0;
  for (const State::Unit& u : checked(state_, "WeightStream").units) n += u.bytes;
  return n;
}

int64_t WeightStream::largest_unit_bytes() const {
  int64_t n = 0;
  for (const State::Unit& u : checked(state_, "WeightStream").units) n = std::max(n, u.bytes);
  return n;
}

const WeightStreamStats& WeightStream::stats() const { return checked(state_, "WeightStream").stats; }

void WeightStream::detach() {
  State& s = checked(state_, "WeightStream::detach");
  if (s.detached) return;
  for (nn::HookHandle& h : s.hooks) h.remove();
  for (State::Unit& u : s.units) {
    s.fetch(u, false);
    for (State::Weights& w : u.weights) w.host = Tensor();
  }
  s.detached = true;
}

}  // namespace dtensor::parallel
