// Mixture of experts: routing over the whole batch on the mesh, dispatch and grouped
// GEMMs on this rank's tokens (as local-mesh DistTensors, so autograd runs through
// them), and the all-to-alls of expert parallelism.
#include "dtensor/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dtensor/autograd.h"
#include "dtensor/group.h"
#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor::nn {
namespace {

thread_local double aux_loss_scale = 1.0;  // per rank

constexpr const char* kOp = "MoE";

Placements local_layout() { return Placements(1, Replicate()); }

// `t` as a DistTensor on local_mesh() (its shape given: nothing to exchange).
DistTensor piece(const Tensor& t) { return DistTensor::from_local(t, local_mesh(), local_layout(), t.shape()); }

// Rows `ids` of x ([m, D] on the local mesh), as x[ids], with autograd; ids outside
// [0, m) give zero rows and no gradient. Every id here comes from the routing on x's
// device and is in range by construction or marks a dropped assignment, so the
// masked lookup is the right one, and it never copies GPU ids to the host.
DistTensor gather_rows(const DistTensor& x, const Tensor& ids) {
  const Tensor xl = x.to_local();
  std::vector<DistTensor> outs{piece(embedding(xl, ids, /*masked=*/true))};
  if (!autograd::needs_grad({x})) return outs[0];
  const int64_t m = xl.size(0);
  autograd::record("moe_gather_rows", {x}, outs, [ids, m](const std::vector<DistTensor>& grads) {
    return std::vector<DistTensor>{piece(embedding_backward(grads[0].to_local(), ids, m, /*masked=*/true))};
  });
  return outs[0];
}

// x [m, in] times w [G, out, in] by groups of rows: rows [o_g, o_g + counts[g]) use
// w[g] (y = x w_g^T). One GEMM per group; backward, one per group for dx and for dw.
DistTensor grouped_linear(const DistTensor& x, const DistTensor& w, const std::vector<int64_t>& counts) {
  const Tensor xl = x.to_local(), wl = w.to_local();
  Tensor y = Tensor::empty({xl.size(0), wl.size(1)}, xl.dtype(), xl.device());
  int64_t offset = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t rows = counts[g];
    if (rows > 0) y.narrow(0, offset, rows).copy_(linear(xl.narrow(0, offset, rows), wl.narrow(0, g, 1).squeeze(0)));
    offset += rows;
  }
  std::vector<DistTensor> outs{piece(y)};
  if (!autograd::needs_grad({x, w})) return outs[0];
  autograd::record("grouped_linear", {x, w}, outs, [xl, wl, counts](const std::vector<DistTensor>& grads) {
    const Tensor dy = grads[0].to_local();
    Tensor dx = Tensor::zeros(xl.shape(), xl.dtype(), xl.device());
    Tensor dw = Tensor::zeros(wl.shape(), wl.dtype(), wl.device());
    int64_t offset = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      const int64_t rows = counts[g];
      if (rows > 0) {
        const Tensor dy_g = dy.narrow(0, offset, rows), w_g = wl.narrow(0, g, 1).squeeze(0);
        dx.narrow(0, offset, rows).copy_(matmul(dy_g, w_g));
        dw.narrow(0, g, 1).squeeze(0).copy_(matmul(dy_g.transpose(0, 1), xl.narrow(0, offset, rows)));
      }
      offset += rows;
    }
    return std::vector<DistTensor>{piece(dx), piece(dw)};
  });
  return outs[0];
}

// Rows of x sent to the ranks of mesh dim `dim` by `send` and received by `recv`
// (uneven all-to-all); backward sends the gradients back the same way.
DistTensor exchange(const DistTensor& x, const DeviceMesh& mesh, int dim, const std::vector<int64_t>& send,
                    const std::vector<int64_t>& recv) {
  const Tensor y = all_to_all(mesh.group(dim), x.to_local().contiguous(), recv, send);
  std::vector<DistTensor> outs{piece(y)};
  if (!autograd::needs_grad({x})) return outs[0];
  autograd::record("moe_all_to_all", {x}, outs, [mesh, dim, send, recv](const std::vector<DistTensor>& grads) {
    const Tensor back = all_to_all(mesh.group(dim), grads[0].to_local().contiguous(), send, recv);
    return std::vector<DistTensor>{piece(back)};
  });
  return outs[0];
}

// y itself, whose backward also sends gradient 1 into the auxiliary loss.
DistTensor with_aux_gradient(const DistTensor& y, const DistTensor& aux) {
  if (!autograd::needs_grad({aux})) return y;
  std::vector<DistTensor> outs{DistTensor::from_local(y.to_local(), y.mesh(), y.placements(), y.shape())};
  const DeviceMesh mesh = aux.mesh();
  const Placements layout = aux.placements();
  const Device device = aux.device();
  autograd::record("moe_aux_loss", {y, aux}, outs, [mesh, layout, device](const std::vector<DistTensor>& grads) {
    return std::vector<DistTensor>{grads[0], full({}, aux_loss_scale, mesh, layout, DType::F32, device)};
  });
  return outs[0];
}

// Where a replicated weight's gradient lives when this rank computes it from its own
// tokens only: Partial over the mesh dims that shard the tokens.
Placements local_grad_layout(const DistTensor& w, const DistTensor& x) {
  Placements out = w.placements();
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d].is_replicate() && x.placements()[d].is_shard()) out[d] = Partial();
  }
  return out;
}

// Which of the whole batch's assignments [N, k] (expert ids) an expert keeps under
// `capacity`: every token's first choice in token order, then every second choice...
// `tokens` lists the tokens (rows of `ids`) in their order in the batch.
std::vector<uint8_t> kept_assignments(const std::vector<int64_t>& ids, const std::vector<int64_t>& tokens, int64_t k,
                                      int64_t experts, int64_t capacity, int64_t* dropped) {
  std::vector<uint8_t> keep(ids.size(), 0);
  std::vector<int64_t> load(static_cast<size_t>(experts), 0);
  *dropped = 0;
  for (int64_t j = 0; j < k; ++j) {
    for (const int64_t t : tokens) {
      const auto slot = static_cast<size_t>(t * k + j);
      int64_t& l = load[static_cast<size_t>(ids[slot])];
      if (l < capacity) {
        keep[slot] = 1;
        ++l;
      } else {
        ++*dropped;
      }
    }
  }
  return keep;
}

}  // namespace

AuxLossScale::AuxLossScale(double scale) : previous_(aux_loss_scale) { aux_loss_scale = scale; }
AuxLossScale::~AuxLossScale() { aux_loss_scale = previous_; }
double AuxLossScale::current() { return aux_loss_scale; }

MoE::MoE(const DeviceMesh& mesh, const MoEConfig& config, uint64_t seed, double out_init_std) : config_(config) {
  const MoEConfig& c = config_;
  DT_CHECK_ARG(c.dim > 0 && c.hidden > 0 && c.experts > 0 && c.top_k >= 1 && c.top_k <= c.experts, kOp,
               "expected positive dim, hidden and experts and 1 <= top_k <= experts, got dim ", c.dim, ", hidden ",
               c.hidden, ", experts ", c.experts, ", top_k ", c.top_k);
  DT_CHECK_ARG(c.capacity_factor >= 0 && c.aux_loss_coef >= 0 && c.z_loss_coef >= 0, kOp,
               "expected capacity_factor, aux_loss_coef and z_loss_coef >= 0");
  const Placements replicated(static_cast<size_t>(mesh.ndim()), Replicate());
  auto normal = [&](const Shape& shape, uint64_t s, double std) {
    DistTensor t = randn(shape, mesh, replicated, derive_seed(seed, s));
    Tensor local = t.to_local();
    local.copy_(mul(local, std));
    return t;
  };
  router_ = &register_parameter("router_weight", normal({c.experts, c.dim}, 0, 0.02));
  up_ = &register_parameter("experts_up", normal({c.experts, c.hidden, c.dim}, 1, 0.02));
  if (c.activation == Activation::SwiGlu) {
    gate_ = &register_parameter("experts_gate", normal({c.experts, c.hidden, c.dim}, 2, 0.02));
  }
  down_ = &register_parameter("experts_down", normal({c.experts, c.dim, c.hidden}, 3, out_init_std));
  if (c.shared_expert) {
    shared_ = register_module("shared", std::make_shared<MLP>(mesh, c.dim, c.hidden, c.activation, false,
                                                              derive_seed(seed, 4), out_init_std));
  }
}

DistTensor MoE::forward(const DistTensor& x) {
  const MoEConfig& c = config_;
  DT_CHECK_ARG(x.dim() >= 2 && x.size(-1) == c.dim, kOp, "expected input [..., ", c.dim, "], got ", x.shape());
  const int64_t last = x.dim() - 1;
  for (const Placement& p : x.placements()) {
    DT_CHECK_ARG(!p.is_partial() && !p.is_shard(last), kOp,
                 "expected tokens sharded or replicated with the model dim whole, got ",
                 placements_to_string(x.placements()));
  }
  const DeviceMesh& mesh = x.mesh();
  const int64_t experts = c.experts, k = c.top_k;
  // Routing, on the mesh: the scores and the auxiliary losses over the whole batch.
  const DistTensor logits = linear(x, for_compute(*router_)).to(DType::F32);
  const DistTensor scores = c.gating == Gating::Softmax ? softmax(logits, -1) : sigmoid(logits);
  const Tensor score_local = scores.to_local();
  const int64_t n = score_local.numel() / experts;  // this rank's tokens
  const Device device = x.device();
  // Each token's top-k experts, best first (ties: the lower index), on the device.
  const Tensor ids = topk(score_local.reshape({n, experts}), k).indices;  // [n, k]
  Shape lead(x.shape().begin(), x.shape().end() - 1),
      lead_local(score_local.shape().begin(), score_local.shape().end() - 1);
  Shape choice_shape = lead, choice_local = lead_local;
  choice_shape.push_back(k);
  choice_local.push_back(k);
  const Placements token_layout = scores.placements();
  Shape onehot_shape = choice_shape, onehot_local = choice_local;
  onehot_shape.push_back(experts);
  onehot_local.push_back(experts);
  const Tensor onehot =
      eq(ids.reshape({n, k, 1}), Tensor::arange(experts, DType::I64, device).reshape({1, 1, experts}));
  const DistTensor chosen =
      DistTensor::from_local(onehot.to(DType::F32).reshape(onehot_local), mesh, token_layout, onehot_shape);
  DistTensor gates = sum(mul(unsqueeze(scores, -2), chosen), {-1});  // [..., k]
  if (c.normalize_top_k) gates = div(gates, sum(gates, {-1}, true));
  std::vector<int64_t> token_dims(lead.size());
  std::iota(token_dims.begin(), token_dims.end(), 0);
  const double tokens = static_cast<double>(shape_numel(lead));
  const Placements replicated(static_cast<size_t>(mesh.ndim()), Replicate());
  DistTensor aux = full({}, 0.0, mesh, replicated, DType::F32, device);
  if (c.aux_loss_coef > 0) {
    // f_e (a constant, one all-reduce of [E]) against every token's scores: the mean
    // score per expert never needs reducing on its own, and backward is local.
    std::vector<int64_t> choice_dims = token_dims;
    choice_dims.push_back(static_cast<int64_t>(lead.size()));
    const DistTensor fraction =
        div(sum(chosen, choice_dims), tokens * static_cast<double>(k)).redistribute(replicated);  // [E]
    const DistTensor balance = div(sum(mul(scores, fraction)), tokens);
    aux = add(aux, mul(balance, c.aux_loss_coef * static_cast<double>(experts)));
  }
  if (c.z_loss_coef > 0) {
    const DistTensor top = amax(logits.detach(), {-1}, true);
    const DistTensor lse = add(log(sum(exp(sub(logits, top)), {-1})), squeeze(top, -1));
    aux = add(aux, mul(mean(square(lse)), c.z_loss_coef));
  }
  aux_loss_ = aux.redistribute(replicated);

  // The expert of each assignment (slot t * k + j: token t's j-th choice); under a
  // capacity, a dropped assignment gets the key `experts` and sorts last.
  Tensor keys = ids.reshape({n * k});
  stats_ = MoEStats{};
  if (c.capacity_factor > 0) {
    // Capacity: the whole batch's choices decide, in one global priority order, which
    // assignments each expert keeps; a sequential rule, taken on the host from the
    // gathered choices ([N, k] integers).
    const Tensor all = DistTensor::from_local(ids.reshape(choice_local), mesh, token_layout, choice_shape)
                           .full_tensor()
                           .to(Device::cpu());
    const auto capacity = static_cast<int64_t>(
        std::ceil(c.capacity_factor * tokens * static_cast<double>(k) / static_cast<double>(experts)));
    // Token order: row-major, the sequence (the dim before the model dim) by position,
    // which a load-balanced context-parallel order permutes.
    const int64_t seq = x.dim() >= 3 ? lead.back() : 1;
    const std::vector<int64_t> positions = sequence_positions(mesh, seq);
    std::vector<int64_t> row_at(static_cast<size_t>(seq));
    for (int64_t i = 0; i < seq; ++i) row_at[static_cast<size_t>(positions[static_cast<size_t>(i)])] = i;
    std::vector<int64_t> priority;
    for (int64_t outer = 0; outer < shape_numel(lead) / seq; ++outer) {
      for (int64_t q = 0; q < seq; ++q) priority.push_back(outer * seq + row_at[static_cast<size_t>(q)]);
    }
    std::vector<int64_t> all_ids = all.to_vector<int64_t>();
    const std::vector<uint8_t> kept = kept_assignments(all_ids, priority, k, experts, capacity, &stats_.dropped);
    for (size_t s = 0; s < kept.size(); ++s) {
      if (!kept[s]) all_ids[s] = experts;
    }
    keys = distribute(Tensor::from_vector(all_ids, choice_shape), mesh, token_layout)
               .to_local()
               .contiguous()
               .reshape({n * k})
               .to(device);
  }

  // This rank's assignments sorted by expert on the device (CUB's radix sort on CUDA),
  // stable: by token, then choice, within an expert. Only the counts per expert come
  // to the host: the grouped GEMMs and the all-to-all sizes need them there.
  const Tensor order = argsort(keys);  // slots in expert order, dropped ones last
  std::vector<int64_t> counts = bincount(keys, experts).to(Device::cpu()).to_vector<int64_t>();
  const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  // The token of each sorted assignment (slot s belongs to token s / k), read from a
  // [n * k, 1] table so that no integer division runs in floating point.
  const Tensor token_of_slot =
      Tensor::arange(n, DType::I64, device).reshape({n, 1}).expand({n, k}).contiguous().reshape({n * k, 1});
  const Tensor perm_tokens = embedding(token_of_slot, order.narrow(0, 0, rows), /*masked=*/true).reshape({rows});
  // Where each slot's row is in that order (the inverse permutation): a dropped slot
  // points at a row >= rows, which the combine reads as zero.
  const Tensor slot_row = argsort(order);
  stats_.tokens_per_expert = counts;

  // Dispatch, experts, combine on this rank's pieces. Experts sharded over their hidden
  // dim (tensor parallel) hold partial sums there, and so does x's gradient.
  Placements out_layout = x.placements();
  for (size_t d = 0; d < out_layout.size(); ++d) {
    if (down_->placements()[d].is_shard(2)) out_layout[d] = Partial();
  }
  const DistTensor x_rows = reshape(x.as_local(out_layout), {n, c.dim});
  const DistTensor x_perm = gather_rows(x_rows, perm_tokens);
  auto weight = [&](const DistTensor* w) {
    return w ? for_compute(*w).as_local(local_grad_layout(*w, x)) : DistTensor();
  };
  const DistTensor up = weight(up_), gate = weight(gate_), down = weight(down_);
  auto run_experts = [&](const DistTensor& in, const std::vector<int64_t>& per_expert) {
    DistTensor h = grouped_linear(in, up, per_expert);
    h = gate.defined() ? mul(silu(grouped_linear(in, gate, per_expert)), h) : gelu(h, GeluApprox::Tanh);
    return grouped_linear(h, down, per_expert);
  };
  int ep = -1;
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (up_->placements()[static_cast<size_t>(d)].is_shard(0) && mesh.size(d) > 1) ep = d;  // one rank: whole
  }
  DistTensor y_perm;
  if (ep < 0) {
    y_perm = run_experts(x_perm, counts);
  } else {
    // Expert parallel: the assignments travel to the ranks holding their experts and back.
    const Group& group = mesh.group(ep);  // the mesh outlives this call
    const int ranks = group.size(), rank = group.rank();
    DT_CHECK_ARG(experts % ranks == 0, kOp, experts, " experts do not split evenly over the ", ranks,
                 " ranks of expert-parallel mesh dim ", mesh.names()[static_cast<size_t>(ep)]);
    DT_CHECK_ARG(x.placements()[static_cast<size_t>(ep)].is_shard(), kOp, "expert parallelism over mesh dim '",
                 mesh.names()[static_cast<size_t>(ep)], "' needs the tokens sharded over it too, got ",
                 placements_to_string(x.placements()));
    const int64_t mine = experts / ranks;
    const std::vector<int64_t> all =
        all_gather(group, Tensor::from_vector(counts, {1, experts})).contiguous().to_vector<int64_t>();  // [P, E]
    std::vector<int64_t> send(static_cast<size_t>(ranks), 0), recv(static_cast<size_t>(ranks), 0),
        local_counts(static_cast<size_t>(mine), 0);
    for (int r = 0; r < ranks; ++r) {
      for (int64_t e = 0; e < mine; ++e) {
        send[static_cast<size_t>(r)] += counts[static_cast<size_t>(r * mine + e)];
        const int64_t from_r = all[static_cast<size_t>(r * experts + rank * mine + e)];
        recv[static_cast<size_t>(r)] += from_r;
        local_counts[static_cast<size_t>(e)] += from_r;
      }
    }
    // Received: by source rank, then expert. Regrouped: by expert, then source rank.
    std::vector<int64_t> regroup, back(static_cast<size_t>(std::accumulate(recv.begin(), recv.end(), int64_t{0})));
    for (int64_t e = 0; e < mine; ++e) {
      int64_t source_start = 0;
      for (int r = 0; r < ranks; ++r) {
        int64_t offset = source_start;
        for (int64_t f = 0; f < e; ++f) offset += all[static_cast<size_t>(r * experts + rank * mine + f)];
        for (int64_t i = 0; i < all[static_cast<size_t>(r * experts + rank * mine + e)]; ++i) {
          back[static_cast<size_t>(offset + i)] = static_cast<int64_t>(regroup.size());
          regroup.push_back(offset + i);
        }
        source_start += recv[static_cast<size_t>(r)];
      }
    }
    const DistTensor received = exchange(x_perm, mesh, ep, send, recv);
    const DistTensor y_grouped =
        run_experts(gather_rows(received, Tensor::from_vector(regroup).to(device)), local_counts);
    y_perm = exchange(gather_rows(y_grouped, Tensor::from_vector(back).to(device)), mesh, ep, recv, send);
  }
  const DistTensor y_slots = reshape(gather_rows(y_perm, slot_row), {n, k, c.dim});
  const DistTensor local_gates = unsqueeze(reshape(gates.as_local(out_layout), {n, k}), -1).to(y_slots.dtype());
  Shape out_local = lead_local;
  out_local.push_back(c.dim);
  const DistTensor combined = reshape(sum(mul(y_slots, local_gates), {1}), out_local).to(x.dtype());
  DistTensor y = DistTensor::from_local(combined, mesh, out_layout, x.shape());
  if (out_layout != x.placements()) y = y.redistribute(x.placements());
  if (shared_) y = add(y, (*shared_)(x));
  return with_aux_gradient(y, aux_loss_);
}

}  // namespace dtensor::nn
