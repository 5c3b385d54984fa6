// nn::GPT as pipeline stages: the split of its blocks (explicit, even, or balanced by
// per-layer cost), the stage module, its tensor-parallel plan, and the arrangement of
// one rank's stages with the runtime (pipeline.h).
//
//   DeviceMesh mesh(world, {4, 2, 2}, {"pp", "dp", "tp"});
//   parallel::PipelineMesh pp(mesh);
//   parallel::GPTPipeline gpt(pp, config, seed, {.schedule = ScheduleKind::OneFOneB, .micro_batches = 8});
//   std::vector<parallel::GradientSync*> syncs;
//   for (const auto& stage : gpt.stages()) {                 // this rank's stages
//     parallel::parallelize_module(*stage, pp.stage_mesh()["tp"], parallel::gpt_stage_tp_plan(*stage));
//     ddps.push_back(std::make_unique<parallel::DistributedDataParallel>(*stage, {.dp_dim = "dp"}));
//     syncs.push_back(ddps.back().get());
//   }
//   AdamW optimizer(gpt.parameters(), {.lr = 3e-3});
//   std::unique_ptr<parallel::Pipeline> pipe = gpt.make_pipeline(syncs, ids_of, targets_of);
//   trainer.step(step, *pipe);
//
// Stage k holds blocks [first, end) of the split; the first stage also the token and
// position embeddings (and the embedding dropout), the last the final norm and the LM
// head. Parameters keep nn::GPT's names and seeds, so the stages together are nn::GPT
// with the same seed, value for value, on any mesh; with tied weights the last stage
// holds a copy of tokens.weight for its head (a TiedParameter of the pipeline: its
// gradient is summed with the first stage's, so the copies stay equal).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "dtensor/nn/gpt.h"
#include "dtensor/parallel/pipeline.h"
#include "dtensor/parallel/pipeline_split.h"
#include "dtensor/parallel/tensor_parallel.h"

namespace dtensor::parallel {

// Per-layer cost of a GPT (forward and backward of one micro-batch).
struct GPTLayerCosts {
  double embedding = 0, block = 0, head = 0;
};
// From the FLOPs per token: a block 3 x (8 D^2 + 4 D H (6 with SwiGLU) + 4 T D), the
// head 3 x 2 D V, the embeddings D (memory-bound, nearly free).
GPTLayerCosts estimate_gpt_layer_costs(const nn::GPTConfig& config);
// Seconds measured on this machine: forward and backward of the embeddings, one block
// and the head on micro-batches of `rows` sequences, each on a one-rank mesh, best of
// `repeats`; the largest over the ranks of `group` (collective), so every rank splits
// alike.
GPTLayerCosts measure_gpt_layer_costs(const Group& group, const nn::GPTConfig& config, int64_t rows,
                                      int repeats = 3);
// balance_layers for a GPT of `config.layers` blocks.
std::vector<StageLayers> balance_gpt(const nn::GPTConfig& config, const GPTLayerCosts& costs, int64_t stages);

// One stage of nn::GPT (see the header comment).
class GPTStage : public nn::Module {
 public:
  GPTStage(const DeviceMesh& mesh, const nn::GPTConfig& config, uint64_t seed, StageLayers layers, bool first,
           bool last);
  // First stage: ids [B, T] (I64) -> hidden [B, T, D]; middle: hidden -> hidden; last:
  // -> logits [B, T, vocab].
  DistTensor forward(const DistTensor& x) override;
  // Mean cross-entropy of the last stage's logits against next-token targets [B, T] (F32).
  DistTensor loss(const DistTensor& logits, const DistTensor& targets) const;

  bool is_first() const { return first_; }
  bool is_last() const { return last_; }
  const StageLayers& layers() const { return layers_; }
  const nn::GPTConfig& config() const { return config_; }
  // What the stage takes from the previous one ({-1, -1, dim}; empty for the first).
  std::vector<int64_t> input_shape() const;

 private:
  nn::GPTConfig config_;
  DeviceMesh mesh_;
  StageLayers layers_;
  bool first_, last_;
  std::shared_ptr<nn::Embedding> tokens_, positions_;  // tokens_ also on a tied last stage
  std::shared_ptr<nn::Dropout> dropout_;
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks_;
  std::shared_ptr<nn::Module> norm_;
  std::shared_ptr<nn::Linear> head_;
};

// gpt_tp_plan(stage.config(), options) restricted to what the stage holds: the
// embedding on the first stage (and on a tied last stage, whose head uses it), the
// blocks everywhere, the norm, head and logits on the last.
ParallelizePlan gpt_stage_tp_plan(const GPTStage& stage, GPTPlanOptions options = {});

struct GPTPipelineOptions {
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int micro_batches = 4;
  int virtual_stages = 1;           // Interleaved1F1B only
  std::vector<StageLayers> split;   // one per stage; empty: balanced by estimated costs
};

// This rank's stages of nn::GPT and the schedule they run (collective over the mesh:
// the stage modules' parameters are created on the stage mesh).
class GPTPipeline {
 public:
  GPTPipeline(const PipelineMesh& mesh, const nn::GPTConfig& config, uint64_t seed, GPTPipelineOptions options = {});

  const PipelineMesh& mesh() const { return mesh_; }
  const Schedule& schedule() const { return schedule_; }
  const std::vector<StageLayers>& split() const { return split_; }  // every stage's
  const std::vector<std::shared_ptr<GPTStage>>& stages() const { return stages_; }  // this rank's, in order
  std::vector<DistTensor> parameters() const;  // of this rank's stages
  // Full tensors by nn::GPT's names, of this rank's stages (collective over the stage mesh).
  std::map<std::string, Tensor> state_dict() const;
  // Loads the names this rank's stages hold (collective over the stage mesh).
  void load_state_dict(const std::map<std::string, Tensor>& state);

  // The runtime for these stages: syncs[k] is stages()[k]'s DDP or FSDP (empty: none);
  // ids(step, micro) and targets(step, micro) give the micro-batch's tokens on the
  // first and last stage's mesh (called there only); weights as PipelineData's.
  std::unique_ptr<Pipeline> make_pipeline(const std::vector<GradientSync*>& syncs,
                                          std::function<DistTensor(int64_t step, int64_t micro)> ids,
                                          std::function<DistTensor(int64_t step, int64_t micro)> targets,
                                          std::vector<double> weights = {}) const;

 private:
  PipelineMesh mesh_;
  nn::GPTConfig config_;
  Schedule schedule_;
  std::vector<StageLayers> split_;
  std::vector<std::shared_ptr<GPTStage>> stages_;
};

}  // namespace dtensor::parallel
