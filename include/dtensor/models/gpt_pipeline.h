// models::GPT as pipeline stages: the split of its blocks (explicit, even, or balanced
// by per-layer cost) and one rank's stages, which are slices of the GPT Sequential
// (parallel::SequentialPipeline applied to GPT; no GPT-specific stage code).
//
//   DeviceMesh mesh(world, {4, 2, 2}, {"pp", "dp", "tp"});
//   parallel::PipelineMesh pp(mesh);
//   models::GPTPipeline gpt(pp, config, seed, {.schedule = ScheduleKind::OneFOneB, .micro_batches = 8});
//   for (const auto& stage : gpt.stages()) {                 // this rank's stages
//     parallel::parallelize_module(*stage, pp.stage_mesh()["tp"],
//                                  parallel::restrict_plan(models::gpt_tp_plan(config), *stage));
//     ddps.push_back(std::make_unique<parallel::DistributedDataParallel>(*stage, {.dp_dim = "dp"}));
//     syncs.push_back(ddps.back().get());
//   }
//   AdamW optimizer(gpt.parameters(), {.lr = 3e-3});
//   std::unique_ptr<parallel::Pipeline> pipe = gpt.make_pipeline(syncs, ids_of, targets_of);
//   trainer.step(step, *pipe);
//
// Every rank builds the GPT on its stage mesh with the seed (the same values on any
// mesh) and keeps the pieces of its stages: the first stage holds tokens, positions
// and dropout, every stage some blocks, the last the norm and the head. So the stages
// together are models::GPT with the same seed, value for value, under the same names.
// With tied weights the last stage's head holds a copy of tokens.weight (shared into
// the stage under that name), which the pipeline keeps equal to the first stage's by
// summing their gradients.
// models::parallelize_gpt (gpt_parallel.h) does all of the above from the mesh.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/models/gpt.h"
#include "dtensor/parallel/pipeline.h"
#include "dtensor/parallel/pipeline_split.h"

namespace dtensor::models {

// Per-layer cost of a GPT (forward and backward of one micro-batch).
struct GPTLayerCosts {
  double embedding = 0, block = 0, head = 0;
};
// From the FLOPs per token: a block 3 x (8 D^2 + 4 D H (6 with SwiGLU) + 4 T D), the
// head 3 x 2 D V, the embeddings D (memory-bound, nearly free).
GPTLayerCosts estimate_gpt_layer_costs(const GPTConfig& config);
// Seconds measured on this machine: forward and backward of the embeddings, one block
// and the head on micro-batches of `rows` sequences, each on a one-rank mesh, best of
// `repeats`; the largest over the ranks of `group` (collective), so every rank splits
// alike.
GPTLayerCosts measure_gpt_layer_costs(const Group& group, const GPTConfig& config, int64_t rows, int repeats = 3);
// parallel::balance_layers for the `config.layers` blocks of a GPT.
std::vector<parallel::StageLayers> balance_gpt(const GPTConfig& config, const GPTLayerCosts& costs, int64_t stages);

struct GPTPipelineOptions {
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  int micro_batches = 4;
  int virtual_stages = 1;                    // Interleaved1F1B only
  std::vector<parallel::StageLayers> split;  // blocks of each stage; empty: balanced by estimated costs
};

// This rank's stages of models::GPT and the schedule they run (collective over the
// mesh: the parameters are created on the stage mesh).
class GPTPipeline {
 public:
  GPTPipeline(const parallel::PipelineMesh& mesh, const GPTConfig& config, uint64_t seed,
              GPTPipelineOptions options = {});

  const parallel::PipelineMesh& mesh() const { return stages_.mesh(); }
  const parallel::Schedule& schedule() const { return stages_.schedule(); }
  const GPTConfig& config() const { return config_; }
  const std::vector<parallel::StageLayers>& split() const { return split_; }  // every stage's blocks
  // This rank's stages, in schedule order: slices of the GPT Sequential.
  const std::vector<std::shared_ptr<nn::Sequential>>& stages() const { return stages_.stages(); }
  // The generic split underneath (stage indices, ties).
  const parallel::SequentialPipeline& sequential() const { return stages_; }
  std::vector<DistTensor> parameters() const { return stages_.parameters(); }
  // By GPT's names, each once.
  std::vector<std::pair<std::string, DistTensor>> named_parameters() const { return stages_.named_parameters(); }
  // The GPT's parameter count (collective over the pipeline group).
  int64_t num_parameters() const { return stages_.num_parameters(); }
  // Full tensors by GPT's names, of this rank's stages (collective over the stage mesh).
  std::map<std::string, Tensor> state_dict() const { return stages_.state_dict(); }
  // Loads the names this rank's stages hold (collective over the stage mesh).
  void load_state_dict(const std::map<std::string, Tensor>& state) { stages_.load_state_dict(state); }

  // The runtime for these stages: syncs[k] is stages()[k]'s DDP or FSDP (empty: none);
  // ids(step, micro) and targets(step, micro) give the micro-batch's tokens on the
  // first and last stage's mesh (called there only); weights as PipelineData's;
  // `device` where the stages compute (unset: their parameters', which FSDP's offload
  // keeps on the host).
  std::unique_ptr<parallel::Pipeline> make_pipeline(const std::vector<parallel::GradientSync*>& syncs,
                                                    std::function<DistTensor(int64_t step, int64_t micro)> ids,
                                                    std::function<DistTensor(int64_t step, int64_t micro)> targets,
                                                    std::vector<double> weights = {},
                                                    std::optional<Device> device = std::nullopt) const;

 private:
  GPTConfig config_;
  std::vector<parallel::StageLayers> split_;
  parallel::SequentialPipeline stages_;
};

}  // namespace dtensor::models
