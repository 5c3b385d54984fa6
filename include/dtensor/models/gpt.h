// A GPT-style decoder-only transformer, written once for every layout: token and
// position embeddings, N pre-norm blocks, a final norm and a language-model head
// (optionally tied to the token embedding).
//
// The model is an nn::Sequential of named pieces, so that a pipeline splits it like
// any other Sequential (models/gpt_pipeline.h) and a stage is a slice of it:
//
//   tokens     nn::Embedding           ids [B, T] (I64) -> [B, T, D]
//   positions  nn::PositionalEmbedding x + table[0:T]
//   dropout    nn::Dropout
//   blocks.i   nn::TransformerBlock    (checkpointed with checkpoint_activations; its
//                                       MLP an nn::MoE "moe" with moe_experts)
//   norm       nn::LayerNorm / nn::RMSNorm
//   head       nn::Linear, or nn::TiedLinear over "tokens" (tie_weights)
//
// Parameters: "tokens.weight", "positions.weight", "blocks.0.attn.q.weight", ...,
// "norm.weight", and "head.weight" when untied (a tied head lists nothing of its own:
// the model lists tokens.weight once). Its tensor-parallel plan and parallelize_gpt
// are in models/gpt_parallel.h.
#pragma once

#include <memory>

#include "dtensor/nn/layers.h"
#include "dtensor/nn/sequential.h"

namespace dtensor::models {

struct GPTConfig {
  int64_t vocab = 64;
  int64_t block_size = 32;  // longest sequence
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t dim = 64;
  int64_t mlp_hidden = 0;  // 0: 4 * dim
  nn::Activation activation = nn::Activation::Gelu;
  bool rms_norm = false;
  bool bias = true;
  double dropout = 0.0;
  bool tie_weights = true;
  // Recompute each block's activations in backward instead of keeping them.
  bool checkpoint_activations = false;
  // Mixture of experts: with moe_experts > 0 every block's MLP is an nn::MoE of that
  // many experts ("blocks.i.moe"), of moe_hidden (0: mlp_hidden) each, the block's
  // activation, top-k routing with the capacity factor (0: dropless).
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  int64_t moe_hidden = 0;
  double moe_capacity_factor = 0.0;
  bool moe_shared_expert = false;
  double moe_aux_loss_coef = 0.01;
};

class GPT : public nn::Sequential {
 public:
  // Parameters drawn from `seed` (the same values on any mesh).
  GPT(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed);
  // ids [B, T] (I64) -> logits [B, T, vocab]
  DistTensor forward(const DistTensor& ids) override;
  // Mean cross-entropy of next-token targets [B, T], computed in F32.
  DistTensor loss(const DistTensor& ids, const DistTensor& targets);
  // The config with mlp_hidden filled in.
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
};

// Mean cross-entropy of logits [B, T, V] against targets [B, T] (I64), in F32: a
// language model's loss, on the whole model's output or a last pipeline stage's.
DistTensor language_model_loss(const DistTensor& logits, const DistTensor& targets);

}  // namespace dtensor::models
