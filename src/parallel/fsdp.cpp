// fully_shard (building a group of sharded parameters and installing its hooks) and
// the FSDPModule handle. The groups at work are in fsdp_group.cpp.
#include "dtensor/parallel/fsdp.h"

#include <algorithm>
#include <map>
#include <set>

#include "dtensor/autograd.h"
#include "parallel/fsdp_group.h"
#include "util/check.h"

namespace dtensor::parallel {

using detail::Context;
using detail::FlatLayout;
using detail::ParamGroup;

namespace {

// "TransformerBlock" for errors: the module's type without namespaces.
thread_local std::map<const nn::Module*, std::weak_ptr<ParamGroup>> registry;  // per rank

}  // namespace

std::shared_ptr<ParamGroup> detail::group_of(const nn::Module* module) {
  auto it = registry.find(module);
  if (it == registry.end()) return nullptr;
  std::shared_ptr<ParamGroup> group = it->second.lock();
  if (!group) registry.erase(it);
  return group;
}
using detail::group_of;

// ---- fully_shard -------------------------------------------------------------------

namespace {

const char* kOp = "fully_shard";

std::string describe(const nn::Module& module, const std::vector<std::string>& names) {
  const std::string path = module.path();
  std::string text = path.empty() ? "the root module" : "module '" + path + "'";
  if (!names.empty()) {
    text += " ('" + names.front() + "'";
    if (names.size() > 1) text += " and " + std::to_string(names.size() - 1) + " more parameters";
    text += ")";
  }
  return text;
}

int mesh_dim_of(const DeviceMesh& mesh, const std::string& name, const char* option, const std::string& label) {
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (mesh.names()[d] == name) return d;
  }
  std::string dims;
  for (const std::string& n : mesh.names()) dims += (dims.empty() ? "" : ", ") + n;
  throw std::invalid_argument(std::string("[") + kOp + "] " + label + ": option " + option + " '" + name +
                              "' is not a dim of mesh " + mesh.to_string() + " (its dims: " + dims + ")");
}

// The order that makes `shard_dim` the innermost of the mesh dims sharding dim 0.
int inner_order(const Placements& placements, int shard_dim) {
  int order = -1;
  bool other = false;
  for (int d = 0; d < static_cast<int>(placements.size()); ++d) {
    if (d == shard_dim || !placements[d].is_shard(0)) continue;
    other = true;
    order = std::max(order, placements[d].order());
  }
  return other ? order + 1 : 0;
}

// The host side of offloading parameters that compute on `device`.
Device offload_host(const OffloadPolicy& policy, Device device, const std::string& label) {
  const Device host = policy.host.value_or(device.is_cuda() ? Device::cpu() : Device::cpu(1));
  DT_CHECK_ARG(host.is_cpu() && host.index >= 0 && host.index < Device::kCpuDevices, kOp, label,
               ": option offload's host must be cpu or cpu:1, got ", host.to_string());
  DT_CHECK_ARG(host != device, kOp, label, ": option offload's host is ", host.to_string(),
               ", the device the parameters compute on (the host stand-in for CPU parameters is cpu:1)");
  return host;
}

}  // namespace

FSDPModule fully_shard(nn::Module& module, const DeviceMesh& mesh, const FSDPOptions& options) {
  // The parameters that sub-modules' fully_shard calls took.
  std::set<std::string> taken;
  std::vector<std::shared_ptr<ParamGroup>> children;
  for (auto& [name, m] : module.named_modules()) {
    if (name.empty()) continue;
    if (std::shared_ptr<ParamGroup> child = group_of(m)) {
      children.push_back(child);
      for (const ParamGroup::Param& p : child->params) taken.insert(name + "." + p.name);
    }
  }
  std::vector<std::pair<std::string, DistTensor>> named;
  std::vector<std::string> names;
  for (auto& [name, p] : module.named_parameters()) {
    if (taken.count(name)) continue;
    named.emplace_back(name, p);
    names.push_back(name);
  }
  const std::string label = describe(module, names);
  DT_CHECK_ARG(!group_of(&module), kOp, label, ": fully_shard was already applied to this module");
  // DDP's buckets and gradient hooks hold the replicated parameters fully_shard would
  // replace: that order would train silently wrong.
  auto refuse_ddp = [&](const nn::Module& m) {
    for (const std::string& w : m.parallel_wrappers()) {
      const std::string path = m.path();
      DT_CHECK_ARG(w.rfind("DistributedDataParallel", 0) != 0, kOp, label, ": ",
                   path.empty() ? std::string("the root module") : "module '" + path + "'", " is already wrapped by ",
                   w,
                   "; FSDP synchronises the gradients itself: use fully_shard without DDP, or HSDP "
                   "(FSDPOptions::replicate_dim) to replicate across groups");
    }
  };
  for (const nn::Module* m = &module; m; m = m->parent()) refuse_ddp(*m);
  for (auto& [name, m] : module.named_modules()) refuse_ddp(*m);
  DT_CHECK_ARG(options.stage >= 1 && options.stage <= 3, kOp, label, ": option stage must be 1, 2 or 3, got ",
               options.stage);
  DT_CHECK_ARG(mesh.defined() && mesh.is_member(), kOp, label, ": expected a mesh this rank belongs to");
  DT_CHECK_ARG(options.stage == 3 || !options.reshard_after_forward.value_or(false), kOp, label,
               ": option reshard_after_forward needs stage 3 (stages 1 and 2 keep the gathered parameters), got stage ",
               options.stage);
  DT_CHECK_ARG(options.prefetch >= 0, kOp, label, ": option prefetch is a number of modules, expected 0 or more, got ",
               options.prefetch);
  DT_CHECK_ARG(!options.offload || options.stage >= 2, kOp, label,
               ": option offload needs stage 2 or 3 (stage 1 keeps a full gradient buffer on the device), got stage ",
               options.stage);
  for (const std::optional<DType>& d : {options.mixed_precision.param_dtype, options.mixed_precision.reduce_dtype}) {
    DT_CHECK_ARG(!d || is_floating(*d), kOp, label, ": mixed precision dtypes must be floating, got ", dtype_name(*d));
  }
  auto group = std::make_shared<ParamGroup>();
  ParamGroup& g = *group;
  g.module = &module;
  g.options = options;
  g.label = label;
  g.mesh = mesh;
  g.shard_dim = mesh_dim_of(mesh, options.shard_dim, "shard_dim", label);
  if (!options.replicate_dim.empty()) {
    g.replicate_dim = mesh_dim_of(mesh, options.replicate_dim, "replicate_dim", label);
    DT_CHECK_ARG(g.replicate_dim != g.shard_dim, kOp, label, ": options shard_dim and replicate_dim are both '",
                 options.shard_dim, "'");
  }
  g.ranks = mesh.size(g.shard_dim);
  g.rank = mesh.coordinate(g.shard_dim);

  // Check every parameter before changing any.
  std::vector<DType> dtypes;
  std::vector<DistTensor> originals;  // aligned with g.params below
  for (const auto& [name, p] : named) {
    const auto& [first_name, first] = named.front();
    DT_CHECK_ARG(p.mesh() == first.mesh(), kOp, label, ": the parameters live on different meshes: '", first_name,
                 "' on ", first.mesh().to_string(), ", '", name, "' on ", p.mesh().to_string());
    if (!(p.mesh() == mesh)) {
      const bool same_world = p.mesh().world() == mesh.world();
      throw std::invalid_argument(std::string("[") + kOp + "] " + label + ": parameter '" + name + "' lives on mesh " +
                                  p.mesh().to_string() + ", the mesh given is " + mesh.to_string() +
                                  (same_world ? " (fully_shard needs the parameters' own mesh)"
                                              : " over another world (fully_shard needs the parameters' own mesh)"));
    }
    DT_CHECK_ARG(p.dim() >= 1, kOp, label, ": parameter '", name, "' is 0-d; FSDP shards dim 0");
    for (int d = 0; d < mesh.ndim(); ++d) {
      DT_CHECK_ARG(!p.placements()[d].is_partial(), kOp, label, ": parameter '", name, "' is ",
                   placements_to_string(p.placements()), "; a parameter cannot be Partial");
    }
    for (int d : {g.shard_dim, g.replicate_dim}) {
      if (d < 0) continue;
      DT_CHECK_ARG(p.placements()[d].is_replicate(), kOp, label, ": parameter '", name, "' is ",
                   placements_to_string(p.placements()), ", expected Replicate on mesh dim '", mesh.names()[d],
                   "' (is an enclosing module sharded already? apply fully_shard to sub-modules first)");
    }
    if (std::find(dtypes.begin(), dtypes.end(), p.dtype()) == dtypes.end()) dtypes.push_back(p.dtype());
  }

  // One bucket per dtype, in order of first appearance.
  for (DType dtype : dtypes) {
    ParamGroup::Bucket b;
    b.dtype = dtype;
    b.param_dtype = options.mixed_precision.param_dtype.value_or(dtype);
    b.reduce_dtype = options.mixed_precision.reduce_dtype.value_or(b.param_dtype);
    std::vector<Shape> shapes;
    std::vector<Tensor> locals;
    for (size_t i = 0; i < named.size(); ++i) {
      if (named[i].second.dtype() != dtype) continue;
      b.members.push_back(g.params.size());
      ParamGroup::Param p;
      p.name = named[i].first;
      p.unsharded = named[i].second.placements();
      p.bucket = g.buckets.size();
      p.slot = shapes.size();
      g.params.push_back(p);
      originals.push_back(named[i].second);
      shapes.push_back(named[i].second.to_local().shape());
      locals.push_back(named[i].second.to_local());
    }
    for (const Tensor& local : locals) {
      DT_CHECK_ARG(local.device() == locals[0].device(), "fully_shard", "the parameters of one module must be on one ",
                   "device, got ", locals[0].device().to_string(), " and ", local.device().to_string(),
                   " (move the model with Module::to first)");
    }
    b.layout = FlatLayout(shapes, g.ranks, g.rank);
    // The shards live where the parameters do (one device per bucket), or on the host.
    b.device = locals.empty() ? Device::cpu() : locals[0].device();
    b.shard = Tensor::empty({b.layout.region_numel()}, dtype,
                            options.offload ? offload_host(*options.offload, b.device, label) : b.device);
    b.layout.scatter_into_region(locals, b.shard);
    b.grad_placements.resize(b.members.size());
    b.has_grad.assign(b.members.size(), false);
    g.buckets.push_back(std::move(b));
  }
  // The sharded leaves replace the replicated parameters in the module.
  for (size_t i = 0; i < g.params.size(); ++i) {
    ParamGroup::Param& p = g.params[i];
    const DistTensor& original = originals[i];
    Placements sharded = p.unsharded;
    sharded[g.shard_dim] = Shard(0, inner_order(p.unsharded, g.shard_dim));
    const ParamGroup::Bucket& b = g.buckets[p.bucket];
    p.sharded = DistTensor::from_local(b.layout.shard_view(b.shard, p.slot), mesh, sharded, original.shape());
    p.sharded.set_requires_grad(true);
    const std::string path = module.path();
    mark_replaced(original, "'" + (path.empty() ? p.name : path + "." + p.name) + "' was sharded by fully_shard over " +
                                options.shard_dim);
    module.swap_parameter(p.name, p.sharded);
  }
  // One context for the whole tree: this module is its root.
  auto context = std::make_shared<Context>();
  context->root = group;
  context->groups.push_back(group);
  g.subtree.push_back(group);
  for (const std::shared_ptr<ParamGroup>& child : children) {
    for (const std::weak_ptr<ParamGroup>& weak : child->context->groups) {
      if (std::shared_ptr<ParamGroup> member = weak.lock()) {
        member->context = context;
        context->groups.push_back(member);
        g.subtree.push_back(member);
      }
    }
  }
  g.context = context;

  // The module's hooks own the group (the handle returned is optional to keep).
  g.hooks.push_back(
      module.register_forward_pre_hook([group](nn::Module&, const DistTensor&) { detail::pre_forward(group); }));
  g.hooks.push_back(module.register_forward_post_hook(
      [group](nn::Module&, const DistTensor&, const DistTensor& out) { return detail::post_forward(group, out); }));
  // Parameters written in place from outside (a checkpoint load, Module::load_state_dict):
  // the gathered copies are stale, every group of the tree gathers again before its
  // next forward.
  g.hooks.push_back(module.register_state_loaded_hook([weak = std::weak_ptr<ParamGroup>(group)](nn::Module&) {
    if (const std::shared_ptr<ParamGroup> locked = weak.lock()) detail::mark_shards_changed(*locked);
  }));
  registry[&module] = group;
  module.add_parallel_wrapper("fully_shard over " + options.shard_dim);
  return FSDPModule(group);
}

// ---- FSDPModule --------------------------------------------------------------------

namespace {

ParamGroup& checked(const std::shared_ptr<ParamGroup>& group, const char* op) {
  DT_CHECK_ARG(group != nullptr, op, "this FSDPModule handle is empty (made by its default constructor)");
  return *group;
}

template <class F>
void for_subtree(const ParamGroup& g, F&& fn) {
  for (const std::weak_ptr<ParamGroup>& weak : g.subtree) {
    if (std::shared_ptr<ParamGroup> member = weak.lock()) fn(*member);
  }
}

}  // namespace

nn::Module& FSDPModule::module() const { return *checked(group_, "FSDPModule").module; }
const FSDPOptions& FSDPModule::options() const { return checked(group_, "FSDPModule").options; }

std::vector<std::string> FSDPModule::parameter_names() const {
  std::vector<std::string> out;
  for (const ParamGroup::Param& p : checked(group_, "FSDPModule").params) out.push_back(p.name);
  return out;
}

int64_t FSDPModule::sharded_numel() const {
  int64_t n = 0;
  for (const ParamGroup::Bucket& b : checked(group_, "FSDPModule").buckets) n += b.layout.region_numel();
  return n;
}

void FSDPModule::unshard() { checked(group_, "FSDPModule::unshard").unshard(); }
void FSDPModule::reshard() { checked(group_, "FSDPModule::reshard").reshard(); }

void FSDPModule::set_requires_gradient_sync(bool sync) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) { g.sync = sync; });
}

void FSDPModule::set_reshard_after_backward(bool reshard) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) { g.reshard_after_backward = reshard; });
}

void FSDPModule::set_reshard_after_forward(bool reshard) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) { g.reshard_after_forward_override = reshard; });
}

void FSDPModule::set_accumulating(bool accumulating) {
  for_subtree(checked(group_, "FSDPModule"), [&](ParamGroup& g) {
    g.sync = !accumulating;
    g.reshard_after_backward = !accumulating;
    if (accumulating) {
      g.reshard_after_forward_override = false;
    } else {
      g.reshard_after_forward_override.reset();
    }
  });
}

void FSDPModule::finish_gradient_sync() {
  ParamGroup& g = checked(group_, "FSDPModule::finish_gradient_sync");
  detail::progress_reductions(*g.context, true);
}

FSDPModule::NoSync::NoSync(const FSDPModule& module) : group_(module.group_) {
  FSDPModule(group_).set_accumulating(true);
}
FSDPModule::NoSync::~NoSync() { FSDPModule(group_).set_accumulating(false); }

const FSDPStats& FSDPModule::stats() const { return checked(group_, "FSDPModule").context->stats; }

std::map<std::string, DistTensor> FSDPModule::state_dict(StateDictOptions options) const {
  ParamGroup& g = checked(group_, "FSDPModule::state_dict");
  detail::await_shard_writer(*g.context);
  NoGradGuard no_grad;
  std::map<std::string, DistTensor> out;
  for (auto& [name, p] : g.module->named_parameters()) {
    out[name] = options.full ? p.redistribute(Placements(p.mesh().ndim(), Replicate())) : p.detach();
  }
  return out;
}

void FSDPModule::load_state_dict(const std::map<std::string, DistTensor>& state) {
  ParamGroup& g = checked(group_, "FSDPModule::load_state_dict");
  detail::await_shard_writer(*g.context);
  NoGradGuard no_grad;
  std::set<std::string> seen;
  for (auto& [name, p] : g.module->named_parameters()) {
    auto it = state.find(name);
    DT_CHECK_ARG(it != state.end(), "FSDPModule::load_state_dict", "missing parameter '", name, "'");
    const DistTensor& value = it->second;
    DT_CHECK_ARG(value.shape() == p.shape(), "FSDPModule::load_state_dict", "parameter '", name, "': expected shape ",
                 p.shape(), ", got ", value.shape());
    const DistTensor moved =
        value.placements() == p.placements() ? value : value.redistribute(p.mesh(), p.placements());
    Tensor(p.to_local()).copy_(moved.to_local());
    seen.insert(name);
  }
  for (const auto& [name, _] : state) {
    DT_CHECK_ARG(seen.count(name), "FSDPModule::load_state_dict", "unexpected parameter '", name, "'");
  }
  detail::mark_shards_changed(g);
}

}  // namespace dtensor::parallel
