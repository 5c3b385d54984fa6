// Blocked reduction: a block of every source is combined in a small accumulator
// that stays in L1, then written once, so n sources cost one pass over memory
// instead of n read-modify-write passes over dst.
#include "comm/reduce.h"

#include <algorithm>
#include <bit>
#include <stdexcept>

#include "dtensor/error.h"

namespace dtensor::comm {
namespace {

// Inline BF16 conversions: the out-of-line ones in dtype.cpp cost a call per
// element, which halves the bandwidth of a BF16 all-reduce. Same rounding (RNE).
inline float load(bf16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16); }
inline void store(bf16& d, float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    d.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  d.bits = static_cast<uint16_t>(u >> 16);
}
inline float load(f16 v) { return static_cast<float>(v); }
inline void store(f16& d, float f) { d = f16(f); }
template <class T>
inline T load(T v) {
  return v;
}
template <class T, class A>
inline void store(T& d, A v) {
  d = static_cast<T>(v);
}

template <class T> struct Acc { using type = T; };
template <> struct Acc<bf16> { using type = float; };
template <> struct Acc<f16> { using type = float; };

struct Sum { template <class A> A operator()(A a, A b) const { return a + b; } };
struct Prod { template <class A> A operator()(A a, A b) const { return a * b; } };
struct Max { template <class A> A operator()(A a, A b) const { return b > a ? b : a; } };
struct Min { template <class A> A operator()(A a, A b) const { return b < a ? b : a; } };
struct Or { bool operator()(bool a, bool b) const { return a || b; } };
struct And { bool operator()(bool a, bool b) const { return a && b; } };

template <class T, class Combine>
void reduce_blocks(T* dst, const T* const* srcs, int n, int64_t count, Combine combine,
                   int64_t divisor) {
  using A = typename Acc<T>::type;
  constexpr int64_t kBlock = 1024;
  alignas(64) A acc[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = std::min(kBlock, count - base);
    const T* first = srcs[0] + base;
    for (int64_t j = 0; j < len; ++j) acc[j] = load(first[j]);
    for (int k = 1; k < n; ++k) {
      const T* src = srcs[k] + base;
      for (int64_t j = 0; j < len; ++j) acc[j] = combine(acc[j], static_cast<A>(load(src[j])));
    }
    T* out = dst + base;
    if (divisor > 1) {
      if constexpr (std::is_floating_point_v<A>) {
        for (int64_t j = 0; j < len; ++j) store(out[j], acc[j] / static_cast<A>(divisor));
      }
    } else {
      for (int64_t j = 0; j < len; ++j) store(out[j], acc[j]);
    }
  }
}

}  // namespace

void check_reduce_supported(DType dtype, ReduceOp op, const char* op_name) {
  DT_CHECK_ARG(op != ReduceOp::Avg || is_floating(dtype), op_name,
               "ReduceOp::Avg needs a floating dtype, got ", dtype_name(dtype));
}

void reduce_sources(DType dtype, ReduceOp op, void* dst, const void* const* srcs, int n,
                    int64_t count) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    auto* d = static_cast<T*>(dst);
    auto* s = reinterpret_cast<const T* const*>(srcs);
    if constexpr (std::is_same_v<T, bool>) {
      if (op == ReduceOp::Sum || op == ReduceOp::Max) {
        reduce_blocks(d, s, n, count, Or{}, 1);
      } else {
        reduce_blocks(d, s, n, count, And{}, 1);
      }
    } else {
      switch (op) {
        case ReduceOp::Sum: reduce_blocks(d, s, n, count, Sum{}, 1); break;
        case ReduceOp::Avg: reduce_blocks(d, s, n, count, Sum{}, n); break;
        case ReduceOp::Product: reduce_blocks(d, s, n, count, Prod{}, 1); break;
        case ReduceOp::Max: reduce_blocks(d, s, n, count, Max{}, 1); break;
        case ReduceOp::Min: reduce_blocks(d, s, n, count, Min{}, 1); break;
      }
    }
  });
}

void divide_by(DType dtype, void* data, int64_t count, int64_t divisor) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    using A = typename Acc<T>::type;
    if constexpr (std::is_floating_point_v<A>) {
      T* p = static_cast<T*>(data);
      for (int64_t i = 0; i < count; ++i) store(p[i], load(p[i]) / static_cast<A>(divisor));
    }
  });
}

}  // namespace dtensor::comm
