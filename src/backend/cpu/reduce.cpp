// Reductions: sum/mean/max/min over a set of dims, var, argmax.
//
// A reduction walks its input once in memory order (for_each_row orders dims by the
// input's strides) and accumulates into a buffer with the output's elements, seen
// through zero strides along the reduced dims. Float inputs accumulate in double,
// integers in int64, so F32 sums of millions of elements keep F32 accuracy and I32
// sums do not overflow. When a whole row folds into one accumulator, eight
// independent lanes keep the loop vectorisable (a single running sum is a serial
// dependency chain the compiler must not reorder).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/loops.h"
#include "backend/scalar_ops.h"

namespace dtensor::backend::cpu {
namespace {

template <class T>
using acc_t = std::conditional_t<is_float_v<T>, double, int64_t>;

// Strides (in a's shape) of a contiguous buffer holding one value per kept element:
// zero along the reduced dims.
Strides accumulator_strides(const Shape& shape, const std::vector<int64_t>& dims) {
  Strides strides(shape.size(), 0);
  int64_t step = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) continue;
    strides[d] = step;
    step *= shape[d];
  }
  return strides;
}

// acc[j] = combine(acc[j], value(x, j)) for every element x of `a`, where j is the
// kept-element index of x. `value(x, j)` turns the loaded element into Acc;
// `identity` is combine's neutral element.
template <class T, class Acc, class Value, class Combine>
void accumulate(const Tensor& a, const std::vector<int64_t>& dims, std::vector<Acc>& acc,
                Acc identity, Value value, Combine combine) {
  const Strides acc_strides = accumulator_strides(a.shape(), dims);
  const T* x = static_cast<const T*>(a.data_ptr());
  Acc* out = acc.data();
  for_each_row<2>(a.shape(), {a.strides().data(), acc_strides.data()},
                  [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st,
                      int64_t n) {
                    const T* xr = x + off[0];
                    Acc* o = out + off[1];
                    const int64_t sx = st[0], so = st[1];
                    if (so != 0) {
                      if (sx == 1 && so == 1) {
                        for (int64_t i = 0; i < n; ++i) o[i] = combine(o[i], value(xr[i], off[1] + i));
                      } else {
                        for (int64_t i = 0; i < n; ++i) {
                          o[i * so] = combine(o[i * so], value(xr[i * sx], off[1] + i * so));
                        }
                      }
                      return;
                    }
                    // The whole row folds into o[0].
                    constexpr int kLanes = 8;
                    Acc lanes[kLanes];
                    for (Acc& l : lanes) l = identity;
                    lanes[0] = o[0];
                    int64_t i = 0;
                    if (sx == 1) {
                      for (; i + kLanes <= n; i += kLanes) {
                        for (int j = 0; j < kLanes; ++j) {
                          lanes[j] = combine(lanes[j], value(xr[i + j], off[1]));
                        }
                      }
                    }
                    for (; i < n; ++i) lanes[0] = combine(lanes[0], value(xr[i * sx], off[1]));
                    Acc r = lanes[0];
                    for (int j = 1; j < kLanes; ++j) r = combine(r, lanes[j]);
                    o[0] = r;
                  });
}

template <class T, class Acc>
Acc identity_for(Kernels::Reduce op) {
  if (op == Kernels::Reduce::Max) {
    return std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity()
                                                  : std::numeric_limits<Acc>::lowest();
  }
  if (op == Kernels::Reduce::Min) {
    return std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity()
                                                  : std::numeric_limits<Acc>::max();
  }
  return Acc(0);
}

int64_t reduced_count(const Tensor& a, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= a.size(d);
  return n;
}

// out[j] = finish(acc[j]) converted to out's dtype (out contiguous).
template <class Acc, class Finish>
void write_out(const std::vector<Acc>& acc, Tensor& out, Finish finish) {
  assert(out.is_contiguous() && static_cast<int64_t>(acc.size()) == out.numel());
  visit_dtype(out.dtype(), [&](auto tag) {
    using O = decltype(tag);
    O* o = static_cast<O*>(out.data_ptr());
    for (size_t j = 0; j < acc.size(); ++j) o[j] = convert<O>(finish(acc[j]));
  });
}

}  // namespace

namespace {

// Sum or mean over the leading dims of a contiguous float tensor (a bias gradient:
// [rows, cols] -> [cols]): column blocks split over the rank's threads, each column
// summed in double in row order, so the result does not depend on the split.
bool reduce_leading(Kernels::Reduce op, const Tensor& a, const std::vector<int64_t>& dims, Tensor& out) {
  if ((op != Kernels::Reduce::Sum && op != Kernels::Reduce::Mean) || !a.is_contiguous() || !out.is_contiguous()) {
    return false;
  }
  if (a.dtype() != DType::F32 && a.dtype() != DType::BF16) return false;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != static_cast<int64_t>(i)) return false;
  }
  int64_t rows = 1;
  for (int64_t d : dims) rows *= a.size(d);
  const int64_t cols = a.numel() / std::max<int64_t>(rows, 1);
  if (rows < 2 || cols < 16) return false;
  const bool mean = op == Kernels::Reduce::Mean;
  visit_float_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
      const T* x = static_cast<const T*>(a.data_ptr());
      parallel_for(cols, std::max<int64_t>(64, (int64_t{1} << 15) / rows), [&](int64_t c0, int64_t c1) {
        std::vector<double> acc(static_cast<size_t>(c1 - c0), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          const T* row = x + r * cols + c0;
          for (int64_t j = 0; j < c1 - c0; ++j) acc[j] += static_cast<double>(load(row[j]));
        }
        visit_dtype(out.dtype(), [&](auto out_tag) {
          using O = decltype(out_tag);
          O* o = static_cast<O*>(out.data_ptr()) + c0;
          for (int64_t j = 0; j < c1 - c0; ++j) o[j] = convert<O>(mean ? acc[j] / static_cast<double>(rows) : acc[j]);
        });
      });
    }
  });
  return true;
}

}  // namespace

void reduce(Kernels::Reduce op, const Tensor& a, const std::vector<int64_t>& dims, Tensor& out) {
  if (reduce_leading(op, a, dims, out)) return;
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = acc_t<T>;
    const Acc identity = identity_for<T, Acc>(op);
    std::vector<Acc> acc(static_cast<size_t>(out.numel()), identity);
    auto as_acc = [](T x, int64_t) { return convert<Acc>(x); };
    switch (op) {
      case Kernels::Reduce::Sum:
      case Kernels::Reduce::Mean:
        accumulate<T>(a, dims, acc, identity, as_acc, [](Acc s, Acc v) { return s + v; });
        break;
      // NaN wins, as in torch.amax.
      case Kernels::Reduce::Max:
        accumulate<T>(a, dims, acc, identity, as_acc, [](Acc m, Acc v) { return scalar::reduce_max(m, v); });
        break;
      case Kernels::Reduce::Min:
        accumulate<T>(a, dims, acc, identity, as_acc, [](Acc m, Acc v) { return scalar::reduce_min(m, v); });
        break;
    }
    if (op == Kernels::Reduce::Mean) {
      const double n = static_cast<double>(reduced_count(a, dims));
      write_out(acc, out, [n](Acc s) { return static_cast<double>(s) / n; });
    } else {
      write_out(acc, out, [](Acc s) { return s; });
    }
  });
}

void var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, Tensor& out) {
  // Two passes (mean, then squared deviations) rather than sum of squares, which
  // cancels catastrophically when the mean is large against the spread.
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const size_t kept = static_cast<size_t>(out.numel());
    const double n = static_cast<double>(reduced_count(a, dims));
    std::vector<double> mean(kept, 0.0);
    auto plus = [](double s, double v) { return s + v; };
    accumulate<T>(a, dims, mean, 0.0, [](T x, int64_t) { return convert<double>(x); }, plus);
    for (double& m : mean) m /= n;
    std::vector<double> squares(kept, 0.0);
    accumulate<T>(
        a, dims, squares, 0.0,
        [&mean](T x, int64_t j) {
          const double d = convert<double>(x) - mean[static_cast<size_t>(j)];
          return d * d;
        },
        plus);
    write_out(squares, out, [n, correction](double s) { return scalar::variance_from_squares(s, n, correction); });
  });
}

void argmax(const Tensor& a, int64_t dim, Tensor& out) {
  assert(out.dtype() == DType::I64 && out.is_contiguous());
  // View out with a's shape (size 1 along dim) so both walk the same lines.
  Shape line_shape = a.shape();
  line_shape[dim] = 1;
  const Tensor out_lines = out.view(line_shape).expand(a.shape());
  const int64_t length = a.size(dim);
  int64_t* o = static_cast<int64_t*>(out.data_ptr());
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.data_ptr());
    for_each_line<2>({&out_lines, &a}, dim,
                     [&](const std::array<int64_t, 2>& at, const std::array<int64_t, 2>& step) {
                       const T* line = x + at[1];
                       // First maximum; a NaN counts as the maximum (torch.argmax), so
                       // the first NaN ends the scan.
                       int64_t best = 0;
                       auto best_value = load(line[0]);
                       for (int64_t k = 1; k < length && best_value == best_value; ++k) {
                         const auto v = load(line[k * step[1]]);
                         if (scalar::argmax_prefers(v, k, best_value, best)) {
                           best = k;
                           best_value = v;
                         }
                       }
                       o[at[0]] = best;
                     });
  });
}

}  // namespace dtensor::backend::cpu
