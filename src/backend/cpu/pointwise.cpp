// Pointwise kernels: unary ops, binary ops (arithmetic and comparisons), where.
//
// Every op is one lambda on the compute type (F32 for BF16/F16) handed to `map`,
// which picks the contiguous loop the compiler vectorises when it can. Integer
// dtypes reach only the ops that keep integers integral (the frontend promotes the
// others to F32, see tensor_ops.h).
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/loops.h"

namespace dtensor::backend::cpu {
namespace {

// Integer power by squaring; a negative exponent truncates toward zero as the
// integer quotient 1/base^|e| does.
template <class C>
C integer_pow(C base, C exponent) {
  if constexpr (std::is_same_v<C, bool>) {
    return base || !exponent;
  } else {
    if (exponent < 0) return (base == 1) ? 1 : (base == -1) ? ((exponent & 1) ? -1 : 1) : 0;
    C result = 1;
    while (exponent > 0) {
      if (exponent & 1) result *= base;
      base *= base;
      exponent >>= 1;
    }
    return result;
  }
}

// True when every element of t is the same memory (a scalar expanded to a shape).
bool is_expanded_scalar(const Tensor& t) {
  for (int64_t s : t.strides()) {
    if (s != 0) return false;
  }
  return true;
}

template <class C>
C gelu_tanh(C x) {
  const C k = C(0.7978845608028654);  // sqrt(2/pi)
  return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
}

template <class C>
C gelu_erf(C x) {
  return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476)));
}

}  // namespace

void unary(UnaryOp op, const Tensor& a, Tensor& out) {
  assert(a.dtype() == out.dtype());
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    constexpr bool kFloat = is_float_v<T>;
    auto run = [&](auto f) { map<T, T>(f, out, a); };
    switch (op) {
      case UnaryOp::Neg: return run([](C x) { return C(-x); });
      case UnaryOp::Abs: return run([](C x) { return x < C(0) ? C(-x) : x; });
      case UnaryOp::Relu: return run([](C x) { return x < C(0) ? C(0) : x; });
      case UnaryOp::Square: return run([](C x) { return C(x * x); });
      case UnaryOp::Exp:
        if constexpr (kFloat) return run([](C x) { return std::exp(x); });
        break;
      case UnaryOp::Log:
        if constexpr (kFloat) return run([](C x) { return std::log(x); });
        break;
      case UnaryOp::Sqrt:
        if constexpr (kFloat) return run([](C x) { return std::sqrt(x); });
        break;
      case UnaryOp::Rsqrt:
        if constexpr (kFloat) return run([](C x) { return C(1) / std::sqrt(x); });
        break;
      case UnaryOp::Tanh:
        if constexpr (kFloat) return run([](C x) { return std::tanh(x); });
        break;
      case UnaryOp::Sigmoid:
        if constexpr (kFloat) return run([](C x) { return C(1) / (C(1) + std::exp(-x)); });
        break;
      case UnaryOp::GeluTanh:
        if constexpr (kFloat) return run([](C x) { return gelu_tanh(x); });
        break;
      case UnaryOp::GeluErf:
        if constexpr (kFloat) return run([](C x) { return gelu_erf(x); });
        break;
      case UnaryOp::Silu:
        if constexpr (kFloat) return run([](C x) { return x / (C(1) + std::exp(-x)); });
        break;
      case UnaryOp::Reciprocal:
        if constexpr (kFloat) return run([](C x) { return C(1) / x; });
        break;
    }
    assert(false && "unary op not defined for an integer dtype");
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  assert(a.dtype() == b.dtype());
  if (out.numel() == 0) return;
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    constexpr bool kFloat = is_float_v<T>;
    // `a op scalar` is the common broadcast; giving it its own loop keeps that loop
    // contiguous (and vectorised) instead of strided with a zero stride.
    auto arith = [&](auto f) {
      assert(out.dtype() == a.dtype());
      if (is_expanded_scalar(b)) {
        const C s = load(*static_cast<const T*>(b.data_ptr()));
        map<T, T>([f, s](C x) { return f(x, s); }, out, a);
      } else {
        map<T, T, T>(f, out, a, b);
      }
    };
    auto compare = [&](auto f) {
      assert(out.dtype() == DType::Bool);
      map<bool, T, T>(f, out, a, b);
    };
    switch (op) {
      case BinaryOp::Add: return arith([](C x, C y) { return C(x + y); });
      case BinaryOp::Sub: return arith([](C x, C y) { return C(x - y); });
      case BinaryOp::Mul: return arith([](C x, C y) { return C(x * y); });
      case BinaryOp::Div:
        if constexpr (kFloat) {
          return arith([](C x, C y) { return x / y; });
        } else {
          // The frontend promotes integer division to F32; never divide by zero here.
          return arith([](C x, C y) { return y == C(0) ? C(0) : C(x / y); });
        }
      case BinaryOp::Pow:
        if constexpr (kFloat) {
          return arith([](C x, C y) { return std::pow(x, y); });
        } else {
          return arith([](C x, C y) { return integer_pow(x, y); });
        }
      // NaN wins in maximum/minimum, as in torch.maximum.
      case BinaryOp::Maximum: return arith([](C x, C y) { return (x != x || x > y) ? x : y; });
      case BinaryOp::Minimum: return arith([](C x, C y) { return (x != x || x < y) ? x : y; });
      case BinaryOp::Eq: return compare([](C x, C y) { return x == y; });
      case BinaryOp::Ne: return compare([](C x, C y) { return x != y; });
      case BinaryOp::Lt: return compare([](C x, C y) { return x < y; });
      case BinaryOp::Le: return compare([](C x, C y) { return x <= y; });
      case BinaryOp::Gt: return compare([](C x, C y) { return x > y; });
      case BinaryOp::Ge: return compare([](C x, C y) { return x >= y; });
    }
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  assert(cond.dtype() == DType::Bool && a.dtype() == out.dtype() && b.dtype() == out.dtype());
  // Selection moves stored bits, so one loop per element size serves every dtype.
  auto run = [&](auto tag) {
    using U = decltype(tag);
    map<U, bool, U, U>([](bool c, U x, U y) { return c ? x : y; }, out, cond, a, b);
  };
  switch (dtype_size(out.dtype())) {
    case 1: return run(uint8_t{});
    case 2: return run(uint16_t{});
    case 4: return run(uint32_t{});
    default: return run(uint64_t{});
  }
}

}  // namespace dtensor::backend::cpu
