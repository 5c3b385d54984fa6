// Weight streaming (ZeRO-Inference): a model's weights live in host memory and each
// unit's are copied to the device just before its forward and freed after it, so a
// model larger than device memory runs inference with only a few units' weights on
// the device at a time.
//
//   std::vector<nn::Module*> units;
//   for (auto& [name, m] : model.named_modules())
//     if (dynamic_cast<nn::TransformerBlock*>(m)) units.push_back(m);
//   parallel::WeightStream stream = parallel::stream_weights(model, units, {.prefetch = 1});
//   NoGradGuard no_grad;
//   DistTensor logits = model(tokens);   // each block fetched before its forward, freed after
//
// A unit is any sub-module (or the module itself); its parameters' memory moves to
// `host` (whole storages: a parameter that views a larger buffer, or one shared with
// another unit or with a parameter outside the units, is refused). Parameters of no
// unit stay on the device. In forward, a unit's pre-forward hook fetches it unless a
// prefetch did, then fetches the next `prefetch` units (in the order the first forward
// of `module` recorded); its post-forward hook frees it. So at most 1 + prefetch units'
// weights are on the device at once, on top of the parameters of no unit and the
// activations, as DeepSpeed's ZeRO-Inference does layer by layer.
//
// Any layout: each rank streams its local shards (tensor parallel weights, a pipeline
// stage's layers: call it per stage). Inference only: forward runs under NoGradGuard
// (autograd would keep views of weights that are freed after forward); training with
// the weights' master copy on the host is FSDPOptions::offload. Load the weights before
// stream_weights (a write to a streamed parameter outside its forward throws: its
// memory is released); WeightStream::detach() brings them back for good.
//
// The copies are synchronous (host and device copies in the caller's order), so here
// prefetching moves a copy earlier but does not hide it; with a copy stream on a GPU it
// would overlap the previous unit's compute (the NCCL issue's communication stream).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/nn/module.h"

namespace dtensor::parallel {

struct WeightStreamOptions {
  // Where the weights live. Default: cpu for a model on a GPU; cpu:1 (device.h: the
  // host stand-in, counted apart) for a model on the CPU, so the same copies run and
  // the two sides' bytes can be read off without a GPU.
  std::optional<Device> host;
  // Units fetched ahead of their forward: 0 fetches each when its turn comes (one unit
  // on the device at a time), 1 also the next one, 2 the next two.
  int prefetch = 1;
};

// Counters since stream_weights.
struct WeightStreamStats {
  int64_t fetches = 0;     // unit copies host to device
  int64_t prefetches = 0;  // of those, made ahead of the unit's forward
  int64_t bytes_fetched = 0;
  double fetch_seconds = 0;  // in the copies
};

class WeightStream {
 public:
  WeightStream() = default;

  // The units' paths in the module tree, in the order given.
  std::vector<std::string> unit_names() const;
  Device host() const;
  // Bytes the units' weights take on the host (their total), and those of the largest unit.
  int64_t host_bytes() const;
  int64_t largest_unit_bytes() const;
  const WeightStreamStats& stats() const;
  // Copies every unit's weights back to the device for good, removes the hooks and
  // frees the host copies: the module as it was before stream_weights. Idempotent.
  void detach();

  struct State;
  explicit WeightStream(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

// Moves the weights of `units` (sub-modules of `module`, or `module` itself) to the
// host and installs the hooks that stream them through the device in `module`'s
// forward. Local: no communication. Throws std::invalid_argument naming the unit and
// parameter for a unit outside `module`, a unit inside another unit or one already
// sharded by fully_shard (FSDP gathers its own parameters), parameters of a unit on
// different devices or on the host itself, and shared or view parameters (above).
WeightStream stream_weights(nn::Module& module, const std::vector<nn::Module*>& units,
                            const WeightStreamOptions& options = {});

}  // namespace dtensor::parallel
