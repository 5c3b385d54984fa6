// The elementwise reduction kernel behind every backend's reducing collectives
// (src/comm/reduce.h): every dtype and op, 1..5 sources, 1..3 destinations, cached
// and streaming stores, destinations that alias sources, sizes that cross block
// boundaries and destinations that are not 16-byte aligned. Each result must equal,
// bit for bit, a plain loop that combines the sources in order in the accumulation
// type and rounds once.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/reduce.h"

namespace dtensor::comm {
namespace {

// std::vector<bool> packs bits; bools are kept one per byte (0 or 1, as bool is stored).
template <class T>
using Vec = std::vector<std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>>;

template <class T> struct AccOf { using type = T; };
template <> struct AccOf<bf16> { using type = float; };
template <> struct AccOf<f16> { using type = float; };

template <class T>
T value(int source, int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    return (i * 7 + source * 3) % 5 < 2;
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>((i * 13 + source * 7) % 9 - 3);  // small: products stay exact
  } else {
    return T(static_cast<float>(((i * 37 + source * 11) % 101) / 8.0 - 6.0));
  }
}

template <class T>
typename AccOf<T>::type combine(ReduceOp op, typename AccOf<T>::type a, typename AccOf<T>::type b) {
  if constexpr (std::is_same_v<T, bool>) {
    return (op == ReduceOp::Sum || op == ReduceOp::Max) ? (a || b) : (a && b);
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return a + b;
      case ReduceOp::Product: return a * b;
      case ReduceOp::Max: return b > a ? b : a;
      case ReduceOp::Min: return b < a ? b : a;
    }
    return a;
  }
}

template <class T>
Vec<T> reference(ReduceOp op, const std::vector<Vec<T>>& sources, int64_t count) {
  using A = typename AccOf<T>::type;
  Vec<T> out(count);
  for (int64_t i = 0; i < count; ++i) {
    auto at = [&](size_t k) { return static_cast<A>(T(sources[k][i])); };
    A acc = at(0);
    for (size_t k = 1; k < sources.size(); ++k) acc = combine<T>(op, acc, at(k));
    if constexpr (std::is_floating_point_v<A>) {
      if (op == ReduceOp::Avg) acc /= static_cast<A>(sources.size());
    }
    out[i] = static_cast<typename Vec<T>::value_type>(T(acc));
  }
  return out;
}

template <class T>
bool same_bits(const void* a, const Vec<T>& b, int64_t count) {
  return std::memcmp(a, b.data(), count * sizeof(T)) == 0;
}

// `alias`: -1 none; k >= 0: the first destination is source k (reduced in place).
template <class T>
void check(DType dtype, ReduceOp op, int n, int ndst, int64_t count, bool stream, int alias,
           int64_t misalign) {
  std::vector<Vec<T>> sources(n, Vec<T>(count));
  for (int k = 0; k < n; ++k) {
    for (int64_t i = 0; i < count; ++i) sources[k][i] = static_cast<typename Vec<T>::value_type>(value<T>(k, i));
  }
  const Vec<T> want = reference<T>(op, sources, count);
  std::vector<Vec<T>> storage(ndst, Vec<T>(count + misalign));
  std::vector<void*> dsts(ndst);
  for (int d = 0; d < ndst; ++d) dsts[d] = storage[d].data() + misalign;
  std::vector<Vec<T>> inputs = sources;  // the kernel may overwrite an aliased one
  std::vector<const void*> srcs(n);
  for (int k = 0; k < n; ++k) srcs[k] = inputs[k].data();
  if (alias >= 0) dsts[0] = inputs[alias].data();
  reduce_sources(dtype, op, dsts.data(), ndst, srcs.data(), n, count, stream);
  for (int d = 0; d < ndst; ++d) {
    EXPECT_TRUE(same_bits<T>(dsts[d], want, count))
        << dtype_name(dtype) << " " << reduce_op_name(op) << " n=" << n << " ndst=" << ndst
        << " count=" << count << " stream=" << stream << " alias=" << alias
        << " misalign=" << misalign << " destination " << d;
  }
}

template <class T>
void check_all(DType dtype) {
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product};
  if (std::is_same_v<T, bool>) ops = {ReduceOp::Sum, ReduceOp::Product};
  if (is_floating(dtype)) ops.push_back(ReduceOp::Avg);
  for (ReduceOp op : ops) {
    for (int n = 1; n <= 5; ++n) {
      for (int ndst = 1; ndst <= 3; ++ndst) {
        for (bool stream : {false, true}) {
          // 5000 crosses two 2048-element blocks and ends mid-block.
          check<T>(dtype, op, n, ndst, 5000, stream, -1, stream ? 1 : 0);
          check<T>(dtype, op, n, ndst, 3, stream, -1, 0);
          check<T>(dtype, op, n, ndst, 5000, stream, 0, 0);
          if (n >= 3) check<T>(dtype, op, n, ndst, 5000, stream, n - 1, 0);
        }
      }
    }
  }
}

TEST(CommReduceKernel, EveryDtypeOpSourceAndDestinationCount) {
  check_all<float>(DType::F32);
  check_all<double>(DType::F64);
  check_all<bf16>(DType::BF16);
  check_all<f16>(DType::F16);
  check_all<int32_t>(DType::I32);
  check_all<int64_t>(DType::I64);
  check_all<bool>(DType::Bool);
}

TEST(CommReduceKernel, SingleDestinationFormAndEmptyInput) {
  std::vector<float> a(100, 1.5f), b(100, 2.0f), out(100, 0.0f);
  const void* srcs[] = {a.data(), b.data()};
  reduce_sources(DType::F32, ReduceOp::Sum, out.data(), srcs, 2, 100);
  for (float v : out) ASSERT_EQ(v, 3.5f);
  void* dsts[] = {out.data()};
  reduce_sources(DType::F32, ReduceOp::Max, dsts, 1, srcs, 2, 0, true);  // nothing to do
  EXPECT_EQ(out[0], 3.5f);
}

}  // namespace
}  // namespace dtensor::comm
