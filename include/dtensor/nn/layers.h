// The building blocks of a transformer: Linear, Embedding, PositionalEmbedding,
// TiedLinear, LayerNorm, RMSNorm, Dropout, MLP (GELU or SwiGLU), causal multi-head
// SelfAttention, TransformerBlock.
//
// Every layer is created on a DeviceMesh with replicated parameters and a seed; the
// values do not depend on the mesh. Inputs may be sharded any way the ops accept
// (data parallel: the batch dim sharded).
#pragma once

#include <memory>
#include <optional>

#include "dtensor/nn/module.h"
#include "dtensor/tensor_ops.h"  // GeluApprox

namespace dtensor::nn {

// The dtype layers compute in while alive (mixed precision): parameters stay in
// their own dtype (the FP32 master weights) and are cast on use; activations
// follow. Outside any scope layers compute in their parameters' dtype.
class ComputeDtype {
 public:
  explicit ComputeDtype(DType dtype);
  ~ComputeDtype();
  ComputeDtype(const ComputeDtype&) = delete;
  ComputeDtype& operator=(const ComputeDtype&) = delete;
  // The active compute dtype, if any.
  static std::optional<DType> current();

 private:
  std::optional<DType> previous_;
};
// `p` cast to the active compute dtype (differentiable), or `p` itself.
DistTensor for_compute(const DistTensor& p);

class Linear : public Module {
 public:
  // weight [out, in] ~ N(0, init_std), bias zeros.
  Linear(const DeviceMesh& mesh, int64_t in_features, int64_t out_features, bool bias, uint64_t seed,
         double init_std = 0.02);
  DistTensor forward(const DistTensor& x) override;
  DistTensor& weight() { return *weight_; }

  // A GELU fused after the layer: forward returns gelu(x W^T + b) through linear_gelu
  // (the GELU in the GEMM's epilogue; the same values and gradients as the two ops).
  // MLP's "up" layer has it, so that layer's output (and a hook's view of it) is the
  // activated hidden state, as in TransformerEngine's fused fc1.
  void fuse_gelu(GeluApprox approx) { gelu_ = approx; }

 private:
  DistTensor* weight_;
  DistTensor* bias_ = nullptr;
  std::optional<GeluApprox> gelu_;
};

class Embedding : public Module {
 public:
  Embedding(const DeviceMesh& mesh, int64_t num_embeddings, int64_t dim, uint64_t seed, double init_std = 0.02);
  // ids: integer DistTensor of any shape -> [..., dim]
  DistTensor forward(const DistTensor& ids) override;
  DistTensor& weight() { return *weight_; }

 private:
  DistTensor* weight_;
};

// Learned absolute positions (GPT-2): x [B, T, dim] -> x + weight[0:T], the table
// [max_positions, dim] drawn as an Embedding's with the same seed.
class PositionalEmbedding : public Module {
 public:
  PositionalEmbedding(const DeviceMesh& mesh, int64_t max_positions, int64_t dim, uint64_t seed,
                      double init_std = 0.02);
  DistTensor forward(const DistTensor& x) override;
  DistTensor& weight() { return *weight_; }

 private:
  DistTensor* weight_;
};

// x -> x @ E^T with E the table of an Embedding registered here as "embedding": a
// language model's output head tied to its input embedding. The embedding is the
// same module (registered in the model under its own name too), so its parameter is
// listed once by the model and follows any layout a parallel module gives it; a
// pipeline stage holding only the head lists it as "<head>.embedding.weight" and
// the pipeline keeps the two copies equal.
class TiedLinear : public Module {
 public:
  explicit TiedLinear(std::shared_ptr<Embedding> embedding);
  DistTensor forward(const DistTensor& x) override;
  Embedding& embedding() { return *embedding_; }

 private:
  std::shared_ptr<Embedding> embedding_;
};

class LayerNorm : public Module {
 public:
  LayerNorm(const DeviceMesh& mesh, int64_t dim, double eps = 1e-5, bool bias = true);
  DistTensor forward(const DistTensor& x) override;

 private:
  int64_t dim_;
  double eps_;
  DistTensor* weight_;
  DistTensor* bias_ = nullptr;
};

class RMSNorm : public Module {
 public:
  RMSNorm(const DeviceMesh& mesh, int64_t dim, double eps = 1e-6);
  DistTensor forward(const DistTensor& x) override;

 private:
  int64_t dim_;
  double eps_;
  DistTensor* weight_;
};

// A fresh mask on every call (seeded by the module's seed and call count, the same
// on every rank); identity in eval mode or with p = 0.
class Dropout : public Module {
 public:
  Dropout(double p, uint64_t seed) : p_(p), seed_(seed) {}
  DistTensor forward(const DistTensor& x) override;
  // How many masks were drawn; activation checkpointing rewinds it so that the
  // recomputation draws the same masks.
  uint64_t calls() const { return calls_; }
  void set_calls(uint64_t calls) { calls_ = calls; }
  // {"calls": calls()}: a resumed run draws the masks the uninterrupted one would.
  std::map<std::string, int64_t> extra_state() const override;
  void load_extra_state(const std::map<std::string, int64_t>& state) override;

 private:
  double p_;
  uint64_t seed_;
  uint64_t calls_ = 0;
};

enum class Activation : uint8_t { Gelu, SwiGlu };

// GELU: down(gelu(up x)), the GELU (tanh form) fused into "up" (Linear::fuse_gelu).
// SwiGLU: down(silu(gate x) * up x).
class MLP : public Module {
 public:
  MLP(const DeviceMesh& mesh, int64_t dim, int64_t hidden, Activation activation, bool bias, uint64_t seed,
      double out_init_std);
  DistTensor forward(const DistTensor& x) override;

 private:
  Activation activation_;
  std::shared_ptr<Linear> up_, gate_, down_;
};

// Causal multi-head self-attention on [B, T, D] with separate q, k, v projections
// (each a column-parallel candidate for tensor parallelism) and an output
// projection.
class SelfAttention : public Module {
 public:
  SelfAttention(const DeviceMesh& mesh, int64_t dim, int64_t heads, bool bias, double dropout, uint64_t seed,
                double out_init_std);
  DistTensor forward(const DistTensor& x) override;
  int64_t heads() const { return heads_; }

 private:
  int64_t dim_, heads_;
  std::shared_ptr<Linear> q_, k_, v_, out_;
  std::shared_ptr<Dropout> dropout_;
};

struct BlockConfig {
  int64_t dim = 64;
  int64_t heads = 4;
  int64_t mlp_hidden = 256;
  Activation activation = Activation::Gelu;
  bool rms_norm = false;
  bool bias = true;
  double dropout = 0.0;
  int64_t layers = 2;  // for the residual-projection init scale
};

// Pre-norm block: x + attn(norm1 x), then x + mlp(norm2 x). `feed_forward`, when
// given, replaces the MLP under its own name (a mixture of experts: {"moe", MoE}).
class TransformerBlock : public Module {
 public:
  TransformerBlock(const DeviceMesh& mesh, const BlockConfig& config, uint64_t seed,
                   std::pair<std::string, std::shared_ptr<Module>> feed_forward = {});
  DistTensor forward(const DistTensor& x) override;

  // The two layers (for wrapping each on its own: FSDP units, activation checkpointing).
  SelfAttention& attention() const { return *attn_; }
  Module& feed_forward() const { return *mlp_; }

 private:
  std::shared_ptr<Module> norm1_, norm2_;
  std::shared_ptr<SelfAttention> attn_;
  std::shared_ptr<Module> mlp_;
  std::shared_ptr<Dropout> residual_dropout_;
};

}  // namespace dtensor::nn
