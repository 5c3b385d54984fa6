// Collective test cases shared by the threads suite (test_comm_threads.cpp, ranks
// are threads under launch) and the MPI suite (tests/mpi, ranks are processes).
// Each case runs on every rank of a group and throws on the first wrong value;
// expected values are computed here from the per-rank inputs, in doubles, and
// rounded to the dtype the same way the library rounds (Avg: F32 then round).
#pragma once

#include <dtensor/comm_debug.h>
#include <dtensor/group.h>

#include "comm/block_all_to_all.h"  // internal: the strided exchange redistribution uses

#include <cmath>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace comm_cases {

using namespace dtensor;

// Gloo-style check: the expression and both values.
#define COMM_CHECK_EQ(a, b)                                                                  \
  do {                                                                                       \
    const auto& va = (a);                                                                    \
    const auto& vb = (b);                                                                    \
    if (!(va == vb)) {                                                                       \
      std::ostringstream os;                                                                 \
      os << __FILE__ << ":" << __LINE__ << ": " #a " == " #b " (" << ::comm_cases::str(va)   \
         << " vs " << ::comm_cases::str(vb) << ")";                                          \
      throw std::runtime_error(os.str());                                                    \
    }                                                                                        \
  } while (0)

template <class T>
std::string str(const T& v) {
  std::ostringstream os;
  if constexpr (requires { v.begin(); v.end(); } && !std::is_same_v<T, std::string>) {
    os << "[";
    int k = 0;
    for (const auto& x : v) os << (k++ ? ", " : "") << x;
    os << "]";
  } else {
    os << v;
  }
  return os.str();
}

inline const std::vector<DType> kAllDTypes = {DType::F32, DType::F64, DType::BF16,
                                              DType::F16, DType::I64, DType::I32};
inline const std::vector<ReduceOp> kAllOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max,
                                              ReduceOp::Min, ReduceOp::Product};

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

// A tensor of `dtype` whose element i is f(i) (small integers: exact in every dtype).
inline Tensor make(DType dtype, const Shape& shape, const std::function<double(int64_t)>& f) {
  return visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> v(static_cast<size_t>(shape_numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = from_double<T>(f(static_cast<int64_t>(i)));
    return Tensor::from_vector<T>(v, shape);
  });
}

inline std::vector<double> values(const Tensor& t) {
  return visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    std::vector<double> out;
    for (const auto& x : t.to_vector<T>()) out.push_back(to_double<T>(static_cast<T>(x)));
    return out;
  });
}

// What `dtype` stores for the exact value v.
inline double rounded(DType dtype, double v) {
  return visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    return to_double<T>(from_double<T>(v));
  });
}

// Input of rank r: small integers, different per rank and element; for Product
// only 1, 2 and -1 so that products of 8 ranks stay exact in BF16.
inline double input_value(int rank, int64_t i, ReduceOp op) {
  if (op == ReduceOp::Product) {
    const int k = static_cast<int>((rank * 5 + i * 3) % 4);
    return k == 0 ? 2 : (k == 3 ? -1 : 1);
  }
  return static_cast<double>((rank * 7 + i * 3) % 11) - 3;
}

inline double bool_input(int rank, int64_t i) { return ((rank + i) % 3) != 0 ? 1 : 0; }

// op over ranks 0..n-1 of input(r), rounded as the library rounds for `dtype`.
inline double expected_reduce(DType dtype, ReduceOp op, int n, const std::function<double(int)>& input) {
  double acc = input(0);
  for (int r = 1; r < n; ++r) {
    const double v = input(r);
    if (dtype == DType::Bool) {
      acc = (op == ReduceOp::Sum || op == ReduceOp::Max) ? (acc || v) : (acc && v);
      continue;
    }
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Product: acc *= v; break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg) {
    acc = dtype == DType::F64 ? acc / n : static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  }
  return rounded(dtype, acc);
}

// The per-rank sizes of uneven tests: some ranks hold nothing (as uneven shards do).
inline int64_t uneven_size(int rank) { return (rank * 2 + 1) % 4; }

#include "test_comm_cases_impl.h"  // the case_* functions
#include "test_comm_cases_aliasing.h"  // outputs overlapping inputs

// All of the above in order (what the MPI suite runs per test).
struct NamedCase {
  const char* name;
  void (*run)(const Group&);
};
inline const std::vector<NamedCase> kCases = {
    {"all_reduce", case_all_reduce},       {"all_reduce_large", case_all_reduce_large},
    {"all_gather", case_all_gather},       {"reduce_scatter", case_reduce_scatter},
    {"all_to_all", case_all_to_all},       {"broadcast", case_broadcast},
    {"gather_scatter", case_gather_scatter}, {"point_to_point", case_point_to_point},
    {"split", case_split},                 {"comm_debug", case_comm_debug},
    {"all_to_all_blocks", case_all_to_all_blocks}, {"overlapping_buffers", case_overlapping_buffers}};

}  // namespace comm_cases
