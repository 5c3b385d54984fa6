// scaled_dot_product_attention on DistTensors: softmax(q k^T / sqrt(Dh) + mask) v.
//
// Three paths:
// - sequence and head dims unsharded (heads, batch or other leading dims may be
//   sharded, as under data and tensor parallelism): the fused local kernel
//   (tensor_ops.h), which never materialises the [Sq, Sk] scores and saves only the
//   output and a per-query log-sum-exp for the backward. Rule: the leading dims of
//   q, k, v and the output share letters; S, T, D, Dv are unshardable; a Partial
//   input is reduced first (attention is not linear in q or k). Backward: the fused
//   backward kernel; the gradients have their inputs' placements.
// - the sequence sharded over one mesh dim, q, k, v of one length and layout, the
//   head dim whole: context parallelism (ops/attention_context.h), ring attention or
//   the all-gather variant by the cost model, exact, with no S x S scores held.
// - other layouts with a sequence or head dim sharded: a composite of matmul, where, softmax and
//   matmul, so each step takes its own sharding rule: the query sequence sharded ->
//   local (the mask is replicated and chunked for free); the key sequence sharded ->
//   the softmax runs along a sharded dim with all-reduces of its statistics, and the
//   last matmul contracts a sharded dim (Partial(sum)); Dh sharded -> the scores are
//   Partial(sum) and reduced once.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dist_tensor/step_plan_hooks.h"
#include "ops/attention_context.h"
#include "ops/nn_helpers.h"
#include "util/check.h"

namespace dtensor {

namespace {

const char* const kOp = "scaled_dot_product_attention";

bool sequence_or_head_sharded(const DistTensor& t) {
  return ops::is_sharded_on(t.placements(), t.dim() - 1) || ops::is_sharded_on(t.placements(), t.dim() - 2);
}

bool same_leading_dims(const DistTensor& q, const DistTensor& k, const DistTensor& v) {
  auto lead = [](const DistTensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); };
  return q.dim() == k.dim() && q.dim() == v.dim() && lead(q) == lead(k) && lead(q) == lead(v);
}

DistTensor fused(const DistTensor& q, const DistTensor& k, const DistTensor& v, bool causal) {
  const std::string lead = ops::letters(q.dim() - 2);
  dispatch::EinsumSpec spec;
  spec.inputs = {lead + "SD", lead + "TD", lead + "TE"};
  spec.output = lead + "SE";
  spec.unshardable = "SDTE";
  const ops::Placed placed = ops::place_inputs(kOp, {causal ? 1 : 0}, {q, k, v}, spec);
  const Tensor ql = placed.locals[0], kl = placed.locals[1], vl = placed.locals[2];
  AttentionResult saved = scaled_dot_product_attention(ql, kl, vl, causal);
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  const Placements out_placements = placed.strategy.output;
  DistTensor out = dispatch::wrap(saved.out, q.mesh(), out_placements, out_shape);
  if (!autograd::needs_grad({q, k, v})) return out;
  const std::vector<Placements> input_placements = placed.strategy.inputs;
  const Shape q_shape = q.shape(), k_shape = k.shape(), v_shape = v.shape();
  return ops::with_grad(out, kOp, {q, k, v}, [=](const std::vector<DistTensor>& g) {
    const DistTensor grad = g[0].placements() == out_placements ? g[0] : g[0].redistribute(out_placements);
    const AttentionGrads r = scaled_dot_product_attention_backward(grad.to_local(), ql, kl, vl, saved, causal);
    const DeviceMesh& mesh = grad.mesh();
    return std::vector<DistTensor>{dispatch::wrap(r.grad_q, mesh, input_placements[0], q_shape),
                                   dispatch::wrap(r.grad_k, mesh, input_placements[1], k_shape),
                                   dispatch::wrap(r.grad_v, mesh, input_placements[2], v_shape)};
  });
}

DistTensor composite(const DistTensor& q, const DistTensor& k, const DistTensor& v, bool causal) {
  const DeviceMesh& mesh = q.mesh();
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  DistTensor scores = mul(matmul(q, transpose(k, -1, -2)), scale);
  if (causal) {
    // Query i sees keys j <= i (top-left aligned, as PyTorch's is_causal). The mask
    // is small and built on every rank: a replicated operand costs nothing to chunk.
    const int64_t queries = q.size(-2), keys = k.size(-2);
    const Tensor allowed = le(Tensor::arange(keys, DType::I64, q.device()).unsqueeze(0),
                              Tensor::arange(queries, DType::I64, q.device()).unsqueeze(1));
    const Placements replicated(static_cast<size_t>(mesh.ndim()), Replicate());
    const DistTensor masked_value =
        full({}, -std::numeric_limits<double>::infinity(), mesh, replicated, scores.dtype());
    scores = where(distribute(allowed.to(q.device()), mesh, replicated), scores, masked_value);
  }
  return matmul(softmax(scores, -1), v);
}

}  // namespace

DistTensor scaled_dot_product_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, bool causal) {
  dispatch::common_mesh({q, k, v}, kOp);
  DT_CHECK_ARG(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, kOp, "expected q, k, v of shape [..., S, D], got ",
               q.shape(), ", ", k.shape(), ", ", v.shape());
  DT_CHECK_ARG(q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()), kOp,
               "expected q, k, v of one floating dtype, got ", dtype_name(q.dtype()), ", ", dtype_name(k.dtype()),
               ", ", dtype_name(v.dtype()));
  DT_CHECK_ARG(q.size(-1) == k.size(-1), kOp, "expected q and k with one head dim, got q ", q.shape(), " and k ",
               k.shape());
  DT_CHECK_ARG(k.size(-2) == v.size(-2), kOp, "expected k and v with one sequence length, got k ", k.shape(),
               " and v ", v.shape());
  // The sequence sharded over a mesh dim: context parallelism. Inside a load-balanced
  // ContextParallelScope the sequence of a mesh with its dim is in that order, so
  // causal attention there must take this path to mask by the right positions.
  const int cp = ops::context::sequence_mesh_dim(q, k, v);
  bool load_balanced = false;
  ContextAttention algorithm = ContextAttention::Auto;
  if (const std::optional<ContextParallelOptions> scope = ContextParallelScope::current()) {
    const std::vector<std::string>& names = q.mesh().names();
    const auto it = std::find(names.begin(), names.end(), scope->mesh_dim);
    const int scoped = it == names.end() ? -1 : static_cast<int>(it - names.begin());
    DT_CHECK_ARG(!(scope->load_balanced && causal && scoped >= 0 && q.mesh().size(scoped) > 1 && cp != scoped), kOp,
                 "causal attention on a sequence in the load-balanced order over '", scope->mesh_dim,
                 "' needs q, k, v of one length and one layout with the sequence (dim ", q.dim() - 2,
                 ") sharded over that mesh dim and the head dim whole; got q ", q.shape(), " ",
                 placements_to_string(q.placements()), ", k ", k.shape(), " ", placements_to_string(k.placements()),
                 ", v ", v.shape(), " ", placements_to_string(v.placements()));
    if (cp >= 0 && cp == scoped) {
      load_balanced = scope->load_balanced;
      algorithm = scope->attention;
    }
  }
  if (cp >= 0) return ops::context::attention(q, k, v, causal, cp, load_balanced, algorithm);
  for (const DistTensor* t : {&q, &k, &v}) {  // the path depends on the layouts: a plan keeps to it
    const int64_t dim = t->dim();
    step_plan::keep_decision(
        *t, [dim](const Placements& p) { return ops::is_sharded_on(p, dim - 1) || ops::is_sharded_on(p, dim - 2); });
  }
  if (same_leading_dims(q, k, v) && !sequence_or_head_sharded(q) && !sequence_or_head_sharded(k) &&
      !sequence_or_head_sharded(v)) {
    return fused(q, k, v, causal);
  }
  return composite(q, k, v, causal);
}

}  // namespace dtensor
