// matmul, linear and linear_gelu on DistTensors.
//
// Rule "...mk,...kn->...mn" (batch dims broadcast): shard m -> output S(m),
// shard n -> output S(n) (column parallel), shard k on both -> output
// Partial(sum) (row parallel), shard a batch dim -> output S(batch); a Partial
// operand passes through when the other is replicated (matmul is bilinear).
#include "dist_tensor/step_plan_hooks.h"
#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {

using ops::with_grad;
using Grads = std::vector<DistTensor>;

namespace {

// g^T a over every batch row, [n, k]: "...N,...K->NK" with the batch letters
// contracted, so a batch dim sharded alike in both gives a Partial sum, whichever dim
// it is (the sequence under context parallelism as the batch under data parallelism),
// and each rank runs one GEMM over its rows.
DistTensor contract_rows(const DistTensor& g, const DistTensor& a) {
  const int64_t batch_dims = a.dim() - 1;
  auto spec = [&] {
    dispatch::EinsumSpec s;
    s.inputs = {ops::letters(batch_dims) + "N", ops::letters(batch_dims) + "K"};
    s.output = "NK";
    s.partial = dispatch::PartialRule::OneOf;
    return s;
  };
  return ops::run_einsum_lazy("matmul_rows", {}, {g, a}, spec, Shape{g.size(-1), a.size(-1)},
                              [](const std::vector<Tensor>& l) {
                                // Rows counted, not inferred: an uneven shard may hold none.
                                auto rows = [](const Tensor& t) {
                                  const int64_t n = shape_numel(Shape(t.shape().begin(), t.shape().end() - 1));
                                  return t.reshape({n, t.size(-1)});
                                };
                                return matmul(rows(l[0]).t(), rows(l[1]));
                              });
}

// The gradients of a @ b from the output's gradient g: a's and b's where the engine
// wants them (autograd::grad_wanted(0) and (1)), undefined otherwise. `b_is_weight_t`:
// b is W^T of a Linear (linear() says so; a guess from local strides could differ
// between ranks holding uneven shards, and then so would the collectives), so b's
// gradient is computed as g^T a, [n, k], and returned transposed: W's comes out
// contiguous like W.
Grads matmul_grads(const DistTensor& sa, const DistTensor& sb, const DistTensor& g, bool b_is_weight_t) {
  dispatch::MoveMemo memo;  // both products move g the same way: once
  // Only what the engine wants now: an input that does not require grad, or the
  // weight while a zero-bubble schedule computes input gradients first, costs nothing.
  Grads out(2);
  if (autograd::grad_wanted(0)) {
    out[0] = ops::sum_to(matmul(g, transpose(sb, -1, -2)), sa.shape());
  }
  if (!autograd::grad_wanted(1)) return out;
  if (sb.dim() == 2) {
    // [batch..., m, k] @ [k, n] (a Linear's weight): one contraction over every batch
    // row, whichever dims shard them, where they lie; the same path for every layout,
    // so that a planned step replays it whatever layouts the plan chose.
    out[1] = b_is_weight_t ? transpose(contract_rows(g, sa), 0, 1) : contract_rows(sa, g);
    return out;
  }
  // Batched: per batch entry, summed.
  if (b_is_weight_t) {
    const Shape w_shape{sb.size(1), sb.size(0)};
    out[1] = transpose(ops::sum_to(matmul(transpose(g, -1, -2), sa), w_shape), 0, 1);
  } else {
    out[1] = ops::sum_to(matmul(transpose(sa, -1, -2), g), sb.shape());
  }
  return out;
}

DistTensor matmul_2d_or_more(const DistTensor& a, const DistTensor& b, bool b_is_weight_t = false) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  DT_CHECK_ARG(b.size(-2) == k, "matmul", "inner dims differ: a is ", a.shape(), ", b is ", b.shape());
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  Shape out_shape = batch;
  out_shape.insert(out_shape.end(), {m, n});

  auto spec = [&] {
    dispatch::EinsumSpec s;
    s.inputs = {dispatch::broadcast_letters(a_batch, batch) + "MK", dispatch::broadcast_letters(b_batch, batch) + "KN"};
    s.output = ops::letters(static_cast<int64_t>(batch.size())) + "MN";
    s.partial = dispatch::PartialRule::OneOf;
    return s;
  };
  DistTensor out = ops::run_einsum_lazy("matmul", {}, {a, b}, spec, out_shape,
                                        [](const std::vector<Tensor>& l) { return matmul(l[0], l[1]); });
  if (!autograd::needs_grad({a, b})) return out;
  const DistTensor sa = a.detach(), sb = b.detach();
  return with_grad(out, "matmul", {a, b},
                   [sa, sb, b_is_weight_t](const Grads& g) { return matmul_grads(sa, sb, g[0], b_is_weight_t); });
}

// True when linear() can add the bias in the GEMM's epilogue: one dtype, no Partial
// input, and the contraction (x's last dim, w's dim 1) not sharded. A sharded
// contraction gives a Partial product (row parallel), to which the bias must be
// added once after the reduction, not on every rank (Megatron's RowParallelLinear
// adds it after the all-reduce too); that case stays matmul + add.
bool fuses_bias(const DistTensor& x, const DistTensor& w, const DistTensor& bias) {
  // The path taken depends on x's layout: a planned step keeps to it (step_plan.h).
  const int64_t last = x.dim() - 1;
  step_plan::keep_decision(x, [last](const Placements& p) {
    return std::any_of(p.begin(), p.end(), [&](const Placement& q) { return q.is_partial() || q.is_shard(last); });
  });
  if (x.dim() < 2) return false;                // a vector input: matmul's 1-D rules, then add
  if (bias.dtype() != x.dtype()) return false;  // linear() has checked x's against w's
  for (const DistTensor* t : {&x, &w, &bias}) {
    for (const Placement& p : t->placements()) {
      if (p.is_partial()) return false;
    }
  }
  for (const Placement& p : x.placements()) {
    if (p.is_shard(x.dim() - 1)) return false;
  }
  for (const Placement& p : w.placements()) {
    if (p.is_shard(1)) return false;
  }
  return true;
}

}  // namespace

DistTensor matmul(const DistTensor& a, const DistTensor& b) {
  dispatch::common_mesh({a, b}, "matmul");
  DT_CHECK_ARG(a.dim() >= 1 && b.dim() >= 1, "matmul", "expected tensors with at least 1 dim, got ", a.shape(), " and ",
               b.shape());
  DT_CHECK_ARG(a.dtype() == b.dtype(), "matmul", "dtypes differ: a is ", dtype_name(a.dtype()), ", b is ",
               dtype_name(b.dtype()));
  // NumPy's 1-D rules, through differentiable unsqueeze/squeeze.
  const bool a_vector = a.dim() == 1, b_vector = b.dim() == 1;
  DistTensor out = matmul_2d_or_more(a_vector ? unsqueeze(a, 0) : a, b_vector ? unsqueeze(b, 1) : b);
  if (a_vector) out = squeeze(out, -2);
  if (b_vector) out = squeeze(out, -1);
  return out;
}

DistTensor matmul(const DistTensor& a, const Tensor& b) { return matmul(a, implicit_replicate(b, a.mesh(), "matmul")); }

namespace {

void check_linear(const DistTensor& x, const DistTensor& w, const std::optional<DistTensor>& bias, const char* op) {
  DT_CHECK_ARG(x.dim() >= 1, op, "expected an input with at least 1 dim, got ", x.shape());
  DT_CHECK_ARG(x.dtype() == w.dtype(), op, "dtypes differ: x is ", dtype_name(x.dtype()), ", weight is ",
               dtype_name(w.dtype()));
  DT_CHECK_ARG(w.dim() == 2, op, "expected weight [out, in], got ", w.shape());
  DT_CHECK_ARG(x.size(-1) == w.size(1), op, "input features differ: x is ", x.shape(), ", weight is ", w.shape(),
               " (expected x[..., ", w.size(1), "])");
  if (bias) DT_CHECK_ARG(bias->shape() == Shape{w.size(0)}, op, "expected bias [", w.size(0), "], got ", bias->shape());
}

// x @ w^T + bias as one GEMM with the bias in its epilogue on every rank (and, with
// `local` computing linear_gelu, the GELU too): "...K,NK,N->...N" with K unshardable
// (fuses_bias keeps the row-parallel case out), so N sharded is column parallel with
// the bias sliced the same way, a sharded batch dim is data parallel.
DistTensor linear_with_epilogue(const char* op, const std::vector<int64_t>& attributes, const DistTensor& x,
                                const DistTensor& w, const DistTensor& bias, const ops::LocalFn& local) {
  const int64_t batch_dims = x.dim() - 1;
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  auto spec = [&] {
    dispatch::EinsumSpec s;
    s.inputs = {ops::letters(batch_dims) + "K", "NK", "N"};
    s.output = ops::letters(batch_dims) + "N";
    s.unshardable = "K";
    return s;
  };
  return ops::run_einsum_lazy(op, attributes, {x, w, bias}, spec, out_shape, local);
}

// The gradients of x @ w^T + bias for the output gradient g: matmul's (the weight's
// comes out [out, in] like w), and the bias's g summed over the batch dims.
Grads linear_grads(const DistTensor& x, const DistTensor& w, const DistTensor& g, const Shape& bias_shape) {
  Grads out(3);
  if (autograd::grad_wanted(0) || autograd::grad_wanted(1)) {
    Grads xw = matmul_grads(x, transpose(w, 0, 1), g, true);
    out[0] = xw[0];
    if (xw[1].defined()) out[1] = transpose(xw[1], 0, 1);
  }
  if (autograd::grad_wanted(2)) out[2] = ops::sum_to(g, bias_shape);
  return out;
}

}  // namespace

DistTensor linear(const DistTensor& x, const DistTensor& w, const std::optional<DistTensor>& bias) {
  check_linear(x, w, bias, "linear");
  if (!bias) {
    // x @ w^T, telling the backward that b is a Linear's transposed weight.
    return x.dim() >= 2 ? matmul_2d_or_more(x, transpose(w, 0, 1), true) : matmul(x, transpose(w, 0, 1));
  }
  if (!fuses_bias(x, w, *bias)) return add(linear(x, w, std::nullopt), *bias);
  DistTensor out = linear_with_epilogue("linear", {}, x, w, *bias,
                                        [](const std::vector<Tensor>& l) { return linear(l[0], l[1], l[2]); });
  if (!autograd::needs_grad({x, w, *bias})) return out;
  const DistTensor sx = x.detach(), sw = w.detach();
  const Shape bias_shape = bias->shape();
  return with_grad(out, "linear", {x, w, *bias},
                   [sx, sw, bias_shape](const Grads& g) { return linear_grads(sx, sw, g[0], bias_shape); });
}

DistTensor linear_gelu(const DistTensor& x, const DistTensor& w, const std::optional<DistTensor>& bias,
                       GeluApprox approx) {
  check_linear(x, w, bias, "linear_gelu");
  if (!bias || !fuses_bias(x, w, *bias)) return gelu(linear(x, w, bias), approx);
  // The local op hands back linear's output too: gelu's backward reads it, so it is
  // kept (as the two ops keep it) with the output's placements.
  Tensor pre_local;
  DistTensor out = linear_with_epilogue("linear_gelu", {static_cast<int64_t>(approx)}, x, w, *bias,
                                        [&pre_local, approx](const std::vector<Tensor>& l) {
                                          LinearGeluResult r = linear_gelu(l[0], l[1], l[2], approx);
                                          pre_local = std::move(r.pre);
                                          return r.out;
                                        });
  if (!autograd::needs_grad({x, w, *bias})) return out;
  const DistTensor pre = dispatch::wrap(pre_local, out.mesh(), out.placements(), out.shape());
  const DistTensor sx = x.detach(), sw = w.detach();
  const Shape bias_shape = bias->shape();
  return with_grad(out, "linear_gelu", {x, w, *bias}, [sx, sw, pre, bias_shape, approx](const Grads& g) {
    return linear_grads(sx, sw, ops::gelu_backward(g[0], pre, approx), bias_shape);
  });
}

}  // namespace dtensor
