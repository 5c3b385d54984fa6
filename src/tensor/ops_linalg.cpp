// matmul and linear: shape checks, batch broadcasting, then the device GEMM.
#include "backend/kernels.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {
namespace {

void check_matmul_operands(const Tensor& a, const Tensor& b, const char* op) {
  DT_CHECK_ARG(a.defined() && b.defined(), op, "expected defined tensors");
  DT_CHECK_ARG(a.dim() >= 1 && b.dim() >= 1, op, "expected tensors with at least 1 dim, got ", a.shape(), " and ",
               b.shape());
  DT_CHECK_ARG(is_floating(a.dtype()), op, "expected a floating dtype, got ", dtype_name(a.dtype()));
  DT_CHECK_ARG(a.dtype() == b.dtype(), op, "dtypes differ: a is ", dtype_name(a.dtype()), ", b is ",
               dtype_name(b.dtype()));
  DT_CHECK_ARG(a.device() == b.device(), op, "devices differ: a is on ", a.device().to_string(), ", b on ",
               b.device().to_string());
}

// The common [batch..., m, k] @ [k, n] (a 1-D a is one row): one GEMM with all batch
// rows stacked, plus `bias` ([n], out's dtype; undefined for none) in its epilogue,
// and with `gelu` that GELU after it, linear's output going to *pre.
Tensor stacked_rows_matmul(const Tensor& a, const Tensor& b, const Tensor& bias,
                           std::optional<GeluApprox> gelu = std::nullopt, Tensor* pre = nullptr) {
  const int64_t k = b.size(0), n = b.size(1);
  Shape out_shape = a.shape();
  out_shape.back() = n;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < a.dim(); ++d) rows *= a.size(d);
  Tensor out = Tensor::empty({1, rows, n}, a.dtype(), a.device());
  backend::Kernels& kernels = backend::kernels_for(a.device());
  if (gelu) {
    Tensor linear_out = Tensor::empty({1, rows, n}, a.dtype(), a.device());
    kernels.matmul_bias_gelu(a.reshape({1, rows, k}), b.unsqueeze(0), bias, *gelu, out, linear_out);
    *pre = linear_out.view(out_shape);
  } else if (bias.defined()) {
    kernels.matmul_bias(a.reshape({1, rows, k}), b.unsqueeze(0), bias, out);
  } else {
    kernels.matmul(a.reshape({1, rows, k}), b.unsqueeze(0), out);
  }
  return out.view(out_shape);
}

void check_linear_operands(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias, const char* op) {
  check_matmul_operands(x, w, op);
  DT_CHECK_ARG(w.dim() == 2, op, "expected weight [out, in], got ", w.shape());
  DT_CHECK_ARG(x.size(-1) == w.size(1), op, "input features differ: x is ", x.shape(), ", weight is ", w.shape(),
               " (expected x[..., ", w.size(1), "])");
  if (bias) DT_CHECK_ARG(bias->shape() == Shape{w.size(0)}, op, "expected bias [", w.size(0), "], got ", bias->shape());
}

// Whether the bias goes into the GEMM's epilogue: one of x's dtype and device (else
// add()'s promotion and errors apply).
bool bias_fuses(const Tensor& x, const std::optional<Tensor>& bias) {
  return !bias || (bias->dtype() == x.dtype() && bias->device() == x.device());
}

// [..., m, k] @ [..., k, n] with both operands at least 2-D.
Tensor matmul_2d_or_more(const Tensor& a, const Tensor& b, const char* op) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  DT_CHECK_ARG(b.size(-2) == k, op, "inner dims differ: a is ", a.shape(), ", b is ", b.shape());
  if (b.dim() == 2) return stacked_rows_matmul(a, b, Tensor());
  backend::Kernels& kernels = backend::kernels_for(a.device());
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(a_batch, b_batch, op);
  const int64_t batch_numel = shape_numel(batch);
  Shape a_full = batch, b_full = batch, out_shape = batch;
  a_full.insert(a_full.end(), {m, k});
  b_full.insert(b_full.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = Tensor::empty({batch_numel, m, n}, a.dtype(), a.device());
  kernels.matmul(a.expand(a_full).reshape({batch_numel, m, k}), b.expand(b_full).reshape({batch_numel, k, n}), out);
  return out.view(out_shape);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_matmul_operands(a, b, "matmul");
  // NumPy's 1-D rules: a vector on the left is a row, on the right a column, and the
  // added dim is removed from the result.
  const bool a_vector = a.dim() == 1, b_vector = b.dim() == 1;
  Tensor out = matmul_2d_or_more(a_vector ? a.unsqueeze(0) : a, b_vector ? b.unsqueeze(1) : b, "matmul");
  if (a_vector) out = out.squeeze(-2);
  if (b_vector) out = out.squeeze(-1);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias) {
  check_linear_operands(x, w, bias, "linear");
  if (!bias) return matmul(x, w.t());
  if (!bias_fuses(x, bias)) return add(matmul(x, w.t()), *bias);
  // One GEMM over all rows of x with the bias in its epilogue.
  return stacked_rows_matmul(x, w.t(), bias->contiguous());
}

LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias, GeluApprox approx) {
  check_linear_operands(x, w, bias, "linear_gelu");
  if (!bias_fuses(x, bias)) {
    Tensor pre = linear(x, w, bias);
    return {gelu(pre, approx), pre};
  }
  // One GEMM over all rows of x (a 1-D x is one row) with the bias and the GELU in its
  // epilogue.
  LinearGeluResult r;
  r.out = stacked_rows_matmul(x, w.t(), bias ? bias->contiguous() : Tensor(), approx, &r.pre);
  return r;
}

}  // namespace dtensor
