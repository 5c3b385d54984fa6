// Pointwise ops: broadcasting, dtype promotion, then the device's unary/binary/where
// kernels.
//
// Dtype rules (PyTorch's, with two simplifications):
// - Unary ops that keep integers integral (neg, abs, relu, square) keep I64/I32 and
//   reject Bool; the others (exp, log, sqrt, tanh, sigmoid, gelu, ...) compute integer
//   and Bool inputs in F32, as torch does for exp(int_tensor).
// - Binary ops compute in promote_types(a, b); div of integers is true division in
//   F32; arithmetic on two Bool tensors computes in I64.
// - A scalar keeps the tensor's dtype (bf16 * 0.5 stays bf16), except that an integer
//   tensor with a non-integral scalar (or any div) computes in F32, so x_int * 0.5
//   does not truncate the scalar to 0. The result dtype thus depends on the scalar's
//   value only for integer tensors.
// - Comparisons compute in the promoted dtype and give Bool.
#include <cmath>

#include "backend/kernels.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {
namespace {

bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

bool keeps_integers(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Square;
}

void check_defined(const Tensor& t, const char* op) {
  DT_CHECK_ARG(t.defined(), op, "expected a defined tensor, got an undefined one");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  DT_CHECK_ARG(a.device() == b.device(), op, "devices differ: ", a.device().to_string(), " and ",
               b.device().to_string());
}

// a op b with both already in `dtype` and broadcast to `shape`.
Tensor run_binary(BinaryOp op, const Tensor& a, const Tensor& b, DType dtype) {
  Tensor out = Tensor::empty(a.shape(), is_comparison(op) ? DType::Bool : dtype, a.device());
  backend::kernels_for(a.device()).binary(op, a, b, out);
  return out;
}

}  // namespace

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::GeluTanh: return "gelu_tanh";
    case UnaryOp::GeluErf: return "gelu";
    case UnaryOp::Silu: return "silu";
    case UnaryOp::Square: return "square";
    case UnaryOp::Reciprocal: return "reciprocal";
  }
  return "unary";
}

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
    case BinaryOp::Eq: return "eq";
    case BinaryOp::Ne: return "ne";
    case BinaryOp::Lt: return "lt";
    case BinaryOp::Le: return "le";
    case BinaryOp::Gt: return "gt";
    case BinaryOp::Ge: return "ge";
  }
  return "binary";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    // Right-aligned: i counts from the last dim.
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    DT_CHECK_ARG(da == db || da == 1 || db == 1, op, "shapes ", a, " and ", b,
                 " do not broadcast: dim ", static_cast<int64_t>(n - 1 - i), " (from the right: ",
                 i, ") is ", da, " vs ", db);
    out[n - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

Tensor unary(UnaryOp op, const Tensor& a) {
  const char* name = op_name(op);
  check_defined(a, name);
  DType dtype = a.dtype();
  if (is_integral(dtype)) {
    if (keeps_integers(op)) {
      DT_CHECK_ARG(dtype != DType::Bool, name, "expected a numeric dtype, got bool");
    } else {
      dtype = DType::F32;
    }
  }
  const Tensor input = a.to(dtype);
  Tensor out = Tensor::empty(a.shape(), dtype, a.device());
  backend::kernels_for(a.device()).unary(op, input, out);
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  check_defined(a, name);
  check_defined(b, name);
  check_same_device(a, b, name);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType dtype = promote_types(a.dtype(), b.dtype());
  if (op == BinaryOp::Div && is_integral(dtype)) dtype = DType::F32;
  if (dtype == DType::Bool && !is_comparison(op)) dtype = DType::I64;
  return run_binary(op, a.to(dtype).expand(shape), b.to(dtype).expand(shape), dtype);
}

Tensor binary(BinaryOp op, const Tensor& a, double scalar) {
  const char* name = op_name(op);
  check_defined(a, name);
  DType dtype = a.dtype();
  if (is_integral(dtype)) {
    if (op == BinaryOp::Div || !std::isfinite(scalar) || scalar != std::trunc(scalar)) {
      dtype = DType::F32;
    } else if (dtype == DType::Bool && !is_comparison(op)) {
      dtype = DType::I64;
    }
  }
  const Tensor s = Tensor::full({}, scalar, dtype, a.device()).expand(a.shape());
  return run_binary(op, a.to(dtype), s, dtype);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where");
  check_defined(a, "where");
  check_defined(b, "where");
  check_same_device(cond, a, "where");
  check_same_device(a, b, "where");
  DT_CHECK_ARG(cond.dtype() == DType::Bool, "where", "expected a bool condition, got ",
               dtype_name(cond.dtype()));
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  const DType dtype = promote_types(a.dtype(), b.dtype());
  Tensor out = Tensor::empty(shape, dtype, a.device());
  backend::kernels_for(a.device())
      .where(cond.expand(shape), a.to(dtype).expand(shape), b.to(dtype).expand(shape), out);
  return out;
}

Tensor neg(const Tensor& a) { return unary(UnaryOp::Neg, a); }
Tensor abs(const Tensor& a) { return unary(UnaryOp::Abs, a); }
Tensor exp(const Tensor& a) { return unary(UnaryOp::Exp, a); }
Tensor log(const Tensor& a) { return unary(UnaryOp::Log, a); }
Tensor sqrt(const Tensor& a) { return unary(UnaryOp::Sqrt, a); }
Tensor rsqrt(const Tensor& a) { return unary(UnaryOp::Rsqrt, a); }
Tensor tanh(const Tensor& a) { return unary(UnaryOp::Tanh, a); }
Tensor sigmoid(const Tensor& a) { return unary(UnaryOp::Sigmoid, a); }
Tensor relu(const Tensor& a) { return unary(UnaryOp::Relu, a); }
Tensor gelu(const Tensor& a, GeluApprox approx) {
  return unary(approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, a);
}
Tensor silu(const Tensor& a) { return unary(UnaryOp::Silu, a); }
Tensor square(const Tensor& a) { return unary(UnaryOp::Square, a); }

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Pow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Minimum, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::Ge, a, b); }
Tensor add(const Tensor& a, double s) { return binary(BinaryOp::Add, a, s); }
Tensor sub(const Tensor& a, double s) { return binary(BinaryOp::Sub, a, s); }
Tensor mul(const Tensor& a, double s) { return binary(BinaryOp::Mul, a, s); }
Tensor div(const Tensor& a, double s) { return binary(BinaryOp::Div, a, s); }
Tensor pow(const Tensor& a, double s) { return binary(BinaryOp::Pow, a, s); }
Tensor maximum(const Tensor& a, double s) { return binary(BinaryOp::Maximum, a, s); }
Tensor minimum(const Tensor& a, double s) { return binary(BinaryOp::Minimum, a, s); }

}  // namespace dtensor
