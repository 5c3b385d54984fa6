// Neural-network ops: argument checks, shapes of the saved statistics, loss
// reductions, then the device kernels.
//
// Dtypes: these ops need a floating input. Norm weights and biases are converted to
// the input's dtype (and their gradients back to the weight's dtype), so F32 master
// weights work with BF16 activations. Saved norm statistics and per-row losses are
// kept in F32 for BF16/F16 inputs.
#include <numeric>

#include "backend/kernels.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {
namespace {

void check_floating(const Tensor& t, const char* op, const char* what) {
  DT_CHECK_ARG(t.defined(), op, "expected a defined ", what, ", got an undefined one");
  DT_CHECK_ARG(is_floating(t.dtype()), op, "expected a floating dtype for ", what, ", got ",
               dtype_name(t.dtype()));
}

void check_indices(const Tensor& t, const char* op, const char* what) {
  DT_CHECK_ARG(t.defined(), op, "expected a defined ", what, ", got an undefined one");
  DT_CHECK_ARG(t.dtype() == DType::I64 || t.dtype() == DType::I32, op, "expected ", what,
               " of dtype i64 or i32, got ", dtype_name(t.dtype()));
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* a_name,
                      const char* b_name) {
  DT_CHECK_ARG(a.shape() == b.shape(), op, "expected ", a_name, " and ", b_name,
               " of one shape, got ", a.shape(), " and ", b.shape());
  DT_CHECK_ARG(a.device() == b.device(), op, "devices differ: ", a_name, " is on ",
               a.device().to_string(), ", ", b_name, " on ", b.device().to_string());
}

// The dtype of saved statistics and per-row losses: F32 for the half types.
DType stats_dtype(DType t) { return t == DType::BF16 || t == DType::F16 ? DType::F32 : t; }

Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

Tensor run_softmax(const Tensor& a, int64_t dim, bool log, const char* op) {
  check_floating(a, op, "input");
  const Tensor x = at_least_1d(a);
  const int d = normalize_dim(dim, a.dim(), op);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend::kernels_for(x.device()).softmax(x, d, log, out);
  return out.view(a.shape());
}

Tensor run_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim, bool log,
                            const char* op) {
  check_floating(out, op, "output");
  check_floating(grad_out, op, "grad_out");
  check_same_shape(grad_out, out, op, "grad_out", "output");
  const Tensor y = at_least_1d(out);
  const int d = normalize_dim(dim, out.dim(), op);
  Tensor grad_in = Tensor::empty(y.shape(), y.dtype(), y.device());
  backend::kernels_for(y.device())
      .softmax_backward(at_least_1d(grad_out.to(y.dtype())), y, d, log, grad_in);
  return grad_in.view(out.shape());
}

// x viewed as [rows, cols] with cols = numel(normalized_shape).
struct NormLayout {
  Shape leading;  // x's dims before normalized_shape
  int64_t rows = 1, cols = 1;
};

NormLayout norm_layout(const Tensor& x, const Shape& normalized_shape, const char* op) {
  check_floating(x, op, "input");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  DT_CHECK_ARG(k >= 1, op, "expected a non-empty normalized_shape, got ", normalized_shape);
  const bool trailing_match =
      x.dim() >= k && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape;
  DT_CHECK_ARG(trailing_match, op, "normalized_shape ", normalized_shape,
               " does not match the trailing dims of the input ", x.shape());
  NormLayout layout;
  layout.leading = Shape(x.shape().begin(), x.shape().end() - k);
  layout.rows = shape_numel(layout.leading);
  layout.cols = shape_numel(normalized_shape);
  return layout;
}

// weight or bias as a contiguous [cols] tensor in x's dtype (undefined if absent).
Tensor norm_parameter(const std::optional<Tensor>& p, const Tensor& x, const Shape& normalized_shape,
                      const char* op, const char* what) {
  if (!p) return Tensor();
  check_floating(*p, op, what);
  DT_CHECK_ARG(p->shape() == normalized_shape, op, "expected ", what, " of shape ",
               normalized_shape, ", got ", p->shape());
  DT_CHECK_ARG(p->device() == x.device(), op, "devices differ: input is on ",
               x.device().to_string(), ", ", what, " on ", p->device().to_string());
  return p->to(x.dtype()).contiguous().reshape({shape_numel(normalized_shape)});
}

// A saved statistic as a contiguous [rows] tensor, checked against the layout.
Tensor saved_statistic(const Tensor& s, const NormLayout& layout, DType dtype, const char* op,
                       const char* what) {
  DT_CHECK_ARG(s.defined(), op, "expected the saved ", what, ", got an undefined tensor");
  DT_CHECK_ARG(s.shape() == layout.leading && s.dtype() == dtype, op, "expected saved ", what,
               " of shape ", layout.leading, " and dtype ", dtype_name(dtype), ", got ", s.shape(),
               " ", dtype_name(s.dtype()));
  return s.contiguous().reshape({layout.rows});
}

Tensor matrix_view(const Tensor& x, const NormLayout& layout) {
  return x.contiguous().reshape({layout.rows, layout.cols});
}

// A [cols] gradient reshaped to the parameter's shape and dtype.
Tensor parameter_grad(const Tensor& g, const std::optional<Tensor>& p, const Shape& shape) {
  return g.view(shape).to(p ? p->dtype() : g.dtype());
}

// Number of targets that count (not ignore_index).
int64_t counted_targets(const Tensor& targets, int64_t ignore_index) {
  return sum(binary(BinaryOp::Ne, targets, static_cast<double>(ignore_index))).item<int64_t>();
}

void check_cross_entropy(const Tensor& logits, const Tensor& targets, const char* op) {
  check_floating(logits, op, "logits");
  check_indices(targets, op, "targets");
  DT_CHECK_ARG(logits.dim() == 2, op, "expected logits [N, C], got ", logits.shape());
  DT_CHECK_ARG(targets.dim() == 1 && targets.size(0) == logits.size(0), op,
               "expected targets [", logits.size(0), "] for logits ", logits.shape(), ", got ",
               targets.shape());
  DT_CHECK_ARG(logits.device() == targets.device(), op, "devices differ: logits on ",
               logits.device().to_string(), ", targets on ", targets.device().to_string());
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return run_softmax(a, dim, false, "softmax"); }
Tensor log_softmax(const Tensor& a, int64_t dim) {
  return run_softmax(a, dim, true, "log_softmax");
}
Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  return run_softmax_backward(grad_out, out, dim, false, "softmax_backward");
}
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  return run_softmax_backward(grad_out, out, dim, true, "log_softmax_backward");
}

NormResult layer_norm(const Tensor& x, const Shape& normalized_shape,
                      const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                      double eps) {
  const NormLayout layout = norm_layout(x, normalized_shape, "layer_norm");
  const Tensor w = norm_parameter(weight, x, normalized_shape, "layer_norm", "weight");
  const Tensor b = norm_parameter(bias, x, normalized_shape, "layer_norm", "bias");
  const DType sd = stats_dtype(x.dtype());
  Tensor out = Tensor::empty({layout.rows, layout.cols}, x.dtype(), x.device());
  Tensor mean = Tensor::empty({layout.rows}, sd, x.device());
  Tensor rstd = Tensor::empty({layout.rows}, sd, x.device());
  backend::kernels_for(x.device()).layer_norm(matrix_view(x, layout), w, b, eps, out, mean, rstd);
  return {out.view(x.shape()), mean.view(layout.leading), rstd.view(layout.leading)};
}

NormResult rms_norm(const Tensor& x, const Shape& normalized_shape,
                    const std::optional<Tensor>& weight, double eps) {
  const NormLayout layout = norm_layout(x, normalized_shape, "rms_norm");
  const Tensor w = norm_parameter(weight, x, normalized_shape, "rms_norm", "weight");
  Tensor out = Tensor::empty({layout.rows, layout.cols}, x.dtype(), x.device());
  Tensor rstd = Tensor::empty({layout.rows}, stats_dtype(x.dtype()), x.device());
  backend::kernels_for(x.device()).rms_norm(matrix_view(x, layout), w, eps, out, rstd);
  return {out.view(x.shape()), Tensor(), rstd.view(layout.leading)};
}

NormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const NormResult& saved,
                              const Shape& normalized_shape, const std::optional<Tensor>& weight,
                              bool has_bias) {
  const char* op = "layer_norm_backward";
  const NormLayout layout = norm_layout(x, normalized_shape, op);
  check_floating(grad_out, op, "grad_out");
  check_same_shape(grad_out, x, op, "grad_out", "input");
  const DType sd = stats_dtype(x.dtype());
  const Tensor mean = saved_statistic(saved.mean, layout, sd, op, "mean");
  const Tensor rstd = saved_statistic(saved.rstd, layout, sd, op, "rstd");
  const Tensor w = norm_parameter(weight, x, normalized_shape, op, "weight");
  Tensor grad_in = Tensor::empty({layout.rows, layout.cols}, x.dtype(), x.device());
  Tensor grad_w = w.defined() ? Tensor::empty({layout.cols}, x.dtype(), x.device()) : Tensor();
  Tensor grad_b = has_bias ? Tensor::empty({layout.cols}, x.dtype(), x.device()) : Tensor();
  backend::kernels_for(x.device())
      .layer_norm_backward(matrix_view(grad_out.to(x.dtype()), layout), matrix_view(x, layout),
                           mean, rstd, w, grad_in, grad_w, grad_b);
  NormGrads grads{grad_in.view(x.shape()), Tensor(), Tensor()};
  if (grad_w.defined()) grads.grad_weight = parameter_grad(grad_w, weight, normalized_shape);
  if (grad_b.defined()) grads.grad_bias = parameter_grad(grad_b, weight, normalized_shape);
  return grads;
}

NormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x, const NormResult& saved,
                            const Shape& normalized_shape, const std::optional<Tensor>& weight) {
  const char* op = "rms_norm_backward";
  const NormLayout layout = norm_layout(x, normalized_shape, op);
  check_floating(grad_out, op, "grad_out");
  check_same_shape(grad_out, x, op, "grad_out", "input");
  const Tensor rstd = saved_statistic(saved.rstd, layout, stats_dtype(x.dtype()), op, "rstd");
  const Tensor w = norm_parameter(weight, x, normalized_shape, op, "weight");
  Tensor grad_in = Tensor::empty({layout.rows, layout.cols}, x.dtype(), x.device());
  Tensor grad_w = w.defined() ? Tensor::empty({layout.cols}, x.dtype(), x.device()) : Tensor();
  backend::kernels_for(x.device())
      .rms_norm_backward(matrix_view(grad_out.to(x.dtype()), layout), matrix_view(x, layout), rstd,
                         w, grad_in, grad_w);
  NormGrads grads{grad_in.view(x.shape()), Tensor(), Tensor()};
  if (grad_w.defined()) grads.grad_weight = parameter_grad(grad_w, weight, normalized_shape);
  return grads;
}

Tensor gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApprox approx) {
  check_floating(x, "gelu_backward", "input");
  check_floating(grad_out, "gelu_backward", "grad_out");
  check_same_shape(grad_out, x, "gelu_backward", "grad_out", "input");
  Tensor grad_in = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend::kernels_for(x.device()).gelu_backward(grad_out.to(x.dtype()), x, approx, grad_in);
  return grad_in;
}

Tensor silu_backward(const Tensor& grad_out, const Tensor& x) {
  check_floating(x, "silu_backward", "input");
  check_floating(grad_out, "silu_backward", "grad_out");
  check_same_shape(grad_out, x, "silu_backward", "grad_out", "input");
  Tensor grad_in = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend::kernels_for(x.device()).silu_backward(grad_out.to(x.dtype()), x, grad_in);
  return grad_in;
}

Tensor embedding(const Tensor& table, const Tensor& ids, bool masked) {
  DT_CHECK_ARG(table.defined(), "embedding", "expected a defined table, got an undefined one");
  check_indices(ids, "embedding", "ids");
  DT_CHECK_ARG(table.dim() == 2, "embedding", "expected a table [V, D], got ", table.shape());
  DT_CHECK_ARG(table.device() == ids.device(), "embedding", "devices differ: table on ",
               table.device().to_string(), ", ids on ", ids.device().to_string());
  Shape out_shape = ids.shape();
  out_shape.push_back(table.size(1));
  Tensor out = Tensor::empty({ids.numel(), table.size(1)}, table.dtype(), table.device());
  backend::kernels_for(table.device()).embedding(table, ids.reshape({-1}), masked, out);
  return out.view(out_shape);
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& ids, int64_t num_rows, bool masked) {
  const char* op = "embedding_backward";
  check_floating(grad_out, op, "grad_out");
  check_indices(ids, op, "ids");
  DT_CHECK_ARG(num_rows >= 0, op, "expected num_rows >= 0, got ", num_rows);
  const bool shapes_fit = grad_out.dim() == ids.dim() + 1 &&
                          Shape(grad_out.shape().begin(), grad_out.shape().end() - 1) == ids.shape();
  DT_CHECK_ARG(shapes_fit, op, "expected grad_out of shape ids.shape + [D] with ids ", ids.shape(),
               ", got ", grad_out.shape());
  const int64_t width = grad_out.size(-1);
  Tensor grad_table = Tensor::zeros({num_rows, width}, grad_out.dtype(), grad_out.device());
  backend::kernels_for(grad_out.device())
      .embedding_backward(grad_out.reshape({ids.numel(), width}), ids.reshape({-1}), masked,
                          grad_table);
  return grad_table;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, LossReduction reduction,
                     int64_t ignore_index) {
  check_cross_entropy(logits, targets, "cross_entropy");
  Tensor losses = Tensor::empty({logits.size(0)}, stats_dtype(logits.dtype()), logits.device());
  backend::kernels_for(logits.device()).cross_entropy(logits, targets, ignore_index, losses);
  switch (reduction) {
    case LossReduction::None: return losses.to(logits.dtype());
    case LossReduction::Sum: return sum(losses).to(logits.dtype());
    case LossReduction::Mean: break;
  }
  // Mean over the counted rows; all rows ignored gives 0/0 = NaN, as in PyTorch.
  const double count = static_cast<double>(counted_targets(targets, ignore_index));
  return div(sum(losses), count).to(logits.dtype());
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              LossReduction reduction, int64_t ignore_index) {
  const char* op = "cross_entropy_backward";
  check_cross_entropy(logits, targets, op);
  check_floating(grad_loss, op, "grad_loss");
  const int64_t rows = logits.size(0);
  Tensor grad_rows;
  if (reduction == LossReduction::None) {
    DT_CHECK_ARG(grad_loss.shape() == Shape{rows}, op, "expected grad_loss [", rows,
                 "] for reduction None, got ", grad_loss.shape());
    grad_rows = grad_loss;
  } else {
    DT_CHECK_ARG(grad_loss.numel() == 1, op, "expected a one-element grad_loss, got ",
                 grad_loss.shape());
    double scale = grad_loss.item<double>();
    if (reduction == LossReduction::Mean) {
      scale /= static_cast<double>(counted_targets(targets, ignore_index));
    }
    grad_rows = Tensor::full({rows}, scale, DType::F64, logits.device());
  }
  Tensor grad_logits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  backend::kernels_for(logits.device())
      .cross_entropy_backward(grad_rows, logits, targets, ignore_index, grad_logits);
  return grad_logits;
}

}  // namespace dtensor
