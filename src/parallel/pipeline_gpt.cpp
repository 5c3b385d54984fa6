// nn::GPT split into pipeline stages: splits, per-layer costs, the stage module, its
// tensor-parallel plan and one rank's arrangement.
#include "dtensor/parallel/pipeline_gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "dtensor/autograd.h"
#include "dtensor/nn/checkpoint.h"
#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "pipeline_gpt";

}  // namespace

GPTLayerCosts estimate_gpt_layer_costs(const nn::GPTConfig& config) {
  const double d = static_cast<double>(config.dim), t = static_cast<double>(config.block_size),
               v = static_cast<double>(config.vocab);
  const double hidden = static_cast<double>(config.mlp_hidden ? config.mlp_hidden : 4 * config.dim);
  const double mlp = (config.activation == nn::Activation::SwiGlu ? 6.0 : 4.0) * d * hidden;
  return {d, 3.0 * (8.0 * d * d + mlp + 4.0 * t * d), 3.0 * 2.0 * d * v};
}

GPTLayerCosts measure_gpt_layer_costs(const Group& group, const nn::GPTConfig& config, int64_t rows, int repeats) {
  DT_CHECK_ARG(rows >= 1 && repeats >= 1, kOp, "expected rows >= 1 and repeats >= 1, got ", rows, " and ", repeats);
  GPTLayerCosts best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::infinity()};
  nn::GPTConfig c = config;
  c.layers = 1;
  const Group self = group.split(group.rank());
  const DeviceMesh one(self, {1});
  // A one-block model as a first stage (embeddings + block) and as a last (block +
  // head); the block alone is timed too and taken off both.
  GPTStage first(one, c, 1, {0, 1}, true, false);
  GPTStage last(one, c, 1, {0, 1}, false, true);
  nn::TransformerBlock& block = dynamic_cast<nn::TransformerBlock&>(first.submodule("blocks.0"));
  const Tensor ids = Tensor::zeros({rows, c.block_size}, DType::I64);
  const DistTensor x = distribute(ids, one, {Replicate()});
  auto seconds = [](const auto& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int k = 0; k < repeats; ++k) {
    DistTensor hidden;
    const double with_block = seconds([&] {
      hidden = first(x);
      sum(hidden).backward();
    });
    const DistTensor h = hidden.detach().set_requires_grad();
    const double block_only = seconds([&] { sum(block(h)).backward(); });
    const double with_head = seconds([&] { last.loss(last(h), x).backward(); });
    best.block = std::min(best.block, block_only);
    best.embedding = std::min(best.embedding, std::max(with_block - block_only, 0.0));
    best.head = std::min(best.head, std::max(with_head - block_only, 0.0));
  }
  Tensor all = Tensor::from_vector<double>({best.embedding, best.block, best.head}, {3});
  all_reduce_(group, all, ReduceOp::Max);
  const std::vector<double> v = all.to_vector<double>();
  return {v[0], v[1], v[2]};
}

std::vector<StageLayers> balance_gpt(const nn::GPTConfig& config, const GPTLayerCosts& costs, int64_t stages) {
  return balance_layers(std::vector<double>(static_cast<size_t>(config.layers), costs.block), costs.embedding,
                        costs.head, stages);
}

// ---- the stage module --------------------------------------------------------------------------

// Names and seeds are nn::GPT's (src/nn/gpt.cpp), so that the stages together are that
// model: tokens 0, positions 1, dropout 2, head 3, block i 100 + i.
GPTStage::GPTStage(const DeviceMesh& mesh, const nn::GPTConfig& config, uint64_t seed, StageLayers layers, bool first,
                   bool last)
    : config_(config), mesh_(mesh), layers_(layers), first_(first), last_(last) {
  DT_CHECK_ARG(config.vocab > 0 && config.block_size > 0 && config.dim > 0, kOp,
               "expected positive vocab, block_size and dim, got vocab ", config.vocab, ", block_size ",
               config.block_size, ", dim ", config.dim);
  DT_CHECK_ARG(layers.first >= 0 && layers.end <= config.layers && layers.first < layers.end, kOp, "stage blocks [",
               layers.first, ", ", layers.end, ") do not fit a model of ", config.layers, " blocks");
  if (config_.mlp_hidden == 0) config_.mlp_hidden = 4 * config_.dim;
  if (first_ || (last_ && config_.tie_weights)) {
    tokens_ = register_module(
        "tokens", std::make_shared<nn::Embedding>(mesh, config_.vocab, config_.dim, nn::derive_seed(seed, 0)));
  }
  if (first_) {
    positions_ = register_module(
        "positions", std::make_shared<nn::Embedding>(mesh, config_.block_size, config_.dim, nn::derive_seed(seed, 1)));
    dropout_ = register_module("dropout", std::make_shared<nn::Dropout>(config_.dropout, nn::derive_seed(seed, 2)));
  }
  const nn::BlockConfig block{config_.dim,      config_.heads, config_.mlp_hidden, config_.activation,
                              config_.rms_norm, config_.bias,  config_.dropout,    config_.layers};
  for (int64_t i = layers.first; i < layers.end; ++i) {
    blocks_.push_back(register_module("blocks." + std::to_string(i), std::make_shared<nn::TransformerBlock>(
                                                                         mesh, block, nn::derive_seed(seed, 100 + i))));
  }
  if (last_) {
    norm_ = config_.rms_norm
                ? std::shared_ptr<nn::Module>(register_module("norm", std::make_shared<nn::RMSNorm>(mesh, config_.dim)))
                : std::shared_ptr<nn::Module>(
                      register_module("norm", std::make_shared<nn::LayerNorm>(mesh, config_.dim, 1e-5, config_.bias)));
    if (!config_.tie_weights) {
      head_ = register_module(
          "head", std::make_shared<nn::Linear>(mesh, config_.dim, config_.vocab, false, nn::derive_seed(seed, 3)));
    }
  }
}

DistTensor GPTStage::forward(const DistTensor& input) {
  DistTensor x = input;
  if (first_) {
    DT_CHECK_ARG(x.dim() == 2 && x.dtype() == DType::I64, kOp, "the first stage takes token ids [B, T] of i64, got ",
                 x.shape(), " of ", dtype_name(x.dtype()));
    const int64_t t = x.size(1);
    DT_CHECK_ARG(t <= config_.block_size, kOp, "sequence length ", t, " exceeds block_size ", config_.block_size);
    const DistTensor positions =
        distribute(Tensor::arange(t, DType::I64, x.device()), mesh_, Placements(mesh_.ndim(), Replicate()));
    x = (*dropout_)(add((*tokens_)(x), (*positions_)(positions)));
  } else {
    DT_CHECK_ARG(x.dim() == 3 && x.size(2) == config_.dim, kOp, "stage blocks [", layers_.first, ", ", layers_.end,
                 ") take hidden states [B, T, ", config_.dim, "], got ", x.shape());
  }
  for (const auto& block : blocks_) x = config_.checkpoint_activations ? nn::checkpoint(*block, x) : (*block)(x);
  if (!last_) return x;
  x = (*norm_)(x);
  if (head_) return (*head_)(x);
  return matmul(x, transpose(nn::for_compute(tokens_->weight()), 0, 1));
}

DistTensor GPTStage::loss(const DistTensor& logits, const DistTensor& targets) const {
  DT_CHECK_ARG(last_, kOp, "only the last stage computes the loss");
  DT_CHECK_ARG(
      logits.dim() == 3 && targets.dim() == 2 && targets.size(0) == logits.size(0) && targets.size(1) == logits.size(1),
      kOp, "targets ", targets.shape(), " must match the logits' first two dims ", logits.shape());
  const int64_t rows = targets.size(0) * targets.size(1);
  return cross_entropy(reshape(logits, {rows, config_.vocab}).to(DType::F32), reshape(targets, {rows}));
}

std::vector<int64_t> GPTStage::input_shape() const {
  if (first_) return {};
  return {-1, -1, config_.dim};
}

ParallelizePlan gpt_stage_tp_plan(const GPTStage& stage, GPTPlanOptions options) {
  ParallelizePlan plan;
  const bool holds_tokens = stage.is_first() || (stage.is_last() && stage.config().tie_weights);
  for (auto& [pattern, style] : gpt_tp_plan(stage.config(), options)) {
    const bool blocks = pattern.rfind("blocks.", 0) == 0;
    if (pattern == "tokens" ? holds_tokens : blocks || stage.is_last()) plan.emplace_back(pattern, style);
  }
  return plan;
}

// ---- one rank's arrangement ----------------------------------------------------------------------

GPTPipeline::GPTPipeline(const PipelineMesh& mesh, const nn::GPTConfig& config, uint64_t seed,
                         GPTPipelineOptions options)
    : mesh_(mesh), config_(config) {
  schedule_ = make_schedule(options.schedule, mesh.size(), options.micro_batches, options.virtual_stages);
  const int64_t stages = schedule_.stages;
  DT_CHECK_ARG(stages <= config.layers, kOp, stages, " pipeline stages (", mesh.pp_dim(), "=", mesh.size(), " x ",
               schedule_.virtual_stages(), " virtual) need at least ", stages,
               " transformer blocks (one per stage), the model has ", config.layers);
  if (options.split.empty()) {
    split_ = balance_gpt(config, estimate_gpt_layer_costs(config), stages);
  } else {
    check_split(options.split, config.layers, stages);
    split_ = options.split;
  }
  for (int s : schedule_.stages_of(mesh.coordinate())) {
    stages_.push_back(std::make_shared<GPTStage>(mesh.stage_mesh(), config, seed, split_[static_cast<size_t>(s)],
                                                 s == 0, s + 1 == stages));
  }
}

std::vector<DistTensor> GPTPipeline::parameters() const {
  std::vector<DistTensor> out;
  for (const auto& s : stages_) {
    for (const DistTensor& p : s->parameters()) out.push_back(p);
  }
  return out;
}

std::map<std::string, Tensor> GPTPipeline::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& s : stages_) {
    for (auto& [name, t] : s->state_dict()) out.emplace(name, t);
  }
  return out;
}

void GPTPipeline::load_state_dict(const std::map<std::string, Tensor>& state) {
  for (const auto& s : stages_) {
    std::map<std::string, Tensor> mine;
    for (const auto& [name, _] : s->named_parameters()) {
      const auto it = state.find(name);
      DT_CHECK_ARG(it != state.end(), kOp, "the state has no '", name, "', which stage blocks [", s->layers().first,
                   ", ", s->layers().end, ") holds");
      mine.emplace(name, it->second);
    }
    s->load_state_dict(mine);
  }
}

std::unique_ptr<Pipeline> GPTPipeline::make_pipeline(const std::vector<GradientSync*>& syncs,
                                                     std::function<DistTensor(int64_t, int64_t)> ids,
                                                     std::function<DistTensor(int64_t, int64_t)> targets,
                                                     std::vector<double> weights) const {
  DT_CHECK_ARG(syncs.empty() || syncs.size() == stages_.size(), kOp, "expected one sync per local stage (",
               stages_.size(), ") or none, got ", syncs.size());
  std::vector<PipelineStage> stages;
  std::shared_ptr<GPTStage> last;
  for (size_t k = 0; k < stages_.size(); ++k) {
    const int index = schedule_.stages_of(mesh_.coordinate())[k];
    stages.push_back(
        {stages_[k].get(), index, syncs.empty() ? nullptr : syncs[k], stages_[k]->input_shape(), std::nullopt});
    if (stages_[k]->is_last()) last = stages_[k];
  }
  PipelineData data;
  data.inputs = std::move(ids);
  if (last && schedule_.has_backward()) {
    data.loss = [last, targets = std::move(targets)](int64_t step, int64_t micro, const DistTensor& logits) {
      return last->loss(logits, targets(step, micro));
    };
  }
  data.weights = std::move(weights);
  std::vector<TiedParameter> tied;
  if (config_.tie_weights && schedule_.stages > 1) tied.push_back({"tokens.weight", {0, schedule_.stages - 1}});
  return std::make_unique<Pipeline>(mesh_, std::move(stages), schedule_, std::move(data), std::move(tied));
}

}  // namespace dtensor::parallel
