// The GPT model.
#include "dtensor/models/gpt.h"

#include <algorithm>
#include <cmath>

#include "dtensor/nn/moe.h"
#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor::models {

// Seeds: tokens 0, positions 1, dropout 2, head 3, block i 100 + i.
GPT::GPT(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed) : config_(config) {
  DT_CHECK_ARG(config.vocab > 0 && config.block_size > 0 && config.layers >= 0 && config.dim > 0, "GPT",
               "expected positive vocab, block_size and dim, got vocab ", config.vocab, ", block_size ",
               config.block_size, ", dim ", config.dim);
  if (config_.mlp_hidden == 0) config_.mlp_hidden = 4 * config_.dim;
  const GPTConfig& c = config_;
  auto tokens = append("tokens", std::make_shared<nn::Embedding>(mesh, c.vocab, c.dim, nn::derive_seed(seed, 0)));
  append("positions", std::make_shared<nn::PositionalEmbedding>(mesh, c.block_size, c.dim, nn::derive_seed(seed, 1)));
  append("dropout", std::make_shared<nn::Dropout>(c.dropout, nn::derive_seed(seed, 2)));
  const nn::BlockConfig block{c.dim, c.heads, c.mlp_hidden, c.activation, c.rms_norm, c.bias, c.dropout, c.layers};
  DT_CHECK_ARG(c.moe_experts >= 0 && (c.moe_experts == 0 || (c.moe_top_k >= 1 && c.moe_top_k <= c.moe_experts)), "GPT",
               "expected moe_experts >= 0 and 1 <= moe_top_k <= moe_experts, got ", c.moe_experts, " and ",
               c.moe_top_k);
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(c.layers, 1)));
  for (int64_t i = 0; i < c.layers; ++i) {
    const uint64_t block_seed = nn::derive_seed(seed, 100 + static_cast<uint64_t>(i));
    std::pair<std::string, std::shared_ptr<nn::Module>> feed_forward;
    if (c.moe_experts > 0) {
      const nn::MoEConfig moe{.dim = c.dim,
                              .hidden = c.moe_hidden > 0 ? c.moe_hidden : c.mlp_hidden,
                              .experts = c.moe_experts,
                              .top_k = c.moe_top_k,
                              .activation = c.activation,
                              .capacity_factor = c.moe_capacity_factor,
                              .shared_expert = c.moe_shared_expert,
                              .aux_loss_coef = c.moe_aux_loss_coef};
      feed_forward = {"moe", std::make_shared<nn::MoE>(mesh, moe, nn::derive_seed(block_seed, 1), out_std)};
    }
    append("blocks." + std::to_string(i), std::make_shared<nn::TransformerBlock>(mesh, block, block_seed, feed_forward),
           c.checkpoint_activations);
  }
  if (c.rms_norm) {
    append("norm", std::make_shared<nn::RMSNorm>(mesh, c.dim));
  } else {
    append("norm", std::make_shared<nn::LayerNorm>(mesh, c.dim, 1e-5, c.bias));
  }
  if (c.tie_weights) {
    append("head", std::make_shared<nn::TiedLinear>(tokens));
  } else {
    append("head", std::make_shared<nn::Linear>(mesh, c.dim, c.vocab, false, nn::derive_seed(seed, 3)));
  }
}

DistTensor GPT::forward(const DistTensor& ids) {
  DT_CHECK_ARG(ids.dim() == 2 && ids.dtype() == DType::I64, "GPT", "expected token ids [B, T] of i64, got ",
               ids.shape(), " of ", dtype_name(ids.dtype()));
  DT_CHECK_ARG(ids.size(1) <= config_.block_size, "GPT", "sequence length ", ids.size(1), " exceeds block_size ",
               config_.block_size);
  return Sequential::forward(ids);
}

DistTensor GPT::loss(const DistTensor& ids, const DistTensor& targets) {
  DT_CHECK_ARG(targets.shape() == ids.shape(), "GPT", "targets ", targets.shape(), " must match ids ", ids.shape());
  return language_model_loss((*this)(ids), targets);  // through the hooks (parallel styles, FSDP)
}

DistTensor language_model_loss(const DistTensor& logits, const DistTensor& targets) {
  DT_CHECK_ARG(
      logits.dim() == 3 && targets.dim() == 2 && targets.size(0) == logits.size(0) && targets.size(1) == logits.size(1),
      "language_model_loss", "expected logits [B, T, V] and targets [B, T], got ", logits.shape(), " and ",
      targets.shape());
  // No reshape to [B * T, V]: with B and T sharded on two mesh dims (data x context
  // parallel) it would move the logits.
  return cross_entropy(logits.to(DType::F32), targets);
}

}  // namespace dtensor::models
