// A GPT-style decoder-only transformer: token + position embeddings, N pre-norm
// blocks, a final norm and a language-model head (optionally tied to the token
// embedding).
#pragma once

#include <memory>
#include <vector>

#include "dtensor/nn/layers.h"

namespace dtensor::nn {

struct GPTConfig {
  int64_t vocab = 64;
  int64_t block_size = 32;  // longest sequence
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t dim = 64;
  int64_t mlp_hidden = 0;   // 0: 4 * dim
  Activation activation = Activation::Gelu;
  bool rms_norm = false;
  bool bias = true;
  double dropout = 0.0;
  bool tie_weights = true;
  // Recompute each block's activations in backward instead of keeping them.
  bool checkpoint_activations = false;
};

class GPT : public Module {
 public:
  GPT(const DeviceMesh& mesh, const GPTConfig& config, uint64_t seed);
  // ids [B, T] (I64) -> logits [B, T, vocab]
  DistTensor forward(const DistTensor& ids) override;
  // Mean cross-entropy of next-token targets [B, T], computed in F32.
  DistTensor loss(const DistTensor& ids, const DistTensor& targets);
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
  DeviceMesh mesh_;
  std::shared_ptr<Embedding> tokens_, positions_;
  std::shared_ptr<Dropout> dropout_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
  std::shared_ptr<Module> norm_;
  std::shared_ptr<Linear> head_;  // null when tied
};

}  // namespace dtensor::nn
