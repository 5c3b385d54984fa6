// models::GPT split into pipeline stages: per-layer costs, the block split and one
// rank's stages (parallel::SequentialPipeline over the GPT Sequential).
#include "dtensor/models/gpt_pipeline.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor::models {
namespace {

constexpr const char* kOp = "GPTPipeline";

// The block split (given or balanced) for the schedule the options name.
std::vector<parallel::StageLayers> block_split(const parallel::PipelineMesh& mesh, const GPTConfig& config,
                                               const GPTPipelineOptions& options) {
  const parallel::Schedule schedule =
      parallel::make_schedule(options.schedule, mesh.size(), options.micro_batches, options.virtual_stages);
  const int64_t stages = schedule.stages;
  DT_CHECK_ARG(stages <= config.layers, kOp, stages, " pipeline stages (", mesh.pp_dim(), "=", mesh.size(), " x ",
               schedule.virtual_stages(), " virtual) need at least ", stages,
               " transformer blocks (one per stage), the model has ", config.layers);
  if (options.split.empty()) return balance_gpt(config, estimate_gpt_layer_costs(config), stages);
  parallel::check_split(options.split, config.layers, stages);
  return options.split;
}

// Stage k > 0 starts at its first block; the embeddings go with the first stage, the
// norm and the head with the last.
parallel::SequentialPipelineOptions sequential_options(const GPTPipelineOptions& options,
                                                       const std::vector<parallel::StageLayers>& split) {
  parallel::SequentialPipelineOptions out{
      .schedule = options.schedule, .micro_batches = options.micro_batches, .virtual_stages = options.virtual_stages};
  for (size_t k = 1; k < split.size(); ++k) out.split_before.push_back("blocks." + std::to_string(split[k].first));
  return out;
}

}  // namespace

GPTLayerCosts estimate_gpt_layer_costs(const GPTConfig& config) {
  const double d = static_cast<double>(config.dim), t = static_cast<double>(config.block_size),
               v = static_cast<double>(config.vocab);
  const double hidden = static_cast<double>(config.mlp_hidden ? config.mlp_hidden : 4 * config.dim);
  const double mlp = (config.activation == nn::Activation::SwiGlu ? 6.0 : 4.0) * d * hidden;
  return {d, 3.0 * (8.0 * d * d + mlp + 4.0 * t * d), 3.0 * 2.0 * d * v};
}

GPTLayerCosts measure_gpt_layer_costs(const Group& group, const GPTConfig& config, int64_t rows, int repeats) {
  DT_CHECK_ARG(rows >= 1 && repeats >= 1, "measure_gpt_layer_costs", "expected rows >= 1 and repeats >= 1, got ", rows,
               " and ", repeats);
  GPTLayerCosts best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::infinity()};
  GPTConfig c = config;
  c.layers = 1;
  const Group self = group.split(group.rank());
  const DeviceMesh one(self, {1});
  // A one-block model cut as a first stage (embeddings + block) and a last (block +
  // head); the block alone is timed too and taken off both.
  GPT model(one, c, 1);
  const size_t block = model.index_of("blocks.0");
  const std::shared_ptr<nn::Sequential> first = model.slice(0, block + 1), last = model.slice(block, model.size());
  nn::Module& only_block = *model.entries()[block].second;
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
      hidden = (*first)(x);
      sum(hidden).backward();
    });
    const DistTensor h = hidden.detach().set_requires_grad();
    const double block_only = seconds([&] { sum(only_block(h)).backward(); });
    const double with_head = seconds([&] { language_model_loss((*last)(h), x).backward(); });
    best.block = std::min(best.block, block_only);
    best.embedding = std::min(best.embedding, std::max(with_block - block_only, 0.0));
    best.head = std::min(best.head, std::max(with_head - block_only, 0.0));
  }
  Tensor all = Tensor::from_vector<double>({best.embedding, best.block, best.head}, {3});
  all_reduce_(group, all, ReduceOp::Max);
  const std::vector<double> v = all.to_vector<double>();
  return {v[0], v[1], v[2]};
}

std::vector<parallel::StageLayers> balance_gpt(const GPTConfig& config, const GPTLayerCosts& costs, int64_t stages) {
  return parallel::balance_layers(std::vector<double>(static_cast<size_t>(config.layers), costs.block), costs.embedding,
                                  costs.head, stages);
}

GPTPipeline::GPTPipeline(const parallel::PipelineMesh& mesh, const GPTConfig& config, uint64_t seed,
                         GPTPipelineOptions options)
    : config_(config),
      split_(block_split(mesh, config, options)),
      stages_(mesh, std::make_shared<GPT>(mesh.stage_mesh(), config, seed), sequential_options(options, split_)) {
  if (config_.mlp_hidden == 0) config_.mlp_hidden = 4 * config_.dim;
}

std::unique_ptr<parallel::Pipeline> GPTPipeline::make_pipeline(const std::vector<parallel::GradientSync*>& syncs,
                                                               std::function<DistTensor(int64_t, int64_t)> ids,
                                                               std::function<DistTensor(int64_t, int64_t)> targets,
                                                               std::vector<double> weights,
                                                               std::optional<Device> device) const {
  parallel::PipelineData data;
  data.inputs = std::move(ids);
  const bool holds_last =
      std::count(stages_.stage_indices().begin(), stages_.stage_indices().end(), schedule().stages - 1) > 0;
  if (holds_last && schedule().has_backward()) {
    data.loss = [targets = std::move(targets)](int64_t step, int64_t micro, const DistTensor& logits) {
      return language_model_loss(logits, targets(step, micro));
    };
  }
  data.weights = std::move(weights);
  return stages_.make_pipeline(syncs, std::move(data), device);
}

}  // namespace dtensor::models
