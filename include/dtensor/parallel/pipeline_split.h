// Splitting a model into pipeline stages: layer ranges (even, balanced by cost, or
// checked when given) and the stages of any nn::Sequential, as
// torch.distributed.pipelining splits a model at named modules.
//
//   DeviceMesh mesh(world, {2, 2}, {"pp", "dp"});
//   parallel::PipelineMesh pp(mesh);
//   auto model = build_model(pp.stage_mesh());        // an nn::Sequential, on every rank
//   parallel::SequentialPipeline split(pp, std::move(model),
//                                      {.schedule = ScheduleKind::OneFOneB, .micro_batches = 4,
//                                       .split_before = {"blocks.2"}});
//   std::vector<std::unique_ptr<parallel::DistributedDataParallel>> ddps;   // optional, per stage
//   AdamW optimizer(split.parameters(), {.lr = 1e-3});
//   auto pipe = split.make_pipeline(syncs, {.inputs = ..., .loss = ...});
//   trainer.step(step, *pipe);
//
// Every rank builds the whole model on its own stage mesh (the same seed gives the
// same values on every mesh) and keeps the children of its stages: pass the model by
// shared_ptr and keep no other reference, and the other stages' layers are freed when
// the split is built. A stage is a slice of the model, so its parameters keep their
// names. A module that children of two stages share (a tied embedding and a head
// reusing it) is found by identity: the later stage registers it under its name in
// the whole model too (nn::Sequential::share), so both list "tokens.weight", and the
// pipeline keeps the copies equal (a TiedParameter: their gradients are summed).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/nn/sequential.h"
#include "dtensor/parallel/pipeline.h"

namespace dtensor::parallel {

// Layers [first, end) of one stage (children of a Sequential, blocks of a GPT).
struct StageLayers {
  int64_t first = 0, end = 0;
  int64_t size() const { return end - first; }
  bool operator==(const StageLayers&) const = default;
};

// As equal as possible, the first stages one block longer when it does not divide.
// Throws when there are more stages than blocks.
std::vector<StageLayers> split_layers_evenly(int64_t layers, int64_t stages);
// Contiguous ranges minimising the costliest stage: layer k costs block_costs[k], the
// first stage also `first_extra` (a GPT's embeddings), the last `last_extra` (norm,
// head, loss). Every stage gets at least one layer.
std::vector<StageLayers> balance_layers(const std::vector<double>& block_costs, double first_extra, double last_extra,
                                        int64_t stages);
// Checks an explicit split: `stages` ranges, each non-empty, covering [0, layers) in
// order. The message names the first bad range.
void check_split(const std::vector<StageLayers>& split, int64_t layers, int64_t stages);

struct SequentialPipelineOptions {
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int micro_batches = 4;
  int virtual_stages = 1;  // Interleaved1F1B only
  // The children that start stages 1, 2, ... (one name fewer than stages). Empty:
  // contiguous ranges balanced by parameter count.
  std::vector<std::string> split_before;
};

// This rank's stages of a Sequential model and the schedule they run.
class SequentialPipeline {
 public:
  SequentialPipeline(const PipelineMesh& mesh, std::shared_ptr<nn::Sequential> model,
                     SequentialPipelineOptions options = {});

  const PipelineMesh& mesh() const { return mesh_; }
  const Schedule& schedule() const { return schedule_; }
  const std::vector<StageLayers>& split() const { return split_; }  // every stage's children
  // This rank's stage modules, in schedule order (slices of the model).
  const std::vector<std::shared_ptr<nn::Sequential>>& stages() const { return stages_; }
  // Their indices among all stages.
  const std::vector<int>& stage_indices() const { return indices_; }
  std::vector<DistTensor> parameters() const;  // of this rank's stages, each once
  // Parameters children of several stages share, by name (the pipeline keeps them equal).
  const std::vector<TiedParameter>& tied() const { return tied_; }
  // This rank's parameters by name, each once. Stages list every parameter under its
  // name in the whole model (see the header comment), so checkpoints and state files
  // load into the whole model or any other split.
  std::vector<std::pair<std::string, DistTensor>> named_parameters() const;
  // Parameters of the whole model (collective over mesh().group(): each counted by the
  // first stage holding it).
  int64_t num_parameters() const;
  // Full tensors by name, of this rank's stages (collective over the stage mesh), and
  // loading them (strict: a name a stage holds must be there).
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);

  // The runtime for these stages: syncs[k] is stages()[k]'s DDP or FSDP (empty: none);
  // `device`: where the stages compute (PipelineStage::device; unset: their parameters').
  std::unique_ptr<Pipeline> make_pipeline(const std::vector<GradientSync*>& syncs, PipelineData data,
                                          std::optional<Device> device = std::nullopt) const;

 private:
  PipelineMesh mesh_;
  Schedule schedule_;
  std::vector<StageLayers> split_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  std::vector<int> indices_;
  std::vector<TiedParameter> tied_;
};

}  // namespace dtensor::parallel
