// FSDP's internal state (src/parallel only): a group of sharded parameters with its
// flat buffers and what is in flight, the context a tree of groups shares, and the
// hooks that fully_shard installs (fsdp_group.cpp). fsdp.cpp builds groups and holds
// the public API.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/parallel/fsdp.h"
#include "parallel/flat_layout.h"

namespace dtensor::parallel {

namespace detail {
struct Context;
}  // namespace detail

struct FSDPModule::ParamGroup {
  nn::Module* module = nullptr;
  FSDPOptions options;
  std::string label;  // "module 'blocks.0' ('norm1.weight' and 7 more parameters)", for errors
  DeviceMesh mesh;
  int shard_dim = 0;
  int replicate_dim = -1;
  int64_t ranks = 1, rank = 0;

  struct Param {
    std::string name;      // relative to the module
    DistTensor sharded;    // the leaf the optimizer updates
    Placements unsharded;  // the layout forward computes with (Replicate on the FSDP dims)
    size_t bucket = 0, slot = 0;
  };
  std::vector<Param> params;

  // The parameters of one dtype: flat buffers (flat_layout.h) and what is in flight.
  struct Bucket {
    DType dtype = DType::F32;  // of the shards
    DType param_dtype = DType::F32, reduce_dtype = DType::F32;
    Device device;  // where forward and backward compute (the parameters' device)
    detail::FlatLayout layout;
    std::vector<size_t> members;  // indices into params, in slot order
    Tensor shard;                 // [R] the shards (the leaves view it), on the host when offloaded
    Tensor send;                  // [R] the shards in param_dtype on `device` (stage 3 with a cast or offload)
    bool send_stale = true;
    Tensor unsharded;  // [U] gathered parameters (memory released when resharded at stage 3)
    Tensor gathered;   // [N * R] all-gather output in flight
    Work gather;
    Tensor grad_full;                         // [N * R] packed gradients (kept at stage 1)
    bool grad_holds_sum = false;              // grad_full holds gradients not yet reduced
    std::vector<Placements> grad_placements;  // per member: the reduced gradient's layout
    std::vector<bool> has_grad;               // per member: a gradient arrived since the last reduction
  };
  std::vector<Bucket> buckets;
  bool offloaded() const { return options.offload.has_value(); }

  enum class State { Sharded, Gathering, Unsharded };
  State state = State::Sharded;
  bool sync = true;
  bool reshard_after_backward = true;
  std::optional<bool> reshard_after_forward_override;
  std::shared_ptr<detail::Context> context;
  std::vector<std::weak_ptr<ParamGroup>> subtree;  // this group and those under its module
  std::vector<nn::HookHandle> hooks;

  bool is_root() const;
  bool reshard_after_forward() const {
    if (options.stage != 3) return false;
    if (reshard_after_forward_override) return *reshard_after_forward_override;
    if (options.reshard_after_forward) return *options.reshard_after_forward;
    return !is_root();
  }
  const dtensor::Group& shard_group() const { return mesh.group(shard_dim); }

  void start_gather(bool prefetch);
  void finish_gather();
  void unshard() {
    start_gather(false);
    finish_gather();
  }
  void reshard();
  // The gathered parameters as DistTensors in their compute layout (views of `unsharded`).
  std::vector<DistTensor> gathered_params() const;
  // The sharded leaves (the autograd inputs of the all-gather node).
  std::vector<DistTensor> sharded_params() const {
    std::vector<DistTensor> out;
    for (const Param& p : params) out.push_back(p.sharded);
    return out;
  }
};

namespace detail {

using ParamGroup = FSDPModule::ParamGroup;

// What the groups of one tree (a root and the modules under it) share: the recorded
// module order for prefetching, the reductions in flight and the counters.
struct Context {
  std::weak_ptr<ParamGroup> root;
  std::vector<std::weak_ptr<ParamGroup>> groups;
  // Order of pre-forward hooks and of pre-backward nodes in the first step; from the
  // second step on each module prefetches the next one's all-gather.
  std::vector<ParamGroup*> forward_order, backward_order;
  bool order_frozen = false;
  bool callback_queued = false;

  // A module's gradient reduction: the reduce-scatter, then (HSDP) the all-reduce
  // across replica groups.
  struct Reduction {
    std::weak_ptr<ParamGroup> group;
    size_t bucket = 0;
    Tensor out;  // [R] this rank's reduced region
    Work work;
    bool across_replicas = false;  // the second phase is in flight
  };
  std::deque<Reduction> reductions;
  FSDPStats stats;
  // Set while something else writes the shards (a DelayedUpdate's optimizer step on its
  // thread): waits until it is done. Called before any read or write of the shards.
  std::function<void()> shard_writer;
};

inline void await_shard_writer(Context& ctx) {
  if (ctx.shard_writer) ctx.shard_writer();
}

// Seconds from t0 to now.
double seconds_since(std::chrono::steady_clock::time_point t0);
// The group fully_shard made for `module` (null when none; per rank).
std::shared_ptr<ParamGroup> group_of(const nn::Module* module);
// Copies every offloaded shard of `group`'s tree to its device copy now, so that the
// next gathers read these values whatever happens to the shards until then (a delayed
// update refreshes the copies and then lets its optimizer step write the shards).
void refresh_device_shards(ParamGroup& group);

// The forward hooks of a group's module.
void pre_forward(const std::shared_ptr<ParamGroup>& group);
std::optional<DistTensor> post_forward(const std::shared_ptr<ParamGroup>& group, const DistTensor& output);
// Moves every reduction in flight one phase on, or with `all` to completion.
void progress_reductions(Context& ctx, bool all);
// The shards of `group` and of the groups under it were written from outside the
// optimizer: each is resharded and gathers afresh before its next forward.
void mark_shards_changed(ParamGroup& group);

}  // namespace detail
}  // namespace dtensor::parallel
