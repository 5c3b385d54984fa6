// Neural-network kernels: softmax and log_softmax (+ backward) along any dim,
// layer_norm / rms_norm (+ backward), gelu/silu backward, embedding lookup and its
// scatter-add backward, cross-entropy (+ backward).
//
// Numerics: softmax subtracts the line maximum before exp; sums accumulate in double;
// BF16/F16 compute in F32 and round once on store. F32 and BF16 data in the common
// layouts (softmax along a contiguous last dim, norms, activations, cross-entropy
// rows) run the vectorised row kernels of vec_kernels.h (their row sums in double
// lanes too) split over the rank's threads; everything else takes the scalar loops
// below.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/index_check.h"
#include "backend/row_ops.h"
#include "backend/scalar_ops.h"
#include "util/check.h"

namespace dtensor::backend::cpu {
namespace {

// F32 or BF16: the dtypes of the vectorised kernels.
bool vectorised(DType t) { return t == DType::F32 || t == DType::BF16; }

// Rows per task so that each task has about this many elements.
constexpr int64_t kRowGrainElements = int64_t{1} << 14;
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kRowGrainElements / std::max<int64_t>(cols, 1)); }

const char* byte_ptr(const Tensor& t) { return static_cast<const char*>(t.data_ptr()); }
char* byte_ptr(Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Sum of term(i) for i in [0, n) in double, in eight lanes so the loop vectorises.
template <class Term>
double sum_of(int64_t n, Term term) {
  constexpr int kLanes = 8;
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += static_cast<double>(term(i + j));
  }
  for (; i < n; ++i) lanes[0] += static_cast<double>(term(i));
  return std::accumulate(lanes, lanes + kLanes, 0.0);
}

// Largest of value(i) for i in [0, n); NaN wins so it reaches the output.
template <class C, class Value>
C max_of(int64_t n, Value value) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    m = scalar::reduce_max(m, static_cast<C>(value(i)));
  }
  return m;
}

// The values of an integer index tensor (I64/I32, any strides), row-major.
std::vector<int64_t> read_indices(const Tensor& ids) {
  std::vector<int64_t> values(static_cast<size_t>(ids.numel()));
  visit_dtype(ids.dtype(), [&](auto tag) {
    using I = decltype(tag);
    if constexpr (std::is_same_v<I, int64_t> || std::is_same_v<I, int32_t>) {
      const I* p = static_cast<const I*>(ids.data_ptr());
      const Strides out_strides = contiguous_strides(ids.shape());
      for_each_row<2>(ids.shape(), {out_strides.data(), ids.strides().data()},
                      [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st,
                          int64_t n) {
                        for (int64_t i = 0; i < n; ++i) {
                          values[static_cast<size_t>(off[0] + i * st[0])] = p[off[1] + i * st[1]];
                        }
                      });
    } else {
      assert(false && "index tensors are I64 or I32");
    }
  });
  return values;
}

// Writes values (row-major) into a contiguous tensor of any dtype.
void write_values(const std::vector<double>& values, Tensor& out) {
  assert(out.is_contiguous() && static_cast<int64_t>(values.size()) == out.numel());
  visit_dtype(out.dtype(), [&](auto tag) {
    using O = decltype(tag);
    O* o = static_cast<O*>(out.data_ptr());
    for (size_t i = 0; i < values.size(); ++i) o[i] = convert<O>(values[i]);
  });
}

std::vector<double> read_values(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<double> values(static_cast<size_t>(c.numel()));
  visit_dtype(c.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(c.data_ptr());
    for (size_t i = 0; i < values.size(); ++i) values[i] = convert<double>(p[i]);
  });
  return values;
}

}  // namespace

// ---- softmax ------------------------------------------------------------------------

void softmax(const Tensor& a, int64_t dim, bool log, Tensor& out) {
  assert(a.dtype() == out.dtype() && a.shape() == out.shape());
  const int64_t length = a.size(dim);
  if (vectorised(a.dtype()) && dim == a.dim() - 1 && a.is_contiguous() && out.is_contiguous() && length > 0) {
    const int64_t rows = a.numel() / length;
    const size_t row_bytes = static_cast<size_t>(length) * dtype_size(a.dtype());
    auto* kernel = vec().softmax_rows[vec_index(a.dtype())];
    parallel_for(rows, row_grain(length), [&](int64_t r0, int64_t r1) {
      kernel(byte_ptr(a) + r0 * row_bytes, byte_ptr(out) + r0 * row_bytes, r1 - r0, length, log);
    });
    return;
  }
  visit_float_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* x = static_cast<const T*>(a.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    std::vector<C> shifted(static_cast<size_t>(length));
    for_each_line<2>({&out, &a}, dim,
                     [&](const std::array<int64_t, 2>& at, const std::array<int64_t, 2>& step) {
                       const T* xl = x + at[1];
                       T* yl = y + at[0];
                       const int64_t sx = step[1], sy = step[0];
                       const C m = max_of<C>(length, [&](int64_t i) { return load(xl[i * sx]); });
                       for (int64_t i = 0; i < length; ++i) shifted[i] = row::shifted_exp(load(xl[i * sx]), m);
                       const double total = sum_of(length, [&](int64_t i) { return shifted[i]; });
                       if (log) {
                         const C log_total = row::log_softmax_shift<C>(total);
                         for (int64_t i = 0; i < length; ++i) {
                           yl[i * sy] = convert<T>(row::log_softmax_value(load(xl[i * sx]), m, log_total));
                         }
                       } else {
                         const C scale = row::softmax_scale<C>(total);
                         for (int64_t i = 0; i < length; ++i) {
                           yl[i * sy] = convert<T>(row::softmax_value(shifted[i], scale));
                         }
                       }
                     });
  });
}

void softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim, bool log,
                      Tensor& grad_in) {
  const int64_t length = out.size(dim);
  if (vectorised(out.dtype()) && dim == out.dim() - 1 && out.is_contiguous() && grad_out.is_contiguous() &&
      grad_in.is_contiguous() && length > 0) {
    const int64_t rows = out.numel() / length;
    const size_t row_bytes = static_cast<size_t>(length) * dtype_size(out.dtype());
    auto* kernel = vec().softmax_backward_rows[vec_index(out.dtype())];
    parallel_for(rows, row_grain(length), [&](int64_t r0, int64_t r1) {
      kernel(byte_ptr(grad_out) + r0 * row_bytes, byte_ptr(out) + r0 * row_bytes, byte_ptr(grad_in) + r0 * row_bytes,
             r1 - r0, length, log);
    });
    return;
  }
  visit_float_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* g = static_cast<const T*>(grad_out.data_ptr());
    const T* y = static_cast<const T*>(out.data_ptr());
    T* gi = static_cast<T*>(grad_in.data_ptr());
    for_each_line<3>(
        {&grad_in, &grad_out, &out}, dim,
        [&](const std::array<int64_t, 3>& at, const std::array<int64_t, 3>& step) {
          T* gil = gi + at[0];
          const T* gl = g + at[1];
          const T* yl = y + at[2];
          const int64_t si = step[0], sg = step[1], sy = step[2];
          if (log) {
            // y = log p: dx = g - p * sum(g).
            const C total = static_cast<C>(sum_of(length, [&](int64_t i) { return load(gl[i * sg]); }));
            for (int64_t i = 0; i < length; ++i) {
              gil[i * si] = convert<T>(row::log_softmax_grad(load(gl[i * sg]), load(yl[i * sy]), total));
            }
          } else {
            // y = p: dx = p * (g - <g, p>).
            const C dot = static_cast<C>(
                sum_of(length, [&](int64_t i) { return load(gl[i * sg]) * load(yl[i * sy]); }));
            for (int64_t i = 0; i < length; ++i) {
              gil[i * si] = convert<T>(row::softmax_grad(load(gl[i * sg]), load(yl[i * sy]), dot));
            }
          }
        });
  });
}

// ---- layer_norm / rms_norm ----------------------------------------------------------
// One forward and one backward serve both: rms_norm is layer_norm without centring
// and without bias (mean fixed at 0, variance replaced by the mean square).
namespace {

void norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  bool centered, Tensor& out, Tensor* mean, Tensor& rstd) {
  const int64_t rows = x.size(0), cols = x.size(1);
  assert(x.is_contiguous() && out.is_contiguous());
  if (vectorised(x.dtype()) && cols > 0) {
    auto* kernel = vec().norm_rows[vec_index(x.dtype())];
    const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(x.dtype());
    float* mean_p = mean ? static_cast<float*>(mean->data_ptr()) : nullptr;
    float* rstd_p = static_cast<float*>(rstd.data_ptr());
    const void* w = weight.defined() ? weight.data_ptr() : nullptr;
    const void* b = bias.defined() ? bias.data_ptr() : nullptr;
    parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
      const NormRowsArgs args{r1 - r0, cols, eps, centered};
      kernel(args, byte_ptr(x) + r0 * row_bytes, w, b, byte_ptr(out) + r0 * row_bytes,
             mean_p ? mean_p + r0 : nullptr, rstd_p + r0);
    });
    return;
  }
  visit_float_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    const T* w = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
    const T* b = bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr;
    C* mean_p = mean ? static_cast<C*>(mean->data_ptr()) : nullptr;
    C* rstd_p = static_cast<C*>(rstd.data_ptr());
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = xp + r * cols;
      T* yr = yp + r * cols;
      const double mu = centered ? row::norm_mean(sum_of(cols, [&](int64_t i) { return load(xr[i]); }), cols) : 0.0;
      const double spread =
          sum_of(cols, [&](int64_t i) { return row::norm_deviation_sq(static_cast<double>(load(xr[i])), mu); });
      const C inv = row::norm_rstd<C>(spread, cols, eps);
      const C m = static_cast<C>(mu);
      for (int64_t i = 0; i < cols; ++i) {
        const C wi = w ? load(w[i]) : C(0), bi = b ? load(b[i]) : C(0);
        yr[i] = convert<T>(row::norm_value(load(xr[i]), m, inv, w ? &wi : nullptr, b ? &bi : nullptr));
      }
      if (mean_p) mean_p[r] = m;
      rstd_p[r] = inv;
    }
  });
}

// The weight and bias gradients are sums over rows: each task sums its own rows
// into its own F32 partials, and the partials are added in task order, so the
// result does not depend on which thread ran which task.
void norm_backward_vectorised(const Tensor& grad_out, const Tensor& x, const Tensor* mean, const Tensor& rstd,
                              const Tensor& weight, Tensor& grad_in, Tensor& grad_weight, Tensor* grad_bias) {
  const int64_t rows = x.size(0), cols = x.size(1);
  auto* kernel = vec().norm_backward_rows[vec_index(x.dtype())];
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(x.dtype());
  const float* mean_p = mean ? static_cast<const float*>(mean->data_ptr()) : nullptr;
  const float* rstd_p = static_cast<const float*>(rstd.data_ptr());
  const void* w = weight.defined() ? weight.data_ptr() : nullptr;
  const bool want_weight = grad_weight.defined(), want_bias = grad_bias && grad_bias->defined();
  const int64_t grain = row_grain(cols);
  const int chunks = parallel_chunks(rows, grain);
  std::vector<float> partial_w(want_weight ? static_cast<size_t>(chunks * cols) : 0, 0.0f);
  std::vector<float> partial_b(want_bias ? static_cast<size_t>(chunks * cols) : 0, 0.0f);
  parallel_chunks_for(rows, grain, [&](int c, int64_t r0, int64_t r1) {
    const NormRowsArgs args{r1 - r0, cols, 0.0, mean != nullptr};
    kernel(args, byte_ptr(grad_out) + r0 * row_bytes, byte_ptr(x) + r0 * row_bytes, mean_p ? mean_p + r0 : nullptr,
           rstd_p + r0, w, byte_ptr(grad_in) + r0 * row_bytes, want_weight ? partial_w.data() + c * cols : nullptr,
           want_bias ? partial_b.data() + c * cols : nullptr);
  });
  auto finish = [&](const std::vector<float>& partial, Tensor& out) {
    std::vector<double> total(static_cast<size_t>(cols), 0.0);
    for (int c = 0; c < chunks; ++c) {
      for (int64_t i = 0; i < cols; ++i) total[i] += partial[static_cast<size_t>(c * cols + i)];
    }
    write_values(total, out);
  };
  if (want_weight) finish(partial_w, grad_weight);
  if (want_bias) finish(partial_b, *grad_bias);
}

void norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor* mean, const Tensor& rstd,
                   const Tensor& weight, Tensor& grad_in, Tensor& grad_weight, Tensor* grad_bias) {
  const int64_t rows = x.size(0), cols = x.size(1);
  assert(x.is_contiguous() && grad_out.is_contiguous() && grad_in.is_contiguous());
  if (vectorised(x.dtype()) && cols > 0) {
    return norm_backward_vectorised(grad_out, x, mean, rstd, weight, grad_in, grad_weight, grad_bias);
  }
  visit_float_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gp = static_cast<const T*>(grad_out.data_ptr());
    T* gip = static_cast<T*>(grad_in.data_ptr());
    const T* w = weight.defined() ? static_cast<const T*>(weight.data_ptr()) : nullptr;
    const C* mean_p = mean ? static_cast<const C*>(mean->data_ptr()) : nullptr;
    const C* rstd_p = static_cast<const C*>(rstd.data_ptr());
    const bool want_weight = grad_weight.defined();
    const bool want_bias = grad_bias && grad_bias->defined();
    std::vector<double> gw(want_weight ? cols : 0, 0.0), gb(want_bias ? cols : 0, 0.0);
    std::vector<C> xhat(static_cast<size_t>(cols)), ghat(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = xp + r * cols;
      const T* gr = gp + r * cols;
      const C m = mean_p ? mean_p[r] : C(0), inv = rstd_p[r];
      for (int64_t i = 0; i < cols; ++i) {
        xhat[i] = row::norm_xhat(load(xr[i]), m, inv);
        ghat[i] = w ? load(gr[i]) * load(w[i]) : load(gr[i]);
      }
      // dx = inv * (ghat - mean(ghat) - xhat * mean(ghat * xhat)); the mean(ghat)
      // term comes from centring and is absent for rms_norm.
      const C mean_g = mean_p ? static_cast<C>(sum_of(cols, [&](int64_t i) { return ghat[i]; }) / cols)
                              : C(0);
      const C mean_gx =
          static_cast<C>(sum_of(cols, [&](int64_t i) { return ghat[i] * xhat[i]; }) / cols);
      T* gir = gip + r * cols;
      for (int64_t i = 0; i < cols; ++i) gir[i] = convert<T>(row::norm_grad(inv, ghat[i], mean_g, xhat[i], mean_gx));
      if (want_weight) {
        for (int64_t i = 0; i < cols; ++i) gw[i] += static_cast<double>(load(gr[i]) * xhat[i]);
      }
      if (want_bias) {
        for (int64_t i = 0; i < cols; ++i) gb[i] += static_cast<double>(load(gr[i]));
      }
    }
    if (want_weight) write_values(gw, grad_weight);
    if (want_bias) write_values(gb, *grad_bias);
  });
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& out,
                Tensor& mean, Tensor& rstd) {
  norm_forward(x, weight, bias, eps, /*centered=*/true, out, &mean, rstd);
}

void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                         const Tensor& rstd, const Tensor& weight, Tensor& grad_in,
                         Tensor& grad_weight, Tensor& grad_bias) {
  norm_backward(grad_out, x, &mean, rstd, weight, grad_in, grad_weight, &grad_bias);
}

void rms_norm(const Tensor& x, const Tensor& weight, double eps, Tensor& out, Tensor& rstd) {
  norm_forward(x, weight, Tensor(), eps, /*centered=*/false, out, nullptr, rstd);
}

void rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& rstd,
                       const Tensor& weight, Tensor& grad_in, Tensor& grad_weight) {
  norm_backward(grad_out, x, nullptr, rstd, weight, grad_in, grad_weight, nullptr);
}

// ---- activations' backward ------------------------------------------------------------

namespace {

// grad_in = grad_out * f'(x) through the vector kernel, for contiguous F32/BF16.
bool activation_backward_vectorised(VecUnary op, const Tensor& grad_out, const Tensor& x, Tensor& grad_in) {
  if (!vectorised(x.dtype()) || !x.is_contiguous() || !grad_out.is_contiguous() || !grad_in.is_contiguous()) {
    return false;
  }
  auto* kernel = vec().activation_backward[vec_index(x.dtype())];
  const size_t item = dtype_size(x.dtype());
  parallel_for(x.numel(), kRowGrainElements * 2, [&](int64_t i0, int64_t i1) {
    kernel(op, byte_ptr(grad_out) + i0 * item, byte_ptr(x) + i0 * item, byte_ptr(grad_in) + i0 * item, i1 - i0);
  });
  return true;
}

}  // namespace

void gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApprox approx, Tensor& grad_in) {
  const VecUnary op = approx == GeluApprox::Tanh ? VecUnary::GeluTanh : VecUnary::GeluErf;
  if (activation_backward_vectorised(op, grad_out, x, grad_in)) return;
  visit_float_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if (approx == GeluApprox::Tanh) {
      map<T, T, T>([](C g, C v) { return scalar::gelu_tanh_backward(g, v); }, grad_in, grad_out, x);
    } else {
      map<T, T, T>([](C g, C v) { return scalar::gelu_erf_backward(g, v); }, grad_in, grad_out, x);
    }
  });
}

void silu_backward(const Tensor& grad_out, const Tensor& x, Tensor& grad_in) {
  if (activation_backward_vectorised(VecUnary::Silu, grad_out, x, grad_in)) return;
  visit_float_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    map<T, T, T>([](C g, C v) { return scalar::silu_backward(g, v); }, grad_in, grad_out, x);
  });
}

// ---- embedding ------------------------------------------------------------------------

void embedding(const Tensor& table, const Tensor& ids, bool masked, Tensor& out) {
  const std::vector<int64_t> index = read_indices(ids);
  const int64_t rows = table.size(0), width = table.size(1);
  // Rows are copied as bytes; a column-strided table (rare) is made row-contiguous once.
  const Tensor t = table.stride(1) == 1 ? table : table.contiguous();
  const size_t item = dtype_size(t.dtype());
  const char* src = static_cast<const char*>(t.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const size_t row_bytes = static_cast<size_t>(width) * item;
  for (size_t n = 0; n < index.size(); ++n) {
    const int64_t id = index[n];
    char* o = dst + n * row_bytes;
    if (masked && (id < 0 || id >= rows)) {
      if (row_bytes > 0) std::memset(o, 0, row_bytes);  // zero bits are +0 in every dtype
      continue;
    }
    check_index(id, rows, n, "embedding", "id");
    // An empty table (width 0) may have no storage at all: nothing to copy from it.
    if (row_bytes > 0) std::memcpy(o, src + static_cast<size_t>(id * t.stride(0)) * item, row_bytes);
  }
}

void embedding_backward(const Tensor& grad_out, const Tensor& ids, bool masked, Tensor& grad_table) {
  const std::vector<int64_t> index = read_indices(ids);
  const int64_t rows = grad_table.size(0), width = grad_table.size(1);
  // Group positions by id (stable, so each row sums in position order) and add each
  // group once: repeated ids sum in double, not by repeated rounding into BF16.
  std::vector<size_t> order;
  order.reserve(index.size());
  for (size_t n = 0; n < index.size(); ++n) {
    if (masked && (index[n] < 0 || index[n] >= rows)) continue;
    check_index(index[n], rows, n, "embedding_backward", "id");
    order.push_back(n);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return index[a] < index[b]; });
  visit_float_dtype(grad_table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(grad_out.data_ptr());
    T* gt = static_cast<T*>(grad_table.data_ptr());
    const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1);
    const int64_t ts0 = grad_table.stride(0), ts1 = grad_table.stride(1);
    std::vector<double> acc(static_cast<size_t>(width));
    for (size_t begin = 0; begin < order.size();) {
      const int64_t id = index[order[begin]];
      std::fill(acc.begin(), acc.end(), 0.0);
      size_t end = begin;
      for (; end < order.size() && index[order[end]] == id; ++end) {
        const T* row = g + static_cast<int64_t>(order[end]) * gs0;
        for (int64_t d = 0; d < width; ++d) acc[d] += convert<double>(row[d * gs1]);
      }
      T* dst = gt + id * ts0;
      for (int64_t d = 0; d < width; ++d) dst[d * ts1] = convert<T>(convert<double>(dst[d * ts1]) + acc[d]);
      begin = end;
    }
  });
}

// ---- cross-entropy --------------------------------------------------------------------
namespace {

// Calls row_fn(n, target, line, step, m, lse) for each non-ignored row, where line
// is the row's logits and lse = log(sum(exp(x - m))) with m the row maximum.
template <class T, class RowFn>
void for_each_scored_row(const Tensor& logits, const std::vector<int64_t>& targets,
                         int64_t ignore_index, const char* op, RowFn&& row_fn) {
  using C = compute_t<T>;
  const int64_t classes = logits.size(1);
  const T* x = static_cast<const T*>(logits.data_ptr());
  const int64_t s0 = logits.stride(0), s1 = logits.stride(1);
  for (size_t n = 0; n < targets.size(); ++n) {
    const int64_t target = targets[n];
    if (target == ignore_index) continue;
    check_index(target, classes, n, op, "target");
    const T* line = x + static_cast<int64_t>(n) * s0;
    const C m = max_of<C>(classes, [&](int64_t c) { return load(line[c * s1]); });
    const double total = sum_of(classes, [&](int64_t c) { return row::shifted_exp(load(line[c * s1]), m); });
    row_fn(n, target, line, s1, m, row::log_softmax_shift<C>(total));
  }
}

// F32 logits with contiguous rows: each row's (log-)softmax by the vector kernel,
// rows split over the rank's threads. Targets are checked first, on the caller.
bool vectorised_rows(const Tensor& logits) { return logits.dtype() == DType::F32 && logits.stride(1) == 1; }

void check_targets(const std::vector<int64_t>& targets, int64_t ignore_index, int64_t classes, const char* op) {
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n] != ignore_index) check_index(targets[n], classes, n, op, "target");
  }
}

template <class RowFn>
void for_each_row_softmax(const Tensor& logits, bool log, RowFn&& row_fn) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const float* x = static_cast<const float*>(logits.data_ptr());
  auto* kernel = vec().softmax_rows[0];
  parallel_for(rows, row_grain(classes), [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(classes));
    for (int64_t r = r0; r < r1; ++r) {
      kernel(x + r * logits.stride(0), row.data(), 1, classes, log);
      row_fn(r, row.data());
    }
  });
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                   Tensor& losses) {
  const std::vector<int64_t> target = read_indices(targets);
  std::vector<double> loss(target.size(), 0.0);
  if (vectorised_rows(logits)) {
    check_targets(target, ignore_index, logits.size(1), "cross_entropy");
    for_each_row_softmax(logits, /*log=*/true, [&](int64_t r, const float* log_p) {
      const int64_t t = target[static_cast<size_t>(r)];
      if (t != ignore_index) loss[static_cast<size_t>(r)] = -static_cast<double>(log_p[t]);
    });
    write_values(loss, losses);
    return;
  }
  visit_float_dtype(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    for_each_scored_row<T>(logits, target, ignore_index, "cross_entropy",
                           [&](size_t n, int64_t t, const T* line, int64_t step, C m, C lse) {
                             // -log softmax(x)[t] = lse + m - x[t]
                             loss[n] = row::cross_entropy_loss(lse, m, load(line[t * step]));
                           });
  });
  write_values(loss, losses);
}

void cross_entropy_backward(const Tensor& grad_rows, const Tensor& logits, const Tensor& targets,
                            int64_t ignore_index, Tensor& grad_logits) {
  const std::vector<int64_t> target = read_indices(targets);
  const std::vector<double> upstream = read_values(grad_rows);
  const int64_t classes = logits.size(1);
  assert(grad_logits.is_contiguous());
  if (vectorised_rows(logits)) {
    check_targets(target, ignore_index, classes, "cross_entropy_backward");
    float* gl = static_cast<float*>(grad_logits.data_ptr());
    for_each_row_softmax(logits, /*log=*/false, [&](int64_t r, const float* p) {
      float* out = gl + r * classes;
      const int64_t t = target[static_cast<size_t>(r)];
      if (t == ignore_index) {
        std::fill(out, out + classes, 0.0f);  // ignored rows get zero gradient
        return;
      }
      const float g = static_cast<float>(upstream[static_cast<size_t>(r)]);
      for (int64_t c = 0; c < classes; ++c) out[c] = g * p[c];
      out[t] -= g;
    });
    return;
  }
  visit_float_dtype(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* gl = static_cast<T*>(grad_logits.data_ptr());
    // Ignored rows get zero gradient.
    std::fill(gl, gl + grad_logits.numel(), convert<T>(0.0f));
    for_each_scored_row<T>(logits, target, ignore_index, "cross_entropy_backward",
                           [&](size_t n, int64_t t, const T* line, int64_t step, C m, C lse) {
                             const C g = static_cast<C>(upstream[n]);
                             T* out = gl + static_cast<int64_t>(n) * classes;
                             for (int64_t c = 0; c < classes; ++c) {
                               out[c] = convert<T>(row::cross_entropy_grad(g, load(line[c * step]), m, lse, c == t));
                             }
                           });
  });
}

}  // namespace dtensor::backend::cpu
