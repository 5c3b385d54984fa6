// models::GPT under every parallel module: Megatron-LM's tensor-parallel plan for it
// (parallel::restrict_plan fits it to a pipeline stage) and parallelize_gpt, which composes
// tensor, data (DDP or FSDP/HSDP) and pipeline parallelism from the mesh's dim names
// as examples/train_gpt does:
//
//   DeviceMesh mesh(world, {2, 2, 2}, {"pp", "dp", "tp"});
//   std::unique_ptr<models::ParallelGPT> gpt =
//       models::parallelize_gpt(mesh, config, seed, {.fsdp = 3, .pipeline = {.micro_batches = 4}});
//   AdamW optimizer(gpt->parameters(), {.lr = 3e-3});
//   parallel::Trainer trainer(optimizer, {.sync = gpt->sync()});   // sync is null with pp
//   auto pipe = gpt->make_pipeline(ids_of, targets_of);            // with pp
//
// Mesh dims by name: "tp" tensor parallel (gpt_tp_plan), "dp" data parallel (DDP, or
// FSDP with `fsdp` > 0), "replicate" the replica groups of HSDP, "cp" context parallel
// (the sequence sharded; attention by ring or all-gather), "ep" expert parallel (with
// moe_experts: each rank holds experts / ep of every MoE layer; the batch is sharded
// over ep as over dp; with FSDP each MoE is its own unit), "pp" pipeline stages
// (GPTPipeline: each stage on its dp x cp x tp stage mesh, wrapped as the model would be).
// The order is the one composition requires: tensor parallelism first, then FSDP or
// DDP over the tensor-parallel layouts; the optimizer is built from parameters()
// afterwards.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/models/gpt.h"
#include "dtensor/models/gpt_pipeline.h"
#include "dtensor/ops.h"
#include "dtensor/parallel/ddp.h"
#include "dtensor/parallel/fsdp.h"
#include "dtensor/parallel/plan.h"
#include "dtensor/parallel/tensor_parallel.h"

namespace dtensor::models {

// Megatron-LM's plan for models::GPT: attention heads (q, k, v column parallel, output
// projection row parallel) and the MLP hidden dim (up/gate column parallel, down row
// parallel) sharded, the token embedding vocab parallel (row parallel), and the LM
// head column parallel over the vocabulary (with tied weights the head is the
// vocab-sharded embedding itself). Communication per step: one all-reduce per
// attention and per MLP in forward and in backward (2 per layer per direction),
// plus one for the embedding forward and one for the head's input gradient.
//   sequence_parallel: norms and dropout on sequence shards; each all-reduce becomes
//     a reduce-scatter (forward) and an all-gather (before attention and MLP); the
//     replicated norm weights' gradients are all-reduced (small).
//   loss_parallel: the logits stay sharded over the vocabulary and cross_entropy
//     reduces only [N]-sized statistics; otherwise they are all-gathered.
// models::GPT described for the auto-parallel estimator (parallel/plan.h) at `seq`
// tokens per sequence: its shape, biases, learned positions, the ops it dispatches
// per micro-batch and the memory it keeps (MemorySpec), counted from its ops:
// per block and token, forward keeps 8 values of width dim (the block's input and
// the norms' outputs on every tensor-parallel rank; q, k, v and the attention's
// output split), 2 of width mlp_hidden (4 with SwiGLU: gate, up, their activation
// and product), one FP32 log-sum-exp per head (the CPU and cuDNN attention are
// fused: no [T, T] scores kept) and two FP32 statistics per norm; outside the
// blocks the embedding's output and the position add's (2 x dim), the final norm's
// statistics and the FP32 logits. Backward's peak, in the last block's MLP, adds a
// [tokens, mlp_hidden] gradient (and one of width dim with SwiGLU) after the logits
// are freed. Gradients are dropped after each step (Optimizer::zero_grad).
parallel::ModelSpec gpt_model_spec(const GPTConfig& config, int64_t seq);

struct GPTPlanOptions {
  bool sequence_parallel = false;
  bool loss_parallel = true;
};
// For a pipeline stage: parallel::restrict_plan(gpt_tp_plan(config), stage) (a last
// stage with a tied head holds "tokens" too, and its embedding is vocab parallel).
parallel::ParallelizePlan gpt_tp_plan(const GPTConfig& config, GPTPlanOptions options = {});

struct GPTParallelOptions {
  // Where the model computes: it is built on the CPU (the same initial values on any
  // device) and moved here before tensor, expert and data parallelism wrap it, and
  // distribute_batch / batch_from_local put batches here. On nccl, the mesh group's
  // device (Group::device(): the rank's own GPU).
  Device device = Device::cpu();
  GPTPlanOptions tp;  // with a "tp" mesh dim
  // With a "dp" mesh dim: 0 DDP; 1, 2 or 3 FSDP at that ZeRO stage (every block its
  // own unit, the rest the root's).
  int fsdp = 0;
  bool hsdp = false;  // FSDP sharded over dp and replicated over "replicate"
  // FSDP (stage 2 or 3) with the optimizer's side on the host (parallel::OffloadPolicy).
  bool offload = false;
  // With offload: the share of the parameters offloaded (Megatron's optimizer offload
  // fraction), at the granularity of FSDP units: blocks from the first while their
  // parameters stay within the share, the root's own parameters only at 1. The rest
  // keep their master weights and optimizer state on the device.
  double offload_fraction = 1.0;
  // FSDP mixed precision: parameters gathered in this dtype, gradients reduced in F32.
  std::optional<DType> fsdp_param_dtype;
  // FSDP's gathered working set (ZeRO-3): the unit (Block: each block one fully_shard
  // unit; Layer: a block's attention and its feed-forward each their own, the norms
  // the block's, halving the largest gathered unit for twice the collectives), the
  // prefetch depth (FSDPOptions::prefetch) and whether blocks reshard after forward
  // (unset: FSDP's default, yes but the root).
  enum class FSDPUnit { Block, Layer };
  FSDPUnit fsdp_unit = FSDPUnit::Block;
  int fsdp_prefetch = 1;
  std::optional<bool> fsdp_reshard_after_forward;
  // With a "cp" mesh dim: context parallelism. The sequence is sharded over cp in
  // the load-balanced order by default (distribute_batch puts a batch in it; run the
  // steps inside a ContextParallelScope of context_parallel()); attention is ring or
  // all-gather by the cost model. DDP reduces gradients over dp and cp in one
  // all-reduce; FSDP shards over dp and all-reduces over cp (as HSDP's replicas).
  ContextParallelOptions context{.mesh_dim = "cp", .load_balanced = true};
  double bucket_mb = 25.0;      // DDP bucket size
  GPTPipelineOptions pipeline;  // with a "pp" mesh dim
};

// A GPT laid out over a mesh (see the header comment). Not copyable or movable: the
// wrappers hold the modules.
class ParallelGPT {
 public:
  ParallelGPT(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed, GPTParallelOptions options = {});
  ParallelGPT(const ParallelGPT&) = delete;
  ParallelGPT& operator=(const ParallelGPT&) = delete;

  GPT* model() const { return model_.get(); }                // without pp
  GPTPipeline* pipeline() const { return pipeline_.get(); }  // with pp
  // The model, or this rank's stages (what a TrainState checkpoints).
  std::vector<nn::Module*> modules() const;
  std::vector<DistTensor> parameters() const;
  // The model's DDP or FSDP (for parallel::TrainerOptions::sync); null with pp (the
  // pipeline synchronises its stages) or without a dp dim.
  parallel::GradientSync* sync() const { return pipeline_ || syncs_.empty() ? nullptr : syncs_.front(); }
  // The GPT's parameter count (collective with pp).
  int64_t num_parameters() const;

  // The mesh the batch lives on (the mesh, or this rank's stage mesh), the batch's
  // layout there (Shard(0) over "replicate" and "dp", Replicate over the others), and
  // this rank's data-parallel index and the data-parallel degree.
  const DeviceMesh& data_mesh() const;
  Device device() const { return options_.device; }
  const Placements& batch_layout() const { return batch_layout_; }
  int64_t dp_rank() const { return dp_rank_; }
  int64_t dp_size() const { return dp_size_; }
  // "FSDP ZeRO-3, 1F1B over 4 micro-batches, 2 stages (blocks 0-1 2-3)".
  std::string describe() const;

  // A global batch [B, T] (the same on every rank: ids, targets) on data_mesh() in
  // batch_layout() on options' device, its sequence in the context-parallel order
  // when there is a cp dim.
  DistTensor distribute_batch(const Tensor& global) const;
  // The same from this rank's rows of the batch [B / dp_size(), T] (whole sequences,
  // what a DistributedSampler gives dp_rank(), on any device): with a cp dim, this
  // rank keeps its chunks of the sequence. No communication.
  DistTensor batch_from_local(const Tensor& rows) const;
  // With a "cp" mesh dim, the options to run forward and backward under:
  //   const ContextParallelScope scope(gpt->context_parallel());
  std::optional<ContextParallelOptions> context_parallel() const;

  // With pp: the runtime (GPTPipeline::make_pipeline with this rank's syncs).
  std::unique_ptr<parallel::Pipeline> make_pipeline(std::function<DistTensor(int64_t step, int64_t micro)> ids,
                                                    std::function<DistTensor(int64_t step, int64_t micro)> targets,
                                                    std::vector<double> weights = {}) const;

 private:
  void wrap(nn::Module& module, const DeviceMesh& mesh);  // DDP or FSDP over dp

  DeviceMesh mesh_;
  GPTParallelOptions options_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<GPTPipeline> pipeline_;
  std::vector<std::unique_ptr<parallel::DistributedDataParallel>> ddps_;
  std::vector<std::unique_ptr<parallel::FSDPModule>> fsdps_;
  std::vector<parallel::GradientSync*> syncs_;  // one per wrapped module
  bool cp_ = false;                             // a context-parallel mesh dim
  bool ep_ = false;                             // an expert-parallel mesh dim
  Placements batch_layout_;
  int64_t dp_rank_ = 0, dp_size_ = 1;
};

// A ParallelGPT (collective over the mesh).
std::unique_ptr<ParallelGPT> parallelize_gpt(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed,
                                             GPTParallelOptions options = {});

}  // namespace dtensor::models
