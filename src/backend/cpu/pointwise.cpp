// Pointwise kernels: unary ops, binary ops (arithmetic and comparisons), where.
//
// Every op is one lambda on the compute type (F32 for BF16/F16) handed to `map`,
// which picks the contiguous loop the compiler vectorises when it can. F32 and BF16
// rows with unit strides take the explicitly vectorised kernels of vec_kernels.h
// instead for the transcendental ops (exp, tanh, sigmoid, GELU, SiLU) and + - * /.
// Large tensors are cut into pieces for the rank's threads (parallel_pieces).
// Integer dtypes reach only the ops that keep integers integral (the frontend
// promotes the others to F32, see tensor_ops.h).
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/scalar_ops.h"

namespace dtensor::backend::cpu {
namespace {

// Elements per piece below which splitting over threads costs more than it saves.
constexpr int64_t kPointwiseGrain = int64_t{1} << 15;

template <class T>
inline constexpr bool has_vec_v = std::is_same_v<T, float> || std::is_same_v<T, bf16>;

std::optional<VecUnary> vec_unary_of(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp: return VecUnary::Exp;
    case UnaryOp::Tanh: return VecUnary::Tanh;
    case UnaryOp::Sigmoid: return VecUnary::Sigmoid;
    case UnaryOp::GeluTanh: return VecUnary::GeluTanh;
    case UnaryOp::GeluErf: return VecUnary::GeluErf;
    case UnaryOp::Silu: return VecUnary::Silu;
    default: return std::nullopt;
  }
}

std::optional<VecBinary> vec_binary_of(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return VecBinary::Add;
    case BinaryOp::Sub: return VecBinary::Sub;
    case BinaryOp::Mul: return VecBinary::Mul;
    case BinaryOp::Div: return VecBinary::Div;
    default: return std::nullopt;
  }
}

// out = op(in...) through vec_row(out_row, in_rows..., n), which takes contiguous
// rows; rows with other strides are gathered into contiguous buffers first, so a
// result does not depend on the operands' layout. Split over the rank's threads.
template <class Out, class... In, class VecRow, class... Ts>
void map_vec(VecRow vec_row, Tensor& out, const Ts&... in) {
  constexpr size_t N = 1 + sizeof...(In);
  parallel_pieces<N>({&out, &in...}, kPointwiseGrain, [&](std::array<Tensor, N>& piece) {
    Out* out_ptr = static_cast<Out*>(piece[0].data_ptr());
    const std::tuple<const In*...> in_ptrs = [&]<size_t... I>(std::index_sequence<I...>) {
      return std::tuple<const In*...>{static_cast<const In*>(piece[I + 1].data_ptr())...};
    }(std::index_sequence_for<In...>{});
    std::array<const int64_t*, N> strides;
    for (size_t k = 0; k < N; ++k) strides[k] = piece[k].strides().data();
    std::vector<Out> out_row;
    std::tuple<std::vector<In>...> in_rows;
    for_each_row<N>(piece[0].shape(), strides,
                    [&](const std::array<int64_t, N>& off, const std::array<int64_t, N>& st, int64_t n) {
                      bool unit = true;
                      for (size_t k = 0; k < N; ++k) unit = unit && (st[k] == 1 || n == 1);
                      [&]<size_t... I>(std::index_sequence<I...>) {
                        if (unit) {
                          vec_row(out_ptr + off[0], (std::get<I>(in_ptrs) + off[I + 1])..., n);
                          return;
                        }
                        out_row.resize(static_cast<size_t>(n));
                        (std::get<I>(in_rows).resize(static_cast<size_t>(n)), ...);
                        for (int64_t i = 0; i < n; ++i) {
                          ((std::get<I>(in_rows)[i] = std::get<I>(in_ptrs)[off[I + 1] + i * st[I + 1]]), ...);
                        }
                        vec_row(out_row.data(), std::get<I>(in_rows).data()..., n);
                        for (int64_t i = 0; i < n; ++i) out_ptr[off[0] + i * st[0]] = out_row[i];
                      }(std::index_sequence_for<In...>{});
                    });
  });
}

// True when every element of t is the same memory (a scalar expanded to a shape).
bool is_expanded_scalar(const Tensor& t) {
  for (int64_t s : t.strides()) {
    if (s != 0) return false;
  }
  return true;
}

}  // namespace

void unary(UnaryOp op, const Tensor& a, Tensor& out) {
  assert(a.dtype() == out.dtype());
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (has_vec_v<T>) {
      if (const auto vop = vec_unary_of(op)) {
        auto* kernel = vec().unary[vec_index(out.dtype())];
        map_vec<T, T>([&](T* o, const T* x, int64_t n) { kernel(*vop, x, o, n); }, out, a);
        return;
      }
    }
    auto run = [&](auto f) {
      parallel_pieces<2>({&out, &a}, kPointwiseGrain, [&](std::array<Tensor, 2>& p) { map<T, T>(f, p[0], p[1]); });
    };
    // The scalar math is scalar_ops.h, shared with the CUDA kernels.
    auto run_op = [&]<UnaryOp Op>() {
      if constexpr (scalar::unary_defined<C>(Op)) {
        run([](C x) { return scalar::unary<Op>(x); });
        return true;
      }
      return false;
    };
    bool done = false;
    switch (op) {
      case UnaryOp::Neg: done = run_op.template operator()<UnaryOp::Neg>(); break;
      case UnaryOp::Abs: done = run_op.template operator()<UnaryOp::Abs>(); break;
      case UnaryOp::Relu: done = run_op.template operator()<UnaryOp::Relu>(); break;
      case UnaryOp::Square: done = run_op.template operator()<UnaryOp::Square>(); break;
      case UnaryOp::Exp: done = run_op.template operator()<UnaryOp::Exp>(); break;
      case UnaryOp::Log: done = run_op.template operator()<UnaryOp::Log>(); break;
      case UnaryOp::Sqrt: done = run_op.template operator()<UnaryOp::Sqrt>(); break;
      case UnaryOp::Rsqrt: done = run_op.template operator()<UnaryOp::Rsqrt>(); break;
      case UnaryOp::Tanh: done = run_op.template operator()<UnaryOp::Tanh>(); break;
      case UnaryOp::Sigmoid: done = run_op.template operator()<UnaryOp::Sigmoid>(); break;
      case UnaryOp::GeluTanh: done = run_op.template operator()<UnaryOp::GeluTanh>(); break;
      case UnaryOp::GeluErf: done = run_op.template operator()<UnaryOp::GeluErf>(); break;
      case UnaryOp::Silu: done = run_op.template operator()<UnaryOp::Silu>(); break;
      case UnaryOp::Reciprocal: done = run_op.template operator()<UnaryOp::Reciprocal>(); break;
    }
    if (done) return;
    assert(false && "unary op not defined for an integer dtype");
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  assert(a.dtype() == b.dtype());
  if (out.numel() == 0) return;
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    // `a op scalar` is the common broadcast; giving it its own loop keeps that loop
    // contiguous (and vectorised) instead of strided with a zero stride.
    auto arith = [&](auto f) {
      assert(out.dtype() == a.dtype());
      const bool scalar_b = is_expanded_scalar(b);
      if constexpr (has_vec_v<T>) {
        if (const auto vop = vec_binary_of(op)) {
          auto* kernel = vec().binary[vec_index(out.dtype())];
          if (scalar_b) {
            const T* s = static_cast<const T*>(b.data_ptr());
            map_vec<T, T>([&](T* o, const T* x, int64_t n) { kernel(*vop, x, s, true, o, n); }, out, a);
          } else {
            map_vec<T, T, T>([&](T* o, const T* x, const T* y, int64_t n) { kernel(*vop, x, y, false, o, n); },
                             out, a, b);
          }
          return;
        }
      }
      if (scalar_b) {
        const C s = load(*static_cast<const T*>(b.data_ptr()));
        parallel_pieces<2>({&out, &a}, kPointwiseGrain, [&](std::array<Tensor, 2>& p) {
          map<T, T>([f, s](C x) { return f(x, s); }, p[0], p[1]);
        });
      } else {
        parallel_pieces<3>({&out, &a, &b}, kPointwiseGrain,
                           [&](std::array<Tensor, 3>& p) { map<T, T, T>(f, p[0], p[1], p[2]); });
      }
    };
    auto compare = [&](auto f) {
      assert(out.dtype() == DType::Bool);
      parallel_pieces<3>({&out, &a, &b}, kPointwiseGrain,
                         [&](std::array<Tensor, 3>& p) { map<bool, T, T>(f, p[0], p[1], p[2]); });
    };
    // The scalar math is scalar_ops.h, shared with the CUDA kernels.
    switch (op) {
      case BinaryOp::Add: return arith([](C x, C y) { return scalar::binary<BinaryOp::Add>(x, y); });
      case BinaryOp::Sub: return arith([](C x, C y) { return scalar::binary<BinaryOp::Sub>(x, y); });
      case BinaryOp::Mul: return arith([](C x, C y) { return scalar::binary<BinaryOp::Mul>(x, y); });
      case BinaryOp::Div: return arith([](C x, C y) { return scalar::binary<BinaryOp::Div>(x, y); });
      case BinaryOp::Pow: return arith([](C x, C y) { return scalar::binary<BinaryOp::Pow>(x, y); });
      case BinaryOp::Maximum: return arith([](C x, C y) { return scalar::binary<BinaryOp::Maximum>(x, y); });
      case BinaryOp::Minimum: return arith([](C x, C y) { return scalar::binary<BinaryOp::Minimum>(x, y); });
      case BinaryOp::Eq: return compare([](C x, C y) { return scalar::binary<BinaryOp::Eq>(x, y); });
      case BinaryOp::Ne: return compare([](C x, C y) { return scalar::binary<BinaryOp::Ne>(x, y); });
      case BinaryOp::Lt: return compare([](C x, C y) { return scalar::binary<BinaryOp::Lt>(x, y); });
      case BinaryOp::Le: return compare([](C x, C y) { return scalar::binary<BinaryOp::Le>(x, y); });
      case BinaryOp::Gt: return compare([](C x, C y) { return scalar::binary<BinaryOp::Gt>(x, y); });
      case BinaryOp::Ge: return compare([](C x, C y) { return scalar::binary<BinaryOp::Ge>(x, y); });
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
