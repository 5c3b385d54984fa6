// Fused scaled-dot-product attention on local tensors: argument checks, output
// layout, then the device kernel (src/backend/cpu/attention.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/attention_plan.h"
#include "backend/kernels.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {
namespace {

const char* const kOp = "scaled_dot_product_attention";

void check_operands(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  DT_CHECK_ARG(q.defined() && k.defined() && v.defined(), op, "expected defined q, k, v");
  DT_CHECK_ARG(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op, "expected q, k, v of shape [..., S, D], got ",
               q.shape(), ", ", k.shape(), ", ", v.shape());
  DT_CHECK_ARG(q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()), op,
               "expected q, k, v of one floating dtype, got ", dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ",
               dtype_name(v.dtype()));
  DT_CHECK_ARG(q.device() == k.device() && k.device() == v.device(), op, "expected q, k, v on one device");
  const Shape lead(q.shape().begin(), q.shape().end() - 2);
  DT_CHECK_ARG(q.dim() == k.dim() && q.dim() == v.dim() && Shape(k.shape().begin(), k.shape().end() - 2) == lead &&
                   Shape(v.shape().begin(), v.shape().end() - 2) == lead,
               op, "expected q, k, v with the same leading dims, got ", q.shape(), ", ", k.shape(), ", ", v.shape());
  DT_CHECK_ARG(q.size(-1) == k.size(-1), op, "expected q and k with one head dim, got q ", q.shape(), " and k ",
               k.shape());
  DT_CHECK_ARG(k.size(-2) == v.size(-2), op, "expected k and v with one sequence length, got k ", k.shape(), " and v ",
               v.shape());
}

double scale_of(const Tensor& q, std::optional<double> scale) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(q.size(-1), 1)));
}

// F32 and BF16 run the kernel as they are; F16 goes through F32 on the CPU and as
// it is on CUDA (cuDNN's fused attention takes it; the own kernels convert). F64,
// the reference precision, takes the naive formulas below in F64.
DType kernel_dtype(const Tensor& t) {
  return t.dtype() == DType::BF16 || (t.dtype() == DType::F16 && t.device().is_cuda()) ? t.dtype() : DType::F32;
}

// The scaled scores with the causal mask applied (-inf where hidden): the F64 path.
Tensor masked_scores(const Tensor& q, const Tensor& k, bool causal, double scale) {
  Tensor scores = mul(matmul(q, k.transpose(-1, -2)), scale);
  if (!causal) return scores;
  // On the operands' device, so that a CUDA F64 forward stays on the GPU.
  const Tensor visible = le(Tensor::arange(k.size(-2), DType::I64, q.device()).unsqueeze(0),
                            Tensor::arange(q.size(-2), DType::I64, q.device()).unsqueeze(1));
  return where(visible, scores,
               Tensor::full({}, -std::numeric_limits<double>::infinity(), scores.dtype(), scores.device()));
}

AttentionResult attention_f64(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const Tensor scores = masked_scores(q, k, causal, scale);
  const Tensor m = amax(scores, {-1}, true);
  const Tensor lse = add(log(sum(exp(sub(scores, m)), {-1}, true)), m);
  const Tensor p = exp(sub(scores, lse));
  return {matmul(p, v), lse.squeeze(-1).to(DType::F32)};
}

AttentionGrads attention_backward_f64(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                      double scale) {
  const Tensor scores = masked_scores(q, k, causal, scale);
  const Tensor p = softmax(scores, -1);
  const Tensor dp = matmul(g, v.transpose(-1, -2));
  const Tensor ds = mul(softmax_backward(dp, p, -1), scale);
  return {matmul(ds, k), matmul(ds.transpose(-1, -2), q), matmul(p.transpose(-1, -2), g)};
}

// A zero head dim (all scores 0: uniform weights) or value dim: the kernels need
// rows of at least one element, so these shapes take the composite path (in F64).
bool composite_only(const Tensor& q, const Tensor& k, const Tensor& v) {
  return q.dtype() == DType::F64 || ((q.size(-1) == 0 || v.size(-1) == 0) && q.numel() + k.numel() + v.numel() > 0);
}

// Rows the kernel can read: unit stride along the last dim, in the kernel's dtype.
Tensor kernel_operand(const Tensor& t) { return backend::with_unit_stride_rows(t.to(kernel_dtype(t))); }

// An empty tensor of `shape` whose memory order of dims follows `like`'s strides
// (PyTorch's preserve_format): attention on a transposed [B, S, H, D] view writes
// its output in [B, S, H, D] order, so the caller's transpose back is a free view.
Tensor empty_in_order_of(const Tensor& like, const Shape& shape, DType dtype) {
  std::vector<int64_t> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  // Outermost first; the last dim stays innermost (rows stay contiguous).
  std::stable_sort(order.begin(), order.end() - 1,
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  Shape ordered;
  for (int64_t d : order) ordered.push_back(shape[static_cast<size_t>(d)]);
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return Tensor::empty(ordered, dtype, like.device()).permute(inverse);
}

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                             std::optional<double> scale) {
  check_operands(q, k, v, kOp);
  if (composite_only(q, k, v)) {
    AttentionResult r = attention_f64(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), causal, scale_of(q, scale));
    r.out = r.out.to(q.dtype());
    return r;
  }
  const Tensor qk = kernel_operand(q), kk = kernel_operand(k), vk = kernel_operand(v);
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  Tensor out = empty_in_order_of(q, out_shape, qk.dtype());
  const Shape lse_shape(q.shape().begin(), q.shape().end() - 1);
  Tensor lse = Tensor::empty(lse_shape, DType::F32, q.device());
  if (out.numel() > 0) {
    backend::kernels_for(q.device()).attention(qk, kk, vk, causal, scale_of(q, scale), out, lse);
  }
  return {out.to(q.dtype()), lse};
}

AttentionGrads scaled_dot_product_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const AttentionResult& saved, bool causal,
                                                     std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention_backward";
  check_operands(q, k, v, op);
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  DT_CHECK_ARG(grad_out.defined() && grad_out.shape() == out_shape, op, "expected grad_out of shape ", out_shape,
               ", got ", grad_out.defined() ? grad_out.shape() : Shape{});
  DT_CHECK_ARG(saved.out.defined() && saved.out.shape() == out_shape, op, "expected the saved output of shape ",
               out_shape);
  const Shape lse_shape(q.shape().begin(), q.shape().end() - 1);
  DT_CHECK_ARG(saved.lse.defined() && saved.lse.shape() == lse_shape && saved.lse.dtype() == DType::F32, op,
               "expected the saved lse of shape ", lse_shape, " and dtype f32");
  if (composite_only(q, k, v)) {
    AttentionGrads g = attention_backward_f64(grad_out.to(DType::F64), q.to(DType::F64), k.to(DType::F64),
                                              v.to(DType::F64), causal, scale_of(q, scale));
    return {g.grad_q.to(q.dtype()), g.grad_k.to(k.dtype()), g.grad_v.to(v.dtype())};
  }
  const Tensor qk = kernel_operand(q), kk = kernel_operand(k), vk = kernel_operand(v);
  const DType kd = qk.dtype();
  const Tensor gk = kernel_operand(grad_out.to(q.dtype())), ok = kernel_operand(saved.out.to(q.dtype()));
  AttentionGrads grads{empty_in_order_of(q, q.shape(), kd), empty_in_order_of(k, k.shape(), kd),
                       empty_in_order_of(v, v.shape(), kd)};
  if (q.numel() > 0 && k.numel() > 0) {
    backend::kernels_for(q.device())
        .attention_backward(gk, qk, kk, vk, ok, saved.lse.contiguous(), causal, scale_of(q, scale), grads.grad_q,
                            grads.grad_k, grads.grad_v);
  } else {
    for (Tensor* g : {&grads.grad_q, &grads.grad_k, &grads.grad_v}) g->fill_(0.0);
  }
  grads.grad_q = grads.grad_q.to(q.dtype());
  grads.grad_k = grads.grad_k.to(k.dtype());
  grads.grad_v = grads.grad_v.to(v.dtype());
  return grads;
}

}  // namespace dtensor
