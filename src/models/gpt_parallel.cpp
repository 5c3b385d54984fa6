// models::GPT's tensor-parallel plan and parallelize_gpt.
#include "dtensor/models/gpt_parallel.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dtensor/nn/moe.h"
#include "dtensor/parallel/context_parallel.h"
#include "util/check.h"

namespace dtensor::models {

parallel::ModelSpec gpt_model_spec(const GPTConfig& config, int64_t seq) {
  DT_CHECK_ARG(seq >= 1 && seq <= config.block_size, "gpt_model_spec", "expected seq in [1, block_size ",
               config.block_size, "], got ", seq);
  parallel::ModelSpec m = parallel::ModelSpec::gpt(config.layers, config.dim, config.heads, seq, config.vocab);
  m.name = "models::GPT";
  const bool swiglu = config.activation == nn::Activation::SwiGlu;
  m.ffn_hidden = config.moe_experts > 0 && config.moe_hidden > 0 ? config.moe_hidden
                 : config.mlp_hidden > 0                         ? config.mlp_hidden
                                                                 : 4 * config.dim;
  m.gated_mlp = swiglu;
  m.tied_embeddings = config.tie_weights;
  m.linear_biases = config.bias;
  m.learned_positions = config.block_size;
  m.experts = config.moe_experts;
  m.top_k = config.moe_experts > 0 ? config.moe_top_k : 0;
  m.capacity_factor = config.moe_experts > 0 ? config.moe_capacity_factor : 0;
  m.shared_expert_ffn = config.moe_experts > 0 && config.moe_shared_expert ? m.ffn_hidden : 0;
  m.flash_attention = true;
  m.fused_qkv = false;  // SelfAttention's q, k and v are three Linears
  // Counted by recording steps (DTENSOR_PLAN=step) of 2 and 4 blocks with 1 and 2
  // micro-batches (GELU; the mixture of experts top-2 of 4; context parallelism's ring
  // attention is one op as the fused attention is).
  // A shared expert adds 17 (its MLP forward and backward and the sum with the
  // experts' output, counted with a DispatchTrace over forward and backward). Dropout
  // adds none there (its masks are drawn again from the seed in backward: it keeps
  // nothing either).
  m.ops_per_layer = (config.moe_experts > 0 ? 115 : 70) + (config.moe_experts > 0 && config.moe_shared_expert ? 17 : 0);
  m.ops_outside_layers = 32;
  // Each block's norms (scale, and shift for LayerNorm with biases), q, k, v, the output
  // projection and the MLP's matrices (three with SwiGLU), with biases; outside, the
  // token and position tables, the final norm and an untied output matrix.
  // A mixture of experts' MLP is the router and the experts' stacked matrices, without
  // biases.
  const int64_t norm_tensors = config.rms_norm || !config.bias ? 1 : 2;
  const int64_t mlp_matrices = swiglu ? 3 : 2;
  m.tensors_per_layer = 2 * norm_tensors + 4 * (config.bias ? 2 : 1) +
                        (config.moe_experts > 0 ? 1 + mlp_matrices : mlp_matrices * (config.bias ? 2 : 1)) +
                        (m.shared_expert_ffn > 0 ? mlp_matrices : 0);  // the shared expert has no biases
  m.tensors_outside_layers = 2 + norm_tensors + (config.tie_weights ? 0 : 1);
  parallel::MemorySpec& mem = m.memory;
  mem.hidden = 4;        // the block's input, norm1's output, the residual sum, norm2's output
  mem.hidden_split = 4;  // q, k, v, the attention's output
  mem.ffn_split = swiglu ? 4 : 2;
  mem.scores = 0;
  mem.per_head = 1;
  mem.scalars = config.rms_norm ? 2 : 4;  // mean and reciprocal deviation of each norm (RMSNorm: one each)
  mem.sp_gathered = 2;                    // the norms' outputs, gathered for q, k, v and the MLP
  mem.pipeline_hidden = 2;
  // A deferred weight gradient (zero-bubble's W) keeps each Linear's input and output
  // gradient, and the attention's q, k and v (its node stays alive behind the output
  // projection's): whole on every tp rank, the norms' outputs and the row-parallel
  // outputs' gradients; split, the attention's output, q, k, v and their gradients;
  // of width mlp_hidden, down's input and up's output gradient (with SwiGLU gate's
  // too). Measured on one GELU block: 1282 values per token held after the input
  // gradient, 1216 counted so.
  mem.deferred_hidden = 4;
  mem.deferred_split = 7;
  mem.deferred_ffn = swiglu ? 3 : 2;
  mem.checkpointed_hidden = 1;
  mem.outside_hidden = 2;
  mem.outside_scalars = config.rms_norm ? 1 : 2;
  mem.logits = 1;
  mem.backward_ffn = 1;
  mem.backward_hidden = swiglu ? 1 : 0;
  mem.backward_frees_logits = true;
  // The loss's backward: the fused loss makes the logits' gradient; the vocab-parallel
  // composite (cross_entropy.cpp) holds the gradients of exp's input, of the expanded
  // sum and of the target pick's scatter, and their sum.
  mem.loss_backward = 1;
  mem.loss_backward_split = 4;
  mem.gradients_persist = false;
  // 16-bit training (train_gpt --precision bf16/fp16) computes over FP32 parameters.
  mem.fp32_parameters = true;
  // FSDP shards over the 'dp' mesh dim only; cp and ep hold replicas (HSDP's way).
  mem.zero_over_cp_and_ep = false;
  // Under context parallelism the ring attention's output (an FP32 accumulator, heads
  // major) is copied into the tokens' order for the output projection, which keeps it.
  mem.cp_split = 1;
  if (config.moe_experts > 0) {
    // nn::MoE keeps per routed copy the dispatched rows and the experts' output (width
    // hidden) and the experts' pre-activation and activation (ffn_split); per token the
    // router's probabilities and the chosen one-hot (FP32, per expert: 1 + k), the raw
    // and normalised gates and their sum (2k + 1) and two int64 index tables per copy
    // (4k FP32's worth), two more under expert parallelism.
    const auto k = static_cast<double>(config.moe_top_k);
    mem.moe_hidden = 2;
    mem.moe_router = 1 + k;
    mem.moe_scalars = 6 * k + 1;
    mem.moe_ep_scalars = 4 * k;
  }
  return m;
}

namespace {

constexpr const char* kOp = "parallelize_gpt";

bool has_dim(const DeviceMesh& mesh, const std::string& name) {
  return std::count(mesh.names().begin(), mesh.names().end(), name) > 0;
}

// Where a block's row-parallel output goes: reduced whole, or reduce-scattered over
// the sequence.
Placement block_output(const GPTPlanOptions& options) {
  return options.sequence_parallel ? Placement(Shard(1)) : Placement(Replicate());
}

}  // namespace

parallel::ParallelizePlan gpt_tp_plan(const GPTConfig& config, GPTPlanOptions options) {
  using namespace parallel;  // NOLINT(google-build-using-namespace): the style names
  const bool sp = options.sequence_parallel;
  const Placement out = block_output(options);
  ParallelizePlan plan;
  plan.emplace_back("tokens", RowwiseParallel{.output_layouts = out});
  if (sp) plan.emplace_back("blocks.*.norm1", SequenceParallel{});
  plan.emplace_back("blocks.*.attn", PrepareModuleInput{.desired_input_layouts = Replicate()});
  for (const char* p : {"q", "k", "v"}) plan.emplace_back(std::string("blocks.*.attn.") + p, ColwiseParallel{});
  plan.emplace_back("blocks.*.attn.out", RowwiseParallel{.output_layouts = out});
  if (sp) plan.emplace_back("blocks.*.norm2", SequenceParallel{});
  // Megatron's MLP: its input replicated, up (and gate) column parallel, down row
  // parallel into the block's output layout.
  const auto dense_mlp = [&](const std::string& name) {
    plan.emplace_back(name, PrepareModuleInput{.desired_input_layouts = Replicate()});
    plan.emplace_back(name + ".up", ColwiseParallel{});
    if (config.activation == nn::Activation::SwiGlu) plan.emplace_back(name + ".gate", ColwiseParallel{});
    plan.emplace_back(name + ".down", RowwiseParallel{.output_layouts = out});
  };
  if (config.moe_experts > 0) {
    // Every expert's hidden dim sharded (the router replicated): the experts' output is
    // summed over tp inside the layer; under sequence parallelism, scattered again.
    plan.emplace_back("blocks.*.moe", ExpertParallel{.hidden = true});
    if (sp) plan.emplace_back("blocks.*.moe", PrepareModuleOutput{.desired_output_layouts = out});
    if (config.moe_shared_expert) {
      // The shared expert as a dense MLP (Megatron-Core shards it so): its output reduced
      // to the block's output layout (scattered over the sequence with sequence
      // parallelism), and added to the routed experts' output there.
      dense_mlp("blocks.*.moe.shared");
    }
  } else {
    dense_mlp("blocks.*.mlp");
  }
  const Placement logits = options.loss_parallel ? Placement(Shard(-1)) : Placement(Replicate());
  if (sp) plan.emplace_back("norm", SequenceParallel{});
  if (config.tie_weights) {
    // The head is the vocab-sharded embedding: x @ tokens.weight^T is column
    // parallel by propagation once x is replicated (gathered from its sequence
    // shards under sequence parallelism).
    if (sp) plan.emplace_back("norm", PrepareModuleOutput{.desired_output_layouts = Replicate()});
    plan.emplace_back("head", PrepareModuleOutput{.desired_output_layouts = logits});
  } else {
    plan.emplace_back("head", ColwiseParallel{.output_layouts = logits});
  }
  return plan;
}

ParallelGPT::ParallelGPT(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed, GPTParallelOptions options)
    : mesh_(mesh), options_(std::move(options)) {
  DT_CHECK_ARG(options_.fsdp >= 0 && options_.fsdp <= 3, kOp, "expected fsdp 0 (DDP) or a ZeRO stage 1-3, got ",
               options_.fsdp);
  DT_CHECK_ARG(options_.fsdp == 0 || has_dim(mesh, "dp"), kOp, "FSDP shards over a mesh dim named 'dp'; mesh ",
               mesh.to_string(), " has none");
  DT_CHECK_ARG(!options_.hsdp || (options_.fsdp > 0 && has_dim(mesh, "replicate")), kOp,
               "HSDP needs fsdp > 0 and a mesh dim named 'replicate'; got fsdp ", options_.fsdp, " on mesh ",
               mesh.to_string());
  DT_CHECK_ARG(!options_.offload || options_.fsdp >= 2, kOp, "offload needs fsdp 2 or 3, got fsdp ", options_.fsdp);
  DT_CHECK_ARG(options_.offload_fraction >= 0 && options_.offload_fraction <= 1, kOp,
               "expected offload_fraction in [0, 1], got ", options_.offload_fraction);
  DT_CHECK_ARG(options_.hsdp || !has_dim(mesh, "replicate"), kOp, "mesh ", mesh.to_string(),
               " has a 'replicate' dim, which only HSDP uses (fsdp > 0 and hsdp = true); name it 'dp' for DDP");
  const bool tp = has_dim(mesh, "tp");
  cp_ = has_dim(mesh, options_.context.mesh_dim);
  DT_CHECK_ARG(!cp_ || !options_.tp.sequence_parallel, kOp,
               "sequence parallelism and context parallelism both shard the sequence; mesh ", mesh.to_string(),
               " has a '", options_.context.mesh_dim, "' dim: turn sequence_parallel off");
  ep_ = has_dim(mesh, "ep");
  DT_CHECK_ARG(!ep_ || config.moe_experts > 0, kOp, "mesh ", mesh.to_string(),
               " has an 'ep' dim (expert parallel), which needs a mixture-of-experts model (moe_experts > 0)");
  DT_CHECK_ARG(!cp_ || !options_.hsdp, kOp, "HSDP over 'replicate' with context parallelism over '",
               options_.context.mesh_dim, "' is not supported (FSDP all-reduces over the cp dim as over replicas)");
  if (cp_ && options_.context.load_balanced) {
    const int64_t chunks = 2 * mesh.size(options_.context.mesh_dim);
    DT_CHECK_ARG(config.block_size % chunks == 0, kOp,
                 "the load-balanced context-parallel order cuts the sequence into ", chunks,
                 " equal chunks; block_size ", config.block_size,
                 " is not a multiple (feed sequences of such lengths, or set context.load_balanced = false)");
  }
  if (!has_dim(mesh, "pp")) {
    model_ = std::make_unique<GPT>(mesh, config, seed);
    model_->to(options_.device);
    // Tensor and expert parallelism first, then DDP or FSDP over their layouts.
    if (tp) parallel::parallelize_module(*model_, mesh["tp"], gpt_tp_plan(model_->config(), options_.tp));
    if (ep_) parallel::parallelize_module(*model_, mesh["ep"], {{"blocks.*.moe", parallel::ExpertParallel{}}});
    wrap(*model_, mesh);
  } else {
    pipeline_ = std::make_unique<GPTPipeline>(parallel::PipelineMesh(mesh), config, seed, options_.pipeline);
    const DeviceMesh& stage_mesh = pipeline_->mesh().stage_mesh();
    for (const auto& stage : pipeline_->stages()) {
      stage->to(options_.device);
      if (tp) {
        parallel::parallelize_module(*stage, stage_mesh["tp"],
                                     parallel::restrict_plan(gpt_tp_plan(pipeline_->config(), options_.tp), *stage));
      }
      const parallel::ParallelizePlan experts{{"blocks.*.moe", parallel::ExpertParallel{}}};
      if (ep_ && !parallel::restrict_plan(experts, *stage).empty()) {
        parallel::parallelize_module(*stage, stage_mesh["ep"], experts);
      }
      wrap(*stage, stage_mesh);
    }
  }
  const DeviceMesh& data = data_mesh();
  for (int d = 0; d < data.ndim(); ++d) {
    const std::string& name = data.names()[static_cast<size_t>(d)];
    const bool data_parallel = name == "dp" || name == "replicate" || name == "ep";
    batch_layout_.push_back(data_parallel                       ? Placement(Shard(0))
                            : name == options_.context.mesh_dim ? Placement(Shard(1))
                                                                : Placement(Replicate()));
    if (data_parallel) {
      dp_rank_ = dp_rank_ * data.size(d) + data.coordinate(d);
      dp_size_ *= data.size(d);
    }
  }
}

void ParallelGPT::wrap(nn::Module& module, const DeviceMesh& mesh) {
  if (options_.fsdp > 0) {
    // Context and expert parallelism: the gradients are sums over cp and ep too,
    // all-reduced there as HSDP's are over its replicas.
    parallel::FSDPOptions fsdp;
    fsdp.stage = options_.fsdp;
    fsdp.replicate_dim = options_.hsdp ? "replicate" : cp_ ? options_.context.mesh_dim : ep_ ? "ep" : "";
    fsdp.prefetch = options_.fsdp_prefetch;
    fsdp.reshard_after_forward = options_.fsdp_reshard_after_forward;
    if (options_.fsdp_param_dtype) {
      fsdp.mixed_precision = {.param_dtype = options_.fsdp_param_dtype, .reduce_dtype = DType::F32};
    }
    // Offloaded units: every block and the root, or (offload_fraction < 1) the first
    // blocks within the share.
    std::set<const nn::Module*> offloaded;
    if (options_.offload) {
      if (options_.offload_fraction >= 1) offloaded.insert(&module);
      const double share = options_.offload_fraction * static_cast<double>(module.num_parameters());
      int64_t taken = 0;
      for (auto& [_, m] : module.named_modules()) {
        if (!dynamic_cast<nn::TransformerBlock*>(m)) continue;
        if (static_cast<double>(taken + m->num_parameters()) > share) break;
        taken += m->num_parameters();
        offloaded.insert(m);
      }
    }
    const auto options_for = [&](const nn::Module* block, const parallel::FSDPOptions& base) {
      parallel::FSDPOptions o = base;
      if (offloaded.count(block)) o.offload = parallel::OffloadPolicy{};
      return o;
    };
    // With ep, each MoE its own unit first: its experts are sharded over ep (no replicas
    // there), and its router's gradient, left Partial over ep, is reduced by the
    // optimizer (as any gradient Partial over a dim FSDP does not own). An MoE is
    // offloaded with its block.
    parallel::FSDPOptions experts = fsdp;
    experts.replicate_dim = "";
    for (auto& [_, m] : module.named_modules()) {
      if (ep_ && dynamic_cast<nn::MoE*>(m)) parallel::fully_shard(*m, mesh, options_for(m->parent(), experts));
    }
    // Layer units: a block's attention and feed-forward first (an MoE under ep is one already).
    const bool layer_units = options_.fsdp_unit == GPTParallelOptions::FSDPUnit::Layer;
    for (auto& [_, m] : module.named_modules()) {
      const auto* block = dynamic_cast<const nn::TransformerBlock*>(m);
      if (!layer_units || !block) continue;
      parallel::fully_shard(block->attention(), mesh, options_for(block, fsdp));
      nn::Module& feed_forward = block->feed_forward();
      if (!(ep_ && dynamic_cast<nn::MoE*>(&feed_forward)))
        parallel::fully_shard(feed_forward, mesh, options_for(block, fsdp));
    }
    for (auto& [_, m] : module.named_modules()) {
      if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, options_for(m, fsdp));
    }
    fsdps_.push_back(
        std::make_unique<parallel::FSDPModule>(parallel::fully_shard(module, mesh, options_for(&module, fsdp))));
    syncs_.push_back(fsdps_.back().get());
  } else if (has_dim(mesh, "dp") || cp_ || ep_) {
    // Over dp, and over cp and ep too (one all-reduce; an expert weight, sharded over
    // ep, over the others); over cp or ep alone without dp.
    parallel::DDPOptions ddp;
    ddp.bucket_cap_mb = options_.bucket_mb;
    ddp.dp_dim = "dp";
    std::vector<std::string> token_dims;
    if (cp_) token_dims.push_back(options_.context.mesh_dim);
    if (ep_) token_dims.push_back("ep");
    if (has_dim(mesh, "dp")) {
      ddp.dp_dim = "dp";
    } else {
      ddp.dp_dim = token_dims.front();
      token_dims.erase(token_dims.begin());
    }
    ddp.token_dims = token_dims;
    ddps_.push_back(std::make_unique<parallel::DistributedDataParallel>(module, ddp));
    syncs_.push_back(ddps_.back().get());
  }
}

std::vector<nn::Module*> ParallelGPT::modules() const {
  if (model_) return {model_.get()};
  std::vector<nn::Module*> out;
  for (const auto& stage : pipeline_->stages()) out.push_back(stage.get());
  return out;
}

std::vector<DistTensor> ParallelGPT::parameters() const {
  return model_ ? model_->parameters() : pipeline_->parameters();
}

int64_t ParallelGPT::num_parameters() const { return model_ ? model_->num_parameters() : pipeline_->num_parameters(); }

const DeviceMesh& ParallelGPT::data_mesh() const { return pipeline_ ? pipeline_->mesh().stage_mesh() : mesh_; }

std::string ParallelGPT::describe() const {
  std::string out = options_.fsdp > 0 ? (options_.hsdp ? "HSDP ZeRO-" : "FSDP ZeRO-") + std::to_string(options_.fsdp)
                    : !ddps_.empty()  ? "DDP"
                                      : "no data parallelism";
  if (options_.offload) {
    out += options_.offload_fraction >= 1
               ? std::string(" with offload")
               : " with offload of " + std::to_string(static_cast<int>(std::lround(options_.offload_fraction * 100))) +
                     "% of the parameters";
  }
  if (options_.fsdp > 0) {
    // The gathered working set, where it differs from the defaults.
    if (options_.fsdp_unit == GPTParallelOptions::FSDPUnit::Layer) out += ", layer units";
    if (options_.fsdp_prefetch != 1) out += ", prefetch " + std::to_string(options_.fsdp_prefetch);
    if (options_.fsdp_reshard_after_forward == false) out += ", gathered parameters kept after forward";
  }
  if (ep_) out += ", expert parallel over ep";
  if (cp_) {
    out += std::string(", context parallel over ") + options_.context.mesh_dim +
           (options_.context.load_balanced ? " (load-balanced)" : "");
  }
  if (pipeline_) {
    std::string split;
    for (const parallel::StageLayers& l : pipeline_->split()) {
      split += (split.empty() ? "" : " ") + std::to_string(l.first) + "-" + std::to_string(l.end - 1);
    }
    const parallel::Schedule& s = pipeline_->schedule();
    out += ", " + s.name + " over " + std::to_string(s.micro_batches) + " micro-batches, " + std::to_string(s.stages) +
           " stages (blocks " + split + ")";
  }
  return out;
}

DistTensor ParallelGPT::distribute_batch(const Tensor& batch) const {
  const Tensor global = batch.to(options_.device);
  if (!cp_) return distribute(global, data_mesh(), batch_layout_);
  return parallel::distribute_sequence(global, data_mesh(), batch_layout_, options_.context, 1);
}

DistTensor ParallelGPT::batch_from_local(const Tensor& batch_rows) const {
  DT_CHECK_ARG(batch_rows.dim() == 2, kOp, "expected this rank's rows of the batch [B, T], got ", batch_rows.shape());
  const Tensor rows = batch_rows.to(options_.device);
  const Shape global{rows.size(0) * dp_size_, rows.size(1)};
  if (!cp_) return DistTensor::from_local(rows, data_mesh(), batch_layout_, global);
  const DeviceMesh& mesh = data_mesh();
  const int64_t ranks = mesh.size(options_.context.mesh_dim),
                rank = mesh.coordinate(mesh.dim_index(options_.context.mesh_dim));
  const int64_t t = rows.size(1);
  Tensor mine;
  if (!options_.context.load_balanced || ranks == 1) {
    const Range r = chunk_range(t, ranks, rank);
    mine = rows.narrow(1, r.offset, r.length).contiguous();
  } else {
    DT_CHECK_ARG(t % (2 * ranks) == 0, kOp, "the load-balanced order cuts the ", t, " positions into ", 2 * ranks,
                 " equal chunks");
    const int64_t half = t / (2 * ranks);
    mine = Tensor::empty({rows.size(0), 2 * half}, rows.dtype(), rows.device());
    mine.narrow(1, 0, half).copy_(rows.narrow(1, rank * half, half));
    mine.narrow(1, half, half).copy_(rows.narrow(1, (2 * ranks - 1 - rank) * half, half));
  }
  return DistTensor::from_local(mine, mesh, batch_layout_, global);
}

std::optional<ContextParallelOptions> ParallelGPT::context_parallel() const {
  return cp_ ? std::optional<ContextParallelOptions>(options_.context) : std::nullopt;
}

std::unique_ptr<parallel::Pipeline> ParallelGPT::make_pipeline(std::function<DistTensor(int64_t, int64_t)> ids,
                                                               std::function<DistTensor(int64_t, int64_t)> targets,
                                                               std::vector<double> weights) const {
  DT_CHECK_ARG(pipeline_ != nullptr, kOp, "make_pipeline needs a mesh with a 'pp' dim, got ", mesh_.to_string());
  return pipeline_->make_pipeline(syncs_, std::move(ids), std::move(targets), std::move(weights), options_.device);
}

std::unique_ptr<ParallelGPT> parallelize_gpt(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed,
                                             GPTParallelOptions options) {
  return std::make_unique<ParallelGPT>(mesh, config, seed, std::move(options));
}

}  // namespace dtensor::models
