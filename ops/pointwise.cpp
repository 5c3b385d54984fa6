// Pointwise ops on DistTensors: sharding rule (broadcast einsum), local kernel,
// backward.
//
// Rule: the output is sharded like the inputs along every non-broadcast dim.
// Partial: add/sub pass Partial(sum/avg) through when all inputs carry it; mul
// passes it through one input (the others replicated); div through the numerator;
// a scalar multiply or divide keeps any linear Partial. Everything else reduces a
// Partial input first.
#include <cmath>

#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {

using dispatch::PartialRule;
using ops::run_pointwise;
using ops::sum_to;
using ops::with_grad;
using Grads = std::vector<DistTensor>;

namespace {

// 0/1 in `dtype` where `condition` holds.
DistTensor mask(const DistTensor& condition, DType dtype) { return ops::cast(condition, dtype); }
DistTensor mask(BinaryOp compare, const DistTensor& a, double s, DType dtype) {
  return mask(binary(compare, a, s), dtype);
}
// 1 - x
DistTensor one_minus(const DistTensor& x) { return neg(sub(x, 1.0)); }

DistTensor dist_binary(BinaryOp op, const DistTensor& a, const DistTensor& b) {
  PartialRule rule = PartialRule::None;
  std::vector<bool> partial_inputs;
  if (op == BinaryOp::Add || op == BinaryOp::Sub) rule = PartialRule::AllSame;
  if (op == BinaryOp::Mul) rule = PartialRule::OneOf;
  if (op == BinaryOp::Div) {
    rule = PartialRule::OneOf;
    partial_inputs = {true, false};
  }
  return run_pointwise(op_name(op), {static_cast<int64_t>(op)}, {a, b}, rule, partial_inputs,
                       [op](const std::vector<Tensor>& l) { return binary(op, l[0], l[1]); });
}

Grads binary_backward(BinaryOp op, const DistTensor& g, const DistTensor& a, const DistTensor& b) {
  switch (op) {
    case BinaryOp::Add: return {sum_to(g, a.shape()), sum_to(g, b.shape())};
    case BinaryOp::Sub: return {sum_to(g, a.shape()), sum_to(neg(g), b.shape())};
    case BinaryOp::Mul: return {sum_to(mul(g, b), a.shape()), sum_to(mul(g, a), b.shape())};
    case BinaryOp::Div: return {sum_to(div(g, b), a.shape()), sum_to(neg(div(mul(g, a), mul(b, b))), b.shape())};
    case BinaryOp::Pow:
      return {sum_to(mul(g, mul(b, pow(a, sub(b, 1.0)))), a.shape()),
              sum_to(mul(g, mul(pow(a, b), log(a))), b.shape())};
    case BinaryOp::Maximum:
    case BinaryOp::Minimum: {
      // a's share: 1 where it wins, 1/2 on ties (as PyTorch), else 0.
      const DistTensor wins = mask(op == BinaryOp::Maximum ? gt(a, b) : lt(a, b), g.dtype());
      const DistTensor share = add(wins, mul(mask(eq(a, b), g.dtype()), 0.5));
      return {sum_to(mul(g, share), a.shape()), sum_to(mul(g, one_minus(share)), b.shape())};
    }
    default: return {DistTensor(), DistTensor()};  // comparisons: no gradient
  }
}

DistTensor unary_backward(UnaryOp op, const DistTensor& g, const DistTensor& a, const DistTensor& out) {
  const DType t = g.dtype();
  switch (op) {
    case UnaryOp::Neg: return neg(g);
    case UnaryOp::Abs: return mul(g, sub(mask(BinaryOp::Gt, a, 0, t), mask(BinaryOp::Lt, a, 0, t)));
    case UnaryOp::Exp: return mul(g, out);
    case UnaryOp::Log: return div(g, a);
    case UnaryOp::Sqrt: return div(mul(g, 0.5), out);
    case UnaryOp::Rsqrt: return mul(mul(g, -0.5), mul(out, mul(out, out)));
    case UnaryOp::Tanh: return mul(g, one_minus(mul(out, out)));
    case UnaryOp::Sigmoid: return mul(g, mul(out, one_minus(out)));
    case UnaryOp::Relu: return mul(g, mask(BinaryOp::Gt, a, 0, t));
    case UnaryOp::Square: return mul(g, mul(a, 2.0));
    case UnaryOp::Reciprocal: return neg(mul(g, mul(out, out)));
    case UnaryOp::GeluTanh: return ops::gelu_backward(g, a, GeluApprox::Tanh);
    case UnaryOp::GeluErf: return ops::gelu_backward(g, a, GeluApprox::None);
    case UnaryOp::Silu:
      return run_pointwise("silu_backward", {}, {g, a}, PartialRule::None, {},
                           [](const std::vector<Tensor>& l) { return silu_backward(l[0], l[1]); });
  }
  return DistTensor();
}

// Ops whose backward reads their output rather than their input.
bool backward_uses_output(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Tanh ||
         op == UnaryOp::Sigmoid || op == UnaryOp::Reciprocal;
}

// Scalar operations that keep a linear Partial: x * s and x / s.
bool keeps_partial(BinaryOp op) { return op == BinaryOp::Mul || op == BinaryOp::Div; }

}  // namespace

DistTensor unary(UnaryOp op, const DistTensor& a) {
  // neg is linear: -P(sum) is P(sum) of the negated parts.
  const PartialRule rule = op == UnaryOp::Neg ? PartialRule::OneOf : PartialRule::None;
  DistTensor out = run_pointwise(op_name(op), {static_cast<int64_t>(op)}, {a}, rule, {},
                                 [op](const std::vector<Tensor>& l) { return unary(op, l[0]); });
  if (!autograd::needs_grad({a})) return out;
  // Keep only what the backward reads: a saved tensor stays allocated until backward.
  const bool uses_output = backward_uses_output(op);
  const DistTensor saved_in = uses_output ? DistTensor() : a.detach();
  const DistTensor saved_out = uses_output ? out.detach() : DistTensor();
  return with_grad(out, op_name(op), {a}, [op, saved_in, saved_out](const Grads& g) {
    return Grads{unary_backward(op, g[0], saved_in, saved_out)};
  });
}

DistTensor binary(BinaryOp op, const DistTensor& a, const DistTensor& b) {
  DistTensor out = dist_binary(op, a, b);
  if (op >= BinaryOp::Eq || !autograd::needs_grad({a, b})) return out;
  if (op == BinaryOp::Add || op == BinaryOp::Sub) {
    // Their backward needs the shapes only; keeping the inputs would hold them (a
    // Linear's output before its bias, a residual branch) until backward.
    const Shape a_shape = a.shape(), b_shape = b.shape();
    return with_grad(out, op_name(op), {a, b}, [op, a_shape, b_shape](const Grads& g) {
      return Grads{sum_to(g[0], a_shape), sum_to(op == BinaryOp::Add ? g[0] : neg(g[0]), b_shape)};
    });
  }
  const DistTensor sa = a.detach(), sb = b.detach();
  return with_grad(out, op_name(op), {a, b},
                   [op, sa, sb](const Grads& g) { return binary_backward(op, g[0], sa, sb); });
}

DistTensor binary(BinaryOp op, const DistTensor& a, double scalar) {
  const PartialRule rule = keeps_partial(op) ? PartialRule::OneOf : PartialRule::None;
  // The strategy does not depend on the scalar's value, so it is not in the key.
  DistTensor out = run_pointwise(op_name(op), {static_cast<int64_t>(op), -1}, {a}, rule, {},
                                 [op, scalar](const std::vector<Tensor>& l) { return binary(op, l[0], scalar); });
  if (op >= BinaryOp::Eq || !autograd::needs_grad({a})) return out;
  // x + s, x - s, x * s, x / s need no saved input for their gradient.
  const bool needs_input = !(op == BinaryOp::Add || op == BinaryOp::Sub || op == BinaryOp::Mul || op == BinaryOp::Div);
  const DistTensor sa = needs_input ? a.detach() : DistTensor();
  return with_grad(out, op_name(op), {a}, [op, scalar, sa](const Grads& g) -> Grads {
    const DType t = g[0].dtype();
    switch (op) {
      case BinaryOp::Add:
      case BinaryOp::Sub: return {g[0]};
      case BinaryOp::Mul: return {mul(g[0], scalar)};
      case BinaryOp::Div: return {div(g[0], scalar)};
      case BinaryOp::Pow: return {mul(g[0], mul(pow(sa, scalar - 1.0), scalar))};
      case BinaryOp::Maximum:
      case BinaryOp::Minimum: {
        const BinaryOp wins = op == BinaryOp::Maximum ? BinaryOp::Gt : BinaryOp::Lt;
        return {mul(g[0], add(mask(wins, sa, scalar, t), mul(mask(BinaryOp::Eq, sa, scalar, t), 0.5)))};
      }
      default: return {DistTensor()};
    }
  });
}

DistTensor binary(BinaryOp op, const DistTensor& a, const Tensor& b) {
  return binary(op, a, implicit_replicate(b, a.mesh(), op_name(op)));
}
DistTensor binary(BinaryOp op, const Tensor& a, const DistTensor& b) {
  return binary(op, implicit_replicate(a, b.mesh(), op_name(op)), b);
}

DistTensor neg(const DistTensor& a) { return unary(UnaryOp::Neg, a); }
DistTensor ops::gelu_backward(const DistTensor& g, const DistTensor& a, GeluApprox approx) {
  return run_pointwise("gelu_backward", {static_cast<int64_t>(approx)}, {g, a}, PartialRule::None, {},
                       [approx](const std::vector<Tensor>& l) { return dtensor::gelu_backward(l[0], l[1], approx); });
}

DistTensor abs(const DistTensor& a) { return unary(UnaryOp::Abs, a); }
DistTensor exp(const DistTensor& a) { return unary(UnaryOp::Exp, a); }
DistTensor log(const DistTensor& a) { return unary(UnaryOp::Log, a); }
DistTensor sqrt(const DistTensor& a) { return unary(UnaryOp::Sqrt, a); }
DistTensor rsqrt(const DistTensor& a) { return unary(UnaryOp::Rsqrt, a); }
DistTensor tanh(const DistTensor& a) { return unary(UnaryOp::Tanh, a); }
DistTensor sigmoid(const DistTensor& a) { return unary(UnaryOp::Sigmoid, a); }
DistTensor relu(const DistTensor& a) { return unary(UnaryOp::Relu, a); }
DistTensor gelu(const DistTensor& a, GeluApprox approx) {
  return unary(approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, a);
}
DistTensor silu(const DistTensor& a) { return unary(UnaryOp::Silu, a); }
DistTensor square(const DistTensor& a) { return unary(UnaryOp::Square, a); }

DistTensor add(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Add, a, b); }
DistTensor sub(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Sub, a, b); }
DistTensor mul(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Mul, a, b); }
DistTensor div(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Div, a, b); }
DistTensor pow(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Pow, a, b); }
DistTensor maximum(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Maximum, a, b); }
DistTensor minimum(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Minimum, a, b); }
DistTensor eq(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Eq, a, b); }
DistTensor ne(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Ne, a, b); }
DistTensor lt(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Lt, a, b); }
DistTensor le(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Le, a, b); }
DistTensor gt(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Gt, a, b); }
DistTensor ge(const DistTensor& a, const DistTensor& b) { return binary(BinaryOp::Ge, a, b); }
DistTensor add(const DistTensor& a, double s) { return binary(BinaryOp::Add, a, s); }
DistTensor sub(const DistTensor& a, double s) { return binary(BinaryOp::Sub, a, s); }
DistTensor mul(const DistTensor& a, double s) { return binary(BinaryOp::Mul, a, s); }
DistTensor div(const DistTensor& a, double s) { return binary(BinaryOp::Div, a, s); }
DistTensor pow(const DistTensor& a, double s) { return binary(BinaryOp::Pow, a, s); }
DistTensor maximum(const DistTensor& a, double s) { return binary(BinaryOp::Maximum, a, s); }
DistTensor minimum(const DistTensor& a, double s) { return binary(BinaryOp::Minimum, a, s); }

DistTensor where(const DistTensor& cond, const DistTensor& a, const DistTensor& b) {
  DT_CHECK_ARG(cond.dtype() == DType::Bool, "where", "expected a bool condition, got ", dtype_name(cond.dtype()));
  DistTensor out = run_pointwise("where", {}, {cond, a, b}, PartialRule::None, {},
                                 [](const std::vector<Tensor>& l) { return where(l[0], l[1], l[2]); });
  if (!autograd::needs_grad({a, b})) return out;
  const DistTensor sc = cond.detach(), sa = a.detach(), sb = b.detach();
  return with_grad(out, "where", {cond, a, b}, [sc, sa, sb](const Grads& g) {
    const DistTensor picked = mask(sc, g[0].dtype());
    return Grads{DistTensor(), sum_to(mul(g[0], picked), sa.shape()), sum_to(mul(g[0], one_minus(picked)), sb.shape())};
  });
}

}  // namespace dtensor
