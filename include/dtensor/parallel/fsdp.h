// FSDP: fully sharded data parallelism (ZeRO stages 1-3, HSDP), in the shape of
// PyTorch's FSDP2 (`fully_shard` per block, then on the root).
//
//   DeviceMesh mesh(world, {4}, {"dp"});
//   models::GPT model(mesh, config, seed);
//   for (auto& [name, m] : model.named_modules())
//     if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh);
//   parallel::FSDPModule root = parallel::fully_shard(model, mesh);
//   AdamW optimizer(model.parameters(), 3e-4);   // the shards: Adam state sharded too
//   parallel::Trainer trainer(optimizer, {.sync = &root});
//
// After fully_shard every parameter of the module is a DistTensor with Shard(0) on the
// data-parallel mesh dim (uneven sizes follow the chunk rule; nobody pads), whatever
// it had on the other mesh dims: a tensor-parallel weight S(0) on tp becomes
// {Shard(0, 1), Shard(0, 0)} on (dp, tp), dp splitting each tp piece. Those shards are
// what model.parameters(), the optimizer, clip_grad_norm and state dicts see. A
// fully_shard call makes one group of the module's parameters that no sub-module's
// fully_shard took; per group and dtype the shards live in one flat buffer, so
// gathering a module is one all-gather and reducing its gradients one reduce-scatter.
//
// Stages (DeepSpeed's names; memory with mixed-precision Adam, N ranks, P parameters):
//   1  optimizer state sharded; gathered parameters and a full gradient buffer kept
//      (4P + 12P/N bytes). Gradients accumulate in the full buffer; one reduce-scatter
//      per module per synchronised backward, the shard of it handed to the optimizer.
//   2  + gradients reduce-scattered as soon as a module's are ready and only the
//      shard kept (2P + 14P/N).
//   3  + parameters sharded: all-gathered before a module's forward, freed after it
//      (reshard_after_forward), gathered again for its backward (16P/N plus the
//      gathered modules).
// At stages 1 and 2 the gathered parameters stay allocated and are refreshed by one
// all-gather per module in the first forward after each optimizer step: traffic per
// step is the same as DDP's all-reduce (reduce-scatter + all-gather); stage 3 adds the
// backward all-gather (1.5x DDP).
//
// Overlap: in forward, a module's pre-forward hook waits for its all-gather and starts
// the next modules' (`prefetch` of them; the order is recorded in the first step); in
// backward, a node on the module's output runs before the module's backward, gathers
// it again and starts the all-gathers of the modules backward visits next. A module's gradients are packed
// into one buffer and reduce-scattered asynchronously while backward goes on; the
// previous module's reduce-scatter is finished then (one in flight), the last at the
// end of backward (autograd::queue_callback), so gradients are in place when
// backward() returns.
//
// HSDP: with `replicate_dim` the parameters are Replicate on that mesh dim and
// Shard(0) on `shard_dim`: all-gathers stay within a replica group, gradients are
// reduce-scattered within it and then all-reduced across replica groups.
//
// Mixed precision: the shards keep their dtype (FP32: the master weights the optimizer
// updates); parameters are gathered in param_dtype (so layers compute in it) and
// gradients reduced and kept in reduce_dtype.
//
// Offload (ZeRO-Offload; FSDP2's CPUOffloadPolicy): with `offload` the shards the
// optimizer updates (the FP32 master weights), their gradients and so the optimizer's
// state live on the host (OffloadPolicy::host), and the optimizer steps there (the
// CPU's fused AdamW). The device keeps one copy of each shard in param_dtype, which
// the all-gathers read, refreshed from the host in the first gather after each
// optimizer step (one module at a time, so the copies follow the prefetch). Gradients
// are reduce-scattered on the device and each module's shard is copied to the host
// when its reduction finishes, during backward. Per parameter and rank, in BF16
// training (param_dtype and reduce_dtype BF16, FP32 master): 2P/N bytes on the device
// plus the gathered working set, 14P/N on the host (FP32 master, exp_avg, exp_avg_sq,
// BF16 gradient). Stages 2 and 3.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/nn/module.h"
#include "dtensor/parallel/trainer.h"

namespace dtensor::parallel {

struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;   // gathered parameters (compute); default: the shards' dtype
  std::optional<DType> reduce_dtype;  // gradient reduction and the sharded gradients; default: param_dtype
};

struct OffloadPolicy {
  // Where the host side lives. Default: cpu for parameters on a GPU; cpu:1 (device.h:
  // the host stand-in, counted apart) for parameters on the CPU, so that offloading on
  // a machine without a GPU runs the same copies and keeps the two sides' bytes apart.
  std::optional<Device> host;
};

struct FSDPOptions {
  int stage = 3;
  // Stage 3: free the gathered parameters after forward and gather them again in
  // backward. Default: on, except for the root (the outermost fully_shard), whose
  // backward starts right after its forward. Stages 1 and 2 keep them (false).
  std::optional<bool> reshard_after_forward;
  MixedPrecisionPolicy mixed_precision;
  std::string shard_dim = "dp";  // the mesh dim the parameters are sharded over
  std::string replicate_dim;     // HSDP: the mesh dim across replica groups ("": none)
  // Prefetch depth: while a module computes, the all-gathers of the next `prefetch`
  // modules (in the order the first step recorded, forward and backward) are in
  // flight. 0 gathers each module when its turn comes (the smallest working set: one
  // gathered module), 1 overlaps the next gather (the default), 2 hides a gather that
  // takes longer than one module's compute at the cost of one more gathered module.
  int prefetch = 1;
  // Optimizer state, master weights and gradients on the host (above); stages 2 and 3.
  std::optional<OffloadPolicy> offload;
};

// Counters of one tree of FSDP modules (the root and the modules under it), since
// construction.
struct FSDPStats {
  int64_t all_gathers = 0;
  int64_t prefetched_all_gathers = 0;  // of those, started ahead of the module's use
  int64_t reduce_scatters = 0;
  int64_t replica_all_reduces = 0;         // HSDP
  double all_gather_wait_seconds = 0;      // time spent waiting for all-gathers
  double reduce_scatter_wait_seconds = 0;  // ... and for reduce-scatters (and replica all-reduces)
};

struct StateDictOptions {
  // true: every tensor whole (Replicate on every mesh dim; collective). false: the
  // sharded parameters as they are, local shards with their placements (no
  // communication; what a sharded checkpoint stores).
  bool full = true;
};

// The handle of one fully_shard'ed module (cheap to copy; the module's hooks keep the
// state alive as long as the module). Setters act on the whole tree under the module.
class FSDPModule : public GradientSync {
 public:
  FSDPModule() = default;

  nn::Module& module() const;
  const FSDPOptions& options() const;
  // The names of the parameters this module's group holds (relative to the module).
  std::vector<std::string> parameter_names() const;
  // Elements per rank in this group's flat shard buffers (padding included).
  int64_t sharded_numel() const;

  // Gathers this module's parameters now (and waits); reshard() frees them (stage 3)
  // or marks them for refreshing (stages 1, 2). Collective over the shard group.
  void unshard();
  void reshard();

  // false: backwards accumulate the gathered gradients locally without reducing them
  // (gradient accumulation); the next backward with true reduces the sum.
  void set_requires_gradient_sync(bool sync);
  // false: parameters stay gathered after backward (the next micro-batch needs no
  // all-gather); likewise after forward.
  void set_reshard_after_backward(bool reshard);
  void set_reshard_after_forward(bool reshard);
  // Gradients are in place when backward() returns; this only checks that no
  // reduction is left in flight (after an interrupted backward, say) and finishes it.
  void finish_gradient_sync() override;
  // GradientSync (parallel::Trainer): true turns gradient sync and resharding (after
  // forward and after backward) off, false restores the defaults (no_sync's switch).
  void set_accumulating(bool accumulating) override;

  struct ParamGroup;

  // While alive: no gradient sync and no resharding between micro-batches
  // (set_accumulating(true); the destructor sets it back to false).
  class NoSync {
   public:
    explicit NoSync(const FSDPModule& module);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    std::shared_ptr<ParamGroup> group_;
  };
  NoSync no_sync() const { return NoSync(*this); }

  const FSDPStats& stats() const;

  // The module's parameters by name (see StateDictOptions), and loading them back:
  // any layout is accepted and moved to the parameter's; the gathered copies are
  // refreshed before the next forward. Writing the shards any other way (through
  // nn::Module::load_state_dict, a checkpoint load) refreshes them too: fully_shard
  // registers a state-loaded hook (nn::Module::notify_state_loaded) on the module.
  std::map<std::string, DistTensor> state_dict(StateDictOptions options = {}) const;
  void load_state_dict(const std::map<std::string, DistTensor>& state);

  explicit FSDPModule(std::shared_ptr<ParamGroup> group) : group_(std::move(group)) {}

 private:
  std::shared_ptr<ParamGroup> group_;
};

// Shards the parameters of `module` that no earlier fully_shard of one of its
// sub-modules took, over `mesh`'s shard_dim (the parameters' mesh). Apply it to the
// blocks first, then to the root. Every rank of the mesh calls it the same way; it
// communicates nothing (each rank keeps its own chunk of its replicated copy).
FSDPModule fully_shard(nn::Module& module, const DeviceMesh& mesh, const FSDPOptions& options = {});

}  // namespace dtensor::parallel
