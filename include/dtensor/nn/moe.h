// Mixture of experts: a router sends each token to its top-k of E expert MLPs, and the
// token's output is the gate-weighted sum of theirs (Switch, GShard, Mixtral,
// DeepSeek).
//
//   nn::MoE moe(mesh, {.dim = 64, .hidden = 128, .experts = 8, .top_k = 2}, seed);
//   DistTensor y = moe(x);                  // x [B, T, D] -> [B, T, D]
//
// Router: logits = x Wr^T [.., E]; scores softmax (or sigmoid) of them; each token's
// top-k experts by score, their scores its gates (renormalised to sum 1 with
// normalize_top_k). Experts: SwiGLU (down(silu(gate x) * up x)) or GELU (tanh form)
// MLPs, stacked as weights [E, H, D] (up, gate) and [E, D, H] (down) and computed as
// grouped GEMMs: the tokens sorted by expert, one GEMM per expert over its rows.
//
// Capacity: with capacity_factor c > 0 each expert takes at most ceil(c * N * k / E)
// of the N tokens' assignments, in GShard's priority (every token's first choice, in
// token order, before any second choice; the order by position, also when a
// context-parallel scope permutes the sequence); the rest are dropped (their gate's
// share of the output is 0). The decision is over the whole batch, so a sharded batch drops the
// same assignments as one rank. c = 0: dropless.
//
// Auxiliary losses (over the whole batch): the load-balancing loss
// aux_loss_coef * E * sum_e f_e P_e (f_e the fraction of assignments routed to e, P_e
// the mean score of e; Switch Transformer) and the router z-loss
// z_loss_coef * mean(logsumexp(logits)^2) (ST-MoE). They need not be added to the
// model's loss: their gradients join backward through the layer's output (Megatron's
// MoEAuxLossAutoScaler), as if added to the loss (scaled as AuxLossScale says);
// aux_loss() reports the last forward's value. Under gradient accumulation or a
// pipeline each micro-batch has its own auxiliary loss (as in Megatron).
//
// Layouts: tokens may be sharded over any mesh dims (batch or sequence); the model
// dim D whole. Expert parallelism: the expert weights Shard(0) over a mesh dim
// (parallel::expert_parallel does it) makes forward dispatch each token to the rank
// holding its expert with an all-to-all (uneven counts, exchanged by an all-gather of
// the per-expert counts first) and combine them with a second; backward, the same two
// in reverse. That mesh dim must shard the tokens too (it is a data-parallel dim for
// the rest of the model). Expert weights sharded over their hidden dim (up/gate
// Shard(1), down Shard(2): tensor parallel) reduce the experts' output over that dim.
#pragma once

#include <memory>
#include <vector>

#include "dtensor/nn/layers.h"

namespace dtensor::nn {

enum class Gating : uint8_t { Softmax, Sigmoid };

// The factor by which the backward running on this rank scales the model's loss
// (gradient accumulation's 1 / micro-batches, a pipeline micro-batch's weight, fp16's
// loss scale): the auxiliary losses' gradients follow it, so that they weigh in as if
// added to the loss (Megatron's MoEAuxLossAutoScaler.set_loss_scale). parallel::Trainer
// and parallel::Pipeline set it; 1 outside any scope.
class AuxLossScale {
 public:
  explicit AuxLossScale(double scale);
  ~AuxLossScale();
  AuxLossScale(const AuxLossScale&) = delete;
  AuxLossScale& operator=(const AuxLossScale&) = delete;
  static double current();

 private:
  double previous_;
};

struct MoEConfig {
  int64_t dim = 64;
  int64_t hidden = 128;  // per expert
  int64_t experts = 8;
  int64_t top_k = 2;
  Gating gating = Gating::Softmax;
  bool normalize_top_k = true;
  Activation activation = Activation::SwiGlu;
  double capacity_factor = 0.0;  // 0: dropless
  bool shared_expert = false;    // an MLP of `hidden` every token also goes through
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.0;
};

// What the last forward routed.
struct MoEStats {
  std::vector<int64_t> tokens_per_expert;  // this rank's kept assignments per expert
  int64_t dropped = 0;                     // assignments over capacity, in the whole batch
};

class MoE : public Module {
 public:
  // Parameters: router_weight [E, D]; experts_up [E, H, D], experts_gate [E, H, D]
  // (SwiGLU), experts_down [E, D, H]; shared.* (an nn::MLP) with shared_expert.
  MoE(const DeviceMesh& mesh, const MoEConfig& config, uint64_t seed, double out_init_std = 0.02);
  DistTensor forward(const DistTensor& x) override;

  const MoEConfig& config() const { return config_; }
  const MoEStats& stats() const { return stats_; }
  // The last forward's auxiliary loss (scalar, replicated; already in backward).
  const DistTensor& aux_loss() const { return aux_loss_; }

 private:
  MoEConfig config_;
  DistTensor *router_ = nullptr, *up_ = nullptr, *gate_ = nullptr, *down_ = nullptr;
  std::shared_ptr<MLP> shared_;
  MoEStats stats_;
  DistTensor aux_loss_;
};

}  // namespace dtensor::nn
