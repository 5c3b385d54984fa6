// The transformer building blocks.
#include "dtensor/nn/layers.h"

#include <cmath>

#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor::nn {
namespace {

thread_local std::optional<DType> compute_dtype;  // per rank

Placements replicated(const DeviceMesh& mesh) { return Placements(mesh.ndim(), Replicate()); }

DistTensor normal(const DeviceMesh& mesh, const Shape& shape, uint64_t seed, double std) {
  DistTensor t = randn(shape, mesh, replicated(mesh), seed);
  Tensor local = t.to_local();
  local.copy_(mul(local, std));
  return t;
}

}  // namespace

ComputeDtype::ComputeDtype(DType dtype) : previous_(compute_dtype) { compute_dtype = dtype; }
ComputeDtype::~ComputeDtype() { compute_dtype = previous_; }
std::optional<DType> ComputeDtype::current() { return compute_dtype; }

DistTensor for_compute(const DistTensor& p) {
  return compute_dtype && p.dtype() != *compute_dtype ? p.to(*compute_dtype) : p;
}

Linear::Linear(const DeviceMesh& mesh, int64_t in_features, int64_t out_features, bool bias, uint64_t seed,
               double init_std) {
  weight_ = &register_parameter("weight", normal(mesh, {out_features, in_features}, derive_seed(seed, 0), init_std));
  if (bias) bias_ = &register_parameter("bias", zeros({out_features}, mesh, replicated(mesh)));
}

DistTensor Linear::forward(const DistTensor& x) {
  std::optional<DistTensor> bias;
  if (bias_) bias = for_compute(*bias_);
  if (gelu_) return linear_gelu(x, for_compute(*weight_), bias, *gelu_);
  return linear(x, for_compute(*weight_), bias);
}

Embedding::Embedding(const DeviceMesh& mesh, int64_t num_embeddings, int64_t dim, uint64_t seed, double init_std) {
  weight_ = &register_parameter("weight", normal(mesh, {num_embeddings, dim}, derive_seed(seed, 0), init_std));
}

DistTensor Embedding::forward(const DistTensor& ids) { return embedding(for_compute(*weight_), ids); }

PositionalEmbedding::PositionalEmbedding(const DeviceMesh& mesh, int64_t max_positions, int64_t dim, uint64_t seed,
                                         double init_std) {
  weight_ = &register_parameter("weight", normal(mesh, {max_positions, dim}, derive_seed(seed, 0), init_std));
}

DistTensor PositionalEmbedding::forward(const DistTensor& x) {
  const int64_t max_positions = weight_->size(0), dim = weight_->size(1);
  DT_CHECK_ARG(x.dim() == 3 && x.size(2) == dim, "PositionalEmbedding", "expected [B, T, ", dim, "], got ", x.shape());
  const int64_t t = x.size(1);
  DT_CHECK_ARG(t <= max_positions, "PositionalEmbedding", "sequence length ", t, " exceeds the ", max_positions,
               " positions of the table");
  const DeviceMesh& mesh = weight_->mesh();
  // 0, 1, ..., or the load-balanced order of a context-parallel scope.
  const std::vector<int64_t> order = sequence_positions(mesh, t);
  const DistTensor positions = distribute(Tensor::from_vector(order).to(x.device()), mesh, replicated(mesh));
  return add(x, embedding(for_compute(*weight_), positions));
}

TiedLinear::TiedLinear(std::shared_ptr<Embedding> embedding) {
  DT_CHECK_ARG(embedding != nullptr, "TiedLinear", "expected an Embedding, got null");
  embedding_ = register_module("embedding", std::move(embedding));
}

DistTensor TiedLinear::forward(const DistTensor& x) { return linear(x, for_compute(embedding_->weight())); }

LayerNorm::LayerNorm(const DeviceMesh& mesh, int64_t dim, double eps, bool bias) : dim_(dim), eps_(eps) {
  weight_ = &register_parameter("weight", ones({dim}, mesh, replicated(mesh)));
  if (bias) bias_ = &register_parameter("bias", zeros({dim}, mesh, replicated(mesh)));
}

DistTensor LayerNorm::forward(const DistTensor& x) {
  std::optional<DistTensor> bias;
  if (bias_) bias = for_compute(*bias_);
  return layer_norm(x, {dim_}, for_compute(*weight_), bias, eps_);
}

RMSNorm::RMSNorm(const DeviceMesh& mesh, int64_t dim, double eps) : dim_(dim), eps_(eps) {
  weight_ = &register_parameter("weight", ones({dim}, mesh, replicated(mesh)));
}

DistTensor RMSNorm::forward(const DistTensor& x) { return rms_norm(x, {dim_}, for_compute(*weight_), eps_); }

std::map<std::string, int64_t> Dropout::extra_state() const { return {{"calls", static_cast<int64_t>(calls_)}}; }

void Dropout::load_extra_state(const std::map<std::string, int64_t>& state) {
  const auto it = state.find("calls");
  DT_CHECK_ARG(it != state.end() && state.size() == 1 && it->second >= 0, "Dropout::load_extra_state",
               "expected {\"calls\": n >= 0}");
  calls_ = static_cast<uint64_t>(it->second);
}

DistTensor Dropout::forward(const DistTensor& x) {
  if (!training() || p_ == 0) return x;
  return dropout(x, p_, derive_seed(seed_, calls_++), true);
}

MLP::MLP(const DeviceMesh& mesh, int64_t dim, int64_t hidden, Activation activation, bool bias, uint64_t seed,
         double out_init_std)
    : activation_(activation) {
  up_ = register_module("up", std::make_shared<Linear>(mesh, dim, hidden, bias, derive_seed(seed, 0)));
  if (activation == Activation::Gelu) up_->fuse_gelu(GeluApprox::Tanh);
  if (activation == Activation::SwiGlu) {
    gate_ = register_module("gate", std::make_shared<Linear>(mesh, dim, hidden, bias, derive_seed(seed, 1)));
  }
  down_ =
      register_module("down", std::make_shared<Linear>(mesh, hidden, dim, bias, derive_seed(seed, 2), out_init_std));
}

DistTensor MLP::forward(const DistTensor& x) {
  if (activation_ == Activation::SwiGlu) return (*down_)(mul(silu((*gate_)(x)), (*up_)(x)));
  return (*down_)((*up_)(x));  // up's GELU is fused into its GEMM
}

SelfAttention::SelfAttention(const DeviceMesh& mesh, int64_t dim, int64_t heads, bool bias, double dropout,
                             uint64_t seed, double out_init_std)
    : dim_(dim), heads_(heads) {
  DT_CHECK_ARG(heads > 0 && dim % heads == 0, "SelfAttention", "dim ", dim, " must be a multiple of heads ", heads);
  q_ = register_module("q", std::make_shared<Linear>(mesh, dim, dim, bias, derive_seed(seed, 0)));
  k_ = register_module("k", std::make_shared<Linear>(mesh, dim, dim, bias, derive_seed(seed, 1)));
  v_ = register_module("v", std::make_shared<Linear>(mesh, dim, dim, bias, derive_seed(seed, 2)));
  out_ = register_module("out", std::make_shared<Linear>(mesh, dim, dim, bias, derive_seed(seed, 3), out_init_std));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout, derive_seed(seed, 4)));
}

DistTensor SelfAttention::forward(const DistTensor& x) {
  DT_CHECK_ARG(x.dim() == 3 && x.size(2) == dim_, "SelfAttention", "expected input [B, T, ", dim_, "], got ",
               x.shape());
  const int64_t b = x.size(0), t = x.size(1), head_dim = dim_ / heads_;
  // [B, T, D] -> [B, H, T, Dh]
  auto heads = [&](const DistTensor& y) { return transpose(reshape(y, {b, t, heads_, head_dim}), 1, 2); };
  DistTensor attended = scaled_dot_product_attention(heads((*q_)(x)), heads((*k_)(x)), heads((*v_)(x)), true);
  DistTensor merged = reshape(transpose(attended, 1, 2), {b, t, dim_});
  return (*dropout_)((*out_)(merged));
}

TransformerBlock::TransformerBlock(const DeviceMesh& mesh, const BlockConfig& c, uint64_t seed,
                                   std::pair<std::string, std::shared_ptr<Module>> feed_forward) {
  // GPT-2: residual projections start smaller, by 1/sqrt(2 * layers).
  const double out_std = 0.02 / std::sqrt(2.0 * std::max<int64_t>(c.layers, 1));
  auto norm = [&] {
    return c.rms_norm ? std::shared_ptr<Module>(std::make_shared<RMSNorm>(mesh, c.dim))
                      : std::shared_ptr<Module>(std::make_shared<LayerNorm>(mesh, c.dim, 1e-5, c.bias));
  };
  norm1_ = register_module("norm1", norm());
  attn_ = register_module(
      "attn", std::make_shared<SelfAttention>(mesh, c.dim, c.heads, c.bias, c.dropout, derive_seed(seed, 0), out_std));
  norm2_ = register_module("norm2", norm());
  if (feed_forward.second) {
    mlp_ = register_module(feed_forward.first, std::move(feed_forward.second));
  } else {
    mlp_ = register_module(
        "mlp", std::make_shared<MLP>(mesh, c.dim, c.mlp_hidden, c.activation, c.bias, derive_seed(seed, 1), out_std));
  }
  residual_dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout, derive_seed(seed, 2)));
}

DistTensor TransformerBlock::forward(const DistTensor& x) {
  DistTensor h = add(x, (*attn_)((*norm1_)(x)));
  return add(h, (*residual_dropout_)((*mlp_)((*norm2_)(h))));
}

}  // namespace dtensor::nn
