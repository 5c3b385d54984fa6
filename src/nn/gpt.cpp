// The GPT model.
#include "dtensor/nn/gpt.h"

#include "dtensor/nn/checkpoint.h"
#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor::nn {

GPT::GPT(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed) : config_(config), mesh_(mesh) {
  DT_CHECK_ARG(config.vocab > 0 && config.block_size > 0 && config.layers >= 0 && config.dim > 0, "GPT",
               "expected positive vocab, block_size and dim, got vocab ", config.vocab, ", block_size ",
               config.block_size, ", dim ", config.dim);
  if (config_.mlp_hidden == 0) config_.mlp_hidden = 4 * config_.dim;
  tokens_ =
      register_module("tokens", std::make_shared<Embedding>(mesh, config_.vocab, config_.dim, derive_seed(seed, 0)));
  positions_ = register_module(
      "positions", std::make_shared<Embedding>(mesh, config_.block_size, config_.dim, derive_seed(seed, 1)));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(config_.dropout, derive_seed(seed, 2)));
  BlockConfig block{config_.dim,      config_.heads, config_.mlp_hidden, config_.activation,
                    config_.rms_norm, config_.bias,  config_.dropout,    config_.layers};
  for (int64_t i = 0; i < config_.layers; ++i) {
    blocks_.push_back(register_module("blocks." + std::to_string(i),
                                      std::make_shared<TransformerBlock>(mesh, block, derive_seed(seed, 100 + i))));
  }
  norm_ = config_.rms_norm
              ? std::shared_ptr<Module>(register_module("norm", std::make_shared<RMSNorm>(mesh, config_.dim)))
              : std::shared_ptr<Module>(
                    register_module("norm", std::make_shared<LayerNorm>(mesh, config_.dim, 1e-5, config_.bias)));
  if (!config_.tie_weights) {
    head_ = register_module("head",
                            std::make_shared<Linear>(mesh, config_.dim, config_.vocab, false, derive_seed(seed, 3)));
  }
}

DistTensor GPT::forward(const DistTensor& ids) {
  DT_CHECK_ARG(ids.dim() == 2 && ids.dtype() == DType::I64, "GPT", "expected token ids [B, T] of i64, got ",
               ids.shape(), " of ", dtype_name(ids.dtype()));
  const int64_t t = ids.size(1);
  DT_CHECK_ARG(t <= config_.block_size, "GPT", "sequence length ", t, " exceeds block_size ", config_.block_size);
  const DistTensor positions =
      distribute(Tensor::arange(t, DType::I64, ids.device()), mesh_, Placements(mesh_.ndim(), Replicate()));
  DistTensor x = (*dropout_)(add((*tokens_)(ids), (*positions_)(positions)));
  for (const auto& block : blocks_) x = config_.checkpoint_activations ? checkpoint(*block, x) : (*block)(x);
  x = (*norm_)(x);
  if (head_) return (*head_)(x);
  return linear(x, for_compute(tokens_->weight()));  // the tied head: x @ E^T
}

DistTensor GPT::loss(const DistTensor& ids, const DistTensor& targets) {
  DT_CHECK_ARG(targets.shape() == ids.shape(), "GPT", "targets ", targets.shape(), " must match ids ", ids.shape());
  const DistTensor logits = (*this)(ids);  // through the hooks (parallel styles, FSDP)
  const int64_t rows = ids.size(0) * ids.size(1);
  return cross_entropy(reshape(logits, {rows, config_.vocab}).to(DType::F32), reshape(targets, {rows}));
}

}  // namespace dtensor::nn
