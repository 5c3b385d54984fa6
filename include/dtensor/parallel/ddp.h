// DistributedDataParallel: gradients all-reduced in buckets, overlapped with
// backward.
//
// The model's parameters are replicated over the data-parallel mesh dim and the
// batch is sharded over it, so sharding propagation already makes every parameter
// gradient Partial(sum) there (DESIGN.md). DDP adds the memory and overlap policy:
// as soon as every gradient of a bucket (about bucket_cap_mb, filled in reverse
// registration order, the order backward produces them) is ready, it packs their
// local Partial values into one buffer and starts an asynchronous all-reduce, so
// communication runs while backward goes on. wait_for_gradients() finishes the
// all-reduces and leaves each gradient Replicate over the data-parallel dim.
//
// Parameters sharded over the data-parallel dim (FSDP layouts, or a weight the user
// distributed with Shard) are accepted: their gradients come out of backward in their
// own layout (the backward of the all-gather reduce-scatters), and DDP all-reduces
// only gradients that are Partial over the data-parallel dim.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtensor/group.h"
#include "dtensor/nn/module.h"
#include "dtensor/parallel/trainer.h"

namespace dtensor::parallel {

struct DDPOptions {
  double bucket_cap_mb = 25.0;
  // Divide the reduced gradients by the data-parallel size (for losses computed
  // per rank, PyTorch style). Losses computed on DistTensors already have global
  // semantics: their Partial(sum) gradients need a plain sum (the default).
  bool average_gradients = false;
  // The mesh dim that is data parallel (by name; empty: mesh dim 0).
  std::string dp_dim;
  // Further mesh dims that shard the batch's tokens, whose gradients are sums over
  // their shards too: context parallelism's "cp" (the sequence sharded there). They
  // are reduced in the same all-reduce, over dp and these dims together; a gradient
  // already whole over one of them counts on its first coordinate only. A parameter
  // sharded over one of them (an expert weight over "ep") is summed over the others.
  // Buckets hold parameters of one set of reduced dims.
  std::vector<std::string> token_dims;
};

struct DDPStats {
  int64_t all_reduces = 0;           // since construction
  int64_t launched_during_backward = 0;  // of those, started before the last gradient was ready
  int64_t buckets = 0;
};

class DistributedDataParallel : public GradientSync {
 public:
  DistributedDataParallel(nn::Module& module, DDPOptions options = {});
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  DistTensor forward(const DistTensor& x) { return module_(x); }
  nn::Module& module() { return module_; }

  // Waits for the bucket all-reduces of this backward (launching any bucket whose
  // gradients did not all arrive) and sets each gradient to the reduced value.
  void wait_for_gradients();

  // While alive, backward accumulates gradients locally without communication
  // (gradient accumulation); the next backward outside it reduces the sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp) { ddp_.sync_ = false; }
    ~NoSync() { ddp_.sync_ = true; }

   private:
    DistributedDataParallel& ddp_;
  };
  NoSync no_sync() { return NoSync(*this); }
  // GradientSync (parallel::Trainer): the same switch as no_sync, and
  // wait_for_gradients.
  void set_accumulating(bool accumulating) override { sync_ = !accumulating; }
  void finish_gradient_sync() override { wait_for_gradients(); }

  const DDPStats& stats() const { return stats_; }
  int64_t num_buckets() const;

  struct State;

 private:
  void on_gradient_ready(size_t param_index);
  void launch(size_t bucket);

  nn::Module& module_;
  DDPOptions options_;
  bool sync_ = true;
  DDPStats stats_;
  std::shared_ptr<State> state_;
};

}  // namespace dtensor::parallel
