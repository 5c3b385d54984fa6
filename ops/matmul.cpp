// matmul and linear on DistTensors.
//
// Rule "...mk,...kn->...mn" (batch dims broadcast): shard m -> output S(m),
// shard n -> output S(n) (column parallel), shard k on both -> output
// Partial(sum) (row parallel), shard a batch dim -> output S(batch); a Partial
// operand passes through when the other is replicated (matmul is bilinear).
#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {

using ops::with_grad;
using Grads = std::vector<DistTensor>;

namespace {

// True when merging all dims but the last into one is free for t's layout: no
// Partial (its reduction stays with the MoveMemo of the other product), and only the
// outermost of those dims sharded, evenly (a shard of the merged dim is then the same
// contiguous block of rows), so the reshape communicates nothing.
bool flattens_for_free(const DistTensor& t) {
  int64_t shards_of_dim0 = 1;
  for (size_t m = 0; m < t.placements().size(); ++m) {
    const Placement& p = t.placements()[m];
    if (p.is_partial()) return false;
    for (int64_t d = 1; d + 1 < t.dim(); ++d) {
      if (p.is_shard(d)) return false;
    }
    if (p.is_shard(0)) shards_of_dim0 *= t.mesh().size(static_cast<int>(m));
  }
  return t.size(0) % shards_of_dim0 == 0;
}

DistTensor matmul_2d_or_more(const DistTensor& a, const DistTensor& b) {
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
  return with_grad(out, "matmul", {a, b}, [sa, sb](const Grads& g) {
    dispatch::MoveMemo memo;  // both products move g[0] the same way: once
    // Only what the engine wants now: an input that does not require grad, or the
    // weight while a zero-bubble schedule computes input gradients first, costs nothing.
    Grads out(2);
    if (autograd::grad_wanted(0)) {
      out[0] = ops::sum_to(matmul(g[0], transpose(sb, -1, -2)), sa.shape());
    }
    if (!autograd::grad_wanted(1)) return out;
    if (sb.dim() == 2 && sa.dim() > 2 && flattens_for_free(sa) && flattens_for_free(g[0])) {
      // [batch..., m, k] @ [k, n] (a Linear's weight): one GEMM over all batch rows,
      // a^T [k, rows] @ g [rows, n], instead of one per batch entry and a sum over them.
      const int64_t k = sa.size(-1), n = g[0].size(-1);
      const DistTensor a_rows = reshape(sa, {-1, k}), g_rows = reshape(g[0], {-1, n});
      const Tensor& b_local = sb.to_local();
      if (b_local.stride(0) == 1 && b_local.size(0) > 1 && b_local.size(1) > 1) {
        // b is a transposed view (W^T of a Linear): compute g^T a as [n, k], contiguous,
        // and return its transpose, so W's gradient comes out contiguous like W.
        out[1] = transpose(matmul(transpose(g_rows, 0, 1), a_rows), 0, 1);
      } else {
        out[1] = matmul(transpose(a_rows, 0, 1), g_rows);
      }
    } else {
      out[1] = ops::sum_to(matmul(transpose(sa, -1, -2), g[0]), sb.shape());
    }
    return out;
  });
}

}  // namespace

DistTensor matmul(const DistTensor& a, const DistTensor& b) {
  dispatch::common_mesh({a, b}, "matmul");
  DT_CHECK_ARG(a.dim() >= 1 && b.dim() >= 1, "matmul", "expected tensors with at least 1 dim, got ",
               a.shape(), " and ", b.shape());
  DT_CHECK_ARG(a.dtype() == b.dtype(), "matmul", "dtypes differ: a is ", dtype_name(a.dtype()), ", b is ",
               dtype_name(b.dtype()));
  // NumPy's 1-D rules, through differentiable unsqueeze/squeeze.
  const bool a_vector = a.dim() == 1, b_vector = b.dim() == 1;
  DistTensor out = matmul_2d_or_more(a_vector ? unsqueeze(a, 0) : a, b_vector ? unsqueeze(b, 1) : b);
  if (a_vector) out = squeeze(out, -2);
  if (b_vector) out = squeeze(out, -1);
  return out;
}

DistTensor matmul(const DistTensor& a, const Tensor& b) {
  return matmul(a, implicit_replicate(b, a.mesh(), "matmul"));
}

DistTensor linear(const DistTensor& x, const DistTensor& w, const std::optional<DistTensor>& bias) {
  DT_CHECK_ARG(w.dim() == 2, "linear", "expected weight [out, in], got ", w.shape());
  DT_CHECK_ARG(x.size(-1) == w.size(1), "linear", "input features differ: x is ", x.shape(), ", weight is ",
               w.shape(), " (expected x[..., ", w.size(1), "])");
  DistTensor y = matmul(x, transpose(w, 0, 1));
  if (!bias) return y;
  DT_CHECK_ARG(bias->shape() == Shape{w.size(0)}, "linear", "expected bias [", w.size(0), "], got ",
               bias->shape());
  return add(y, *bias);
}

}  // namespace dtensor
