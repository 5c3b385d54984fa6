// The vectorised row kernels, written once for every instruction set (internal).
//
// vec_avx512.cpp, vec_avx2.cpp and vec_baseline.cpp each define DTENSOR_VEC_NS
// (their namespace) and DTENSOR_VEC_BYTES, include this file and export the table
// built by make_table(). Storage types: float, or uint16_t holding BF16 bits.
// Like vec_math.h, this file uses no std:: templates or inline functions (see there).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/vec_kernels.h"

namespace dtensor::backend::cpu::DTENSOR_VEC_NS {

#include "backend/cpu/vec_math.h"

// y = f(x) over n elements, two registers per iteration so the long dependency
// chains of the polynomials overlap.
template <class T, class U, class F>
DT_INLINE void map1(const T* x, U* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const vf a = f(vload(x + i)), b = f(vload(x + i + W));
    vstore(y + i, a);
    vstore(y + i + W, b);
  }
  for (; i + W <= n; i += W) vstore(y + i, f(vload(x + i)));
  if (i < n) vstore_part(y + i, f(vload_part(x + i, n - i, 0.0f)), n - i);
}

template <class T, class F>
DT_INLINE void map2(const T* x, const T* y, T* z, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const vf a = f(vload(x + i), vload(y + i)), b = f(vload(x + i + W), vload(y + i + W));
    vstore(z + i, a);
    vstore(z + i + W, b);
  }
  for (; i + W <= n; i += W) vstore(z + i, f(vload(x + i), vload(y + i)));
  if (i < n) vstore_part(z + i, f(vload_part(x + i, n - i, 0.0f), vload_part(y + i, n - i, 1.0f)), n - i);
}

// Sum over a row of f(v) for loaded vectors v, in double (pad is passed through f
// too, so f must map the padding to 0: callers pass `pad` with f(pad) == 0).
template <class T, class F>
DT_INLINE double row_sum(const T* x, int64_t n, float pad, F f) {
  DSum s;
  int64_t i = 0;
  for (; i + W <= n; i += W) s.add(f(vload(x + i)));
  if (i < n) s.add(f(vload_part(x + i, n - i, pad)));
  return s.total();
}

template <class T>
DT_INLINE float row_max(const T* x, int64_t n) {
  const float ninf = -kInf;
  vf m = splat(ninf);
  vi nan = vi{} + 0;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vf v = vload(x + i);
    nan |= v != v;
    m = vmax(v, m);
  }
  if (i < n) {
    const vf v = vload_part(x + i, n - i, ninf);
    nan |= v != v;
    m = vmax(v, m);
  }
  for (int j = 0; j < W; ++j) {
    if (nan[j]) return quiet_nan();  // NaN wins, as in the scalar kernel
  }
  return hmax(m);
}

// ---- pointwise -------------------------------------------------------------------

template <class T>
void unary(VecUnary op, const void* xv, void* yv, int64_t n) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  switch (op) {
    case VecUnary::Exp: return map1(x, y, n, [](vf v) { return vexp(v); });
    case VecUnary::Tanh: return map1(x, y, n, [](vf v) { return vtanh(v); });
    case VecUnary::Sigmoid: return map1(x, y, n, [](vf v) { return vsigmoid(v); });
    case VecUnary::GeluTanh: return map1(x, y, n, [](vf v) { return vgelu_tanh(v); });
    case VecUnary::GeluErf: return map1(x, y, n, [](vf v) { return vgelu_erf(v); });
    case VecUnary::Silu: return map1(x, y, n, [](vf v) { return vsilu(v); });
  }
}

template <class T>
void binary(VecBinary op, const void* xv, const void* yv, bool y_scalar, void* zv, int64_t n) {
  const T* x = static_cast<const T*>(xv);
  const T* y = static_cast<const T*>(yv);
  T* z = static_cast<T*>(zv);
  if (y_scalar) {
    float s;
    if constexpr (sizeof(T) == 4) {
      s = y[0];
    } else {
      const uint32_t bits = static_cast<uint32_t>(y[0]) << 16;
      __builtin_memcpy(&s, &bits, 4);
    }
    switch (op) {
      case VecBinary::Add: return map1(x, z, n, [s](vf a) { return a + s; });
      case VecBinary::Sub: return map1(x, z, n, [s](vf a) { return a - s; });
      case VecBinary::Mul: return map1(x, z, n, [s](vf a) { return a * s; });
      case VecBinary::Div: return map1(x, z, n, [s](vf a) { return a / s; });
    }
  }
  switch (op) {
    case VecBinary::Add: return map2(x, y, z, n, [](vf a, vf b) { return a + b; });
    case VecBinary::Sub: return map2(x, y, z, n, [](vf a, vf b) { return a - b; });
    case VecBinary::Mul: return map2(x, y, z, n, [](vf a, vf b) { return a * b; });
    case VecBinary::Div: return map2(x, y, z, n, [](vf a, vf b) { return a / b; });
  }
}

template <class T>
void activation_backward(VecUnary op, const void* gv, const void* xv, void* outv, int64_t n) {
  const T* g = static_cast<const T*>(gv);
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  switch (op) {
    case VecUnary::GeluTanh: return map2(g, x, out, n, [](vf a, vf v) { return a * vgelu_tanh_grad(v); });
    case VecUnary::GeluErf: return map2(g, x, out, n, [](vf a, vf v) { return a * vgelu_erf_grad(v); });
    case VecUnary::Silu: return map2(g, x, out, n, [](vf a, vf v) { return a * vsilu_grad(v); });
    default: return;
  }
}

// ---- softmax ---------------------------------------------------------------------

// e = exp(x - shift) for a row, returning its sum, in double per register as the
// scalar kernel sums (DSum), so that the statistic does not depend on the row's
// length; a float sum over blocks of registers was faster but would. Prefetches the
// next row (see softmax_row).
template <class T, class Exp>
DT_INLINE double exp_pass(const T* x, float* e, int64_t n, float shift, const T* next, Exp exp) {
  DSum total;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    if (next) __builtin_prefetch(next + i);
    const vf v = exp(vload(x + i) - shift);
    vstore(e + i, v);
    total.add(v);
  }
  if (i < n) {
    const vf v = exp(vload_part(x + i, n - i, -kInf) - shift);
    vstore_part(e + i, v, n - i);
    total.add(v);
  }
  return total.total();
}

// One row: m = max, e = exp(x - m) kept in `e` (F32), then scaled or shifted. The
// exp pass, which computes from cache, prefetches the next row (`next`, null for
// the last), so that its max pass does not wait on memory with the core idle.
template <class T>
void softmax_row(const T* x, T* y, float* e, int64_t n, bool log, const T* next) {
  const float m = row_max(x, n);
  if (m != m) {  // a NaN in the row: the whole row is NaN, as in the scalar kernel
    const float nan = quiet_nan();
    map1(x, y, n, [nan](vf) { return splat(nan); });
    return;
  }
  // An all -inf row has m = -inf; use 0 so that exp(-inf - 0) = 0 and the row
  // becomes NaN through 0/0, as exp(x - max) / sum does in the scalar kernel.
  const float shift = m == -kInf ? 0.0f : m;
  // x - shift <= 0 and not NaN unless the row holds +inf (inf - inf is NaN there).
  const double total = m == kInf ? exp_pass(x, e, n, shift, next, [](vf v) { return vexp(v); })
                                 : exp_pass(x, e, n, shift, next, [](vf v) { return vexp_nonpositive(v); });
  if (log) {
    // (x - shift) - log(total): two steps, as shift + log(total) would round at the
    // magnitude of shift.
    const float log_total = static_cast<float>(__builtin_log(total));
    map1(x, y, n, [shift, log_total](vf v) { return (v - shift) - log_total; });
  } else {
    const float inv = static_cast<float>(1.0 / total);
    map1(e, y, n, [inv](vf v) { return v * inv; });
  }
}

// A per-thread F32 buffer for a row's intermediates.
struct Scratch {
  float* data = nullptr;
  int64_t capacity = 0;
  ~Scratch() { free(data); }
};
thread_local Scratch row_scratch;

float* scratch(int64_t n) {
  if (row_scratch.capacity < n) {
    free(row_scratch.data);
    row_scratch.data = static_cast<float*>(malloc(static_cast<size_t>(n) * sizeof(float)));
    row_scratch.capacity = row_scratch.data ? n : 0;
    if (!row_scratch.data) abort();  // kernels cannot throw through the table
  }
  return row_scratch.data;
}

template <class T>
void softmax_rows(const void* xv, void* yv, int64_t rows, int64_t n, bool log) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  float* e = scratch(n);
  for (int64_t r = 0; r < rows; ++r)
    softmax_row(x + r * n, y + r * n, e, n, log, r + 1 < rows ? x + (r + 1) * n : nullptr);
}

template <class T>
void softmax_backward_rows(const void* gv, const void* yv, void* outv, int64_t rows, int64_t n, bool log) {
  const T* g = static_cast<const T*>(gv);
  const T* y = static_cast<const T*>(yv);
  T* out = static_cast<T*>(outv);
  for (int64_t r = 0; r < rows; ++r) {
    const T* gr = g + r * n;
    const T* yr = y + r * n;
    T* o = out + r * n;
    if (log) {
      // y = log p: dx = g - p * sum(g).
      const float total = static_cast<float>(row_sum(gr, n, 0.0f, [](vf v) { return v; }));
      map2(gr, yr, o, n, [total](vf a, vf b) { return a - vexp(b) * total; });
    } else {
      // y = p: dx = p * (g - <g, p>).
      DSum d0;
      int64_t i = 0;
      for (; i + W <= n; i += W) d0.add(vload(gr + i) * vload(yr + i));
      if (i < n) d0.add(vload_part(gr + i, n - i, 0.0f) * vload_part(yr + i, n - i, 0.0f));
      const float dot = static_cast<float>(d0.total());
      map2(gr, yr, o, n, [dot](vf a, vf b) { return b * (a - dot); });
    }
  }
}

// ---- layer norm / rms norm ---------------------------------------------------------

template <class T>
void norm_rows(const NormRowsArgs& a, const void* xv, const void* wv, const void* bv, void* yv, float* mean,
               float* rstd) {
  const T* x = static_cast<const T*>(xv);
  const T* w = static_cast<const T*>(wv);
  const T* b = static_cast<const T*>(bv);
  T* y = static_cast<T*>(yv);
  const int64_t n = a.cols;
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    // Two passes (mean, then squared deviations): no cancellation for large means.
    const float mu =
        a.centered ? static_cast<float>(row_sum(xr, n, 0.0f, [](vf v) { return v; }) / static_cast<double>(n)) : 0.0f;
    DSum s0;
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      const vf d = vload(xr + i) - mu;
      s0.add(d * d);
    }
    if (i < n) {
      // The padding lanes are zeroed after the subtraction (a BF16 pad of mu would be
      // rounded and leave a residue).
      const vf d = vload_part(xr + i, n - i, 0.0f) - mu;
      s0.add(lanes_below(n - i) ? d * d : splat(0.0f));
    }
    const float inv = static_cast<float>(1.0 / __builtin_sqrt(s0.total() / static_cast<double>(n) + a.eps));
    i = 0;
    auto one = [&](vf v, int64_t at, int64_t count) {
      vf out = (v - mu) * inv;
      if (w) out *= count == W ? vload(w + at) : vload_part(w + at, count, 1.0f);
      if (b) out += count == W ? vload(b + at) : vload_part(b + at, count, 0.0f);
      return out;
    };
    for (; i + W <= n; i += W) vstore(yr + i, one(vload(xr + i), i, W));
    if (i < n) vstore_part(yr + i, one(vload_part(xr + i, n - i, 0.0f), i, n - i), n - i);
    if (mean) mean[r] = mu;
    rstd[r] = inv;
  }
}

template <class T>
void norm_backward_rows(const NormRowsArgs& a, const void* gv, const void* xv, const float* mean, const float* rstd,
                        const void* wv, void* giv, float* gw, float* gb) {
  const T* g = static_cast<const T*>(gv);
  const T* x = static_cast<const T*>(xv);
  const T* w = static_cast<const T*>(wv);
  T* gi = static_cast<T*>(giv);
  const int64_t n = a.cols;
  float* xhat = scratch(2 * n);
  float* ghat = xhat + n;
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* gr = g + r * n;
    const T* xr = x + r * n;
    const float m = a.centered ? mean[r] : 0.0f, inv = rstd[r];
    DSum sum_g, sum_gx;
    // xhat = (x - m) inv, ghat = g w; dx = inv (ghat - mean(ghat) - xhat mean(ghat xhat))
    // (the mean(ghat) term comes from centring and is absent for rms_norm).
    auto pass = [&](int64_t at, int64_t count) {
      const bool full = count == W;
      const vf xv_ = full ? vload(xr + at) : vload_part(xr + at, count, m);
      const vf gv_ = full ? vload(gr + at) : vload_part(gr + at, count, 0.0f);
      const vf xh = (xv_ - m) * inv;
      vf gh = gv_;
      if (w) gh *= full ? vload(w + at) : vload_part(w + at, count, 0.0f);
      sum_g.add(gh);
      sum_gx.add(gh * xh);
      if (full) {
        vstore(xhat + at, xh);
        vstore(ghat + at, gh);
      } else {
        vstore_part(xhat + at, xh, count);
        vstore_part(ghat + at, gh, count);
      }
      if (gw) {
        const vf acc = (full ? vload(gw + at) : vload_part(gw + at, count, 0.0f)) + gv_ * xh;
        full ? vstore(gw + at, acc) : vstore_part(gw + at, acc, count);
      }
      if (gb) {
        const vf acc = (full ? vload(gb + at) : vload_part(gb + at, count, 0.0f)) + gv_;
        full ? vstore(gb + at, acc) : vstore_part(gb + at, acc, count);
      }
    };
    int64_t i = 0;
    for (; i + W <= n; i += W) pass(i, W);
    if (i < n) pass(i, n - i);
    const float mean_g = a.centered ? static_cast<float>(sum_g.total() / static_cast<double>(n)) : 0.0f;
    const float mean_gx = static_cast<float>(sum_gx.total() / static_cast<double>(n));
    T* o = gi + r * n;
    auto dx = [&](vf gh, vf xh) { return inv * (gh - mean_g - xh * mean_gx); };
    if constexpr (sizeof(T) == 4) {
      map2(ghat, xhat, o, n, dx);
    } else {
      map2(ghat, xhat, ghat, n, dx);
      map1(ghat, o, n, [](vf v) { return v; });
    }
  }
}

// ---- AdamW -----------------------------------------------------------------------

// The same float operations as backend/optim_math.h's adamw_update (the CUDA
// kernel's), which test_optim checks against this; not called from here, as an
// ISA-flagged file must not instantiate shared inline functions (vec_math.h).
template <class T>
void adamw(const AdamWArgs& a, float* p, const void* gv, float* m, float* v, int64_t n) {
  const T* g = static_cast<const T*>(gv);
  const float decay = 1.0f - a.lr * a.weight_decay;
  const float step = a.lr / a.bias_correction1;
  const float inv_sqrt_bc2 = 1.0f / __builtin_sqrtf(a.bias_correction2);
  auto one = [&](vf pv, vf gv_, vf mv, vf vv, vf* po, vf* mo, vf* vo) {
    mv = a.beta1 * mv + (1.0f - a.beta1) * gv_;
    vv = a.beta2 * vv + (1.0f - a.beta2) * (gv_ * gv_);
    const vf denom = vsqrt(vv) * inv_sqrt_bc2 + a.eps;
    *po = pv * decay - step * (mv / denom);
    *mo = mv;
    *vo = vv;
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    vf po, mo, vo;
    one(vload(p + i), vload(g + i), vload(m + i), vload(v + i), &po, &mo, &vo);
    vstore(p + i, po);
    vstore(m + i, mo);
    vstore(v + i, vo);
  }
  if (i < n) {
    const int64_t c = n - i;
    vf po, mo, vo;
    one(vload_part(p + i, c, 0.0f), vload_part(g + i, c, 0.0f), vload_part(m + i, c, 0.0f),
        vload_part(v + i, c, 0.0f), &po, &mo, &vo);
    vstore_part(p + i, po, c);
    vstore_part(m + i, mo, c);
    vstore_part(v + i, vo, c);
  }
}

// ---- conversions -------------------------------------------------------------------

void bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
  map1(x, y, n, [](vf v) { return v; });
}
void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
  map1(x, y, n, [](vf v) { return v; });
}

// ---- attention tiles ---------------------------------------------------------------

void softmax_tile_online(float* s, int64_t rows, int64_t n, int64_t ld, float scale, const int64_t* valid,
                         float* row_max_io, float* row_sum_io, float* correction) {
  const float ninf = -kInf;
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    const int64_t keep = valid ? imin(valid[r], n) : n;
    if (keep <= 0) {
      fill(sr, n, 0.0f);
      correction[r] = 1.0f;
      continue;
    }
    const float tile_max = row_max(sr, keep) * scale;  // scale > 0
    const float old_max = row_max_io[r];
    const float new_max = fmax1(old_max, tile_max);
    DSum sum;
    int64_t i = 0;
    for (; i + W <= keep; i += W) {
      const vf e = vexp(vload(sr + i) * scale - new_max);
      vstore(sr + i, e);
      sum.add(e);
    }
    if (i < keep) {
      const vf e = vexp(vload_part(sr + i, keep - i, ninf) * scale - new_max);
      vstore_part(sr + i, e, keep - i);
      sum.add(e);
    }
    fill(sr + keep, n - keep, 0.0f);
    const float c = old_max == ninf ? 0.0f : __builtin_expf(old_max - new_max);
    correction[r] = c;
    row_max_io[r] = new_max;
    row_sum_io[r] = static_cast<float>(static_cast<double>(row_sum_io[r]) * c + sum.total());
  }
}

void softmax_tile_recompute(float* s, int64_t rows, int64_t n, int64_t ld, float scale, const int64_t* valid,
                            const float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * ld;
    const int64_t keep = valid ? imax(0, imin(valid[r], n)) : n;
    const float shift = lse[r];
    map1(sr, sr, keep, [scale, shift](vf v) { return vexp(v * scale - shift); });
    fill(sr + keep, n - keep, 0.0f);
  }
}

void softmax_tile_grad(const float* p, float* dp, int64_t rows, int64_t n, int64_t ld, float scale,
                       const float* delta) {
  for (int64_t r = 0; r < rows; ++r) {
    const float d = delta[r];
    map2(p + r * ld, dp + r * ld, dp + r * ld, n, [scale, d](vf pv, vf g) { return scale * pv * (g - d); });
  }
}

void row_dots(const float* a, const float* b, float* out, int64_t rows, int64_t n, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * ld;
    const float* br = b + r * ld;
    DSum s;
    int64_t i = 0;
    for (; i + W <= n; i += W) s.add(vload(ar + i) * vload(br + i));
    if (i < n) s.add(vload_part(ar + i, n - i, 0.0f) * vload_part(br + i, n - i, 0.0f));
    out[r] = static_cast<float>(s.total());
  }
}

VecKernels make_table(const char* isa) {
  VecKernels k{};
  k.isa = isa;
  k.unary[0] = unary<float>;
  k.unary[1] = unary<uint16_t>;
  k.binary[0] = binary<float>;
  k.binary[1] = binary<uint16_t>;
  k.activation_backward[0] = activation_backward<float>;
  k.activation_backward[1] = activation_backward<uint16_t>;
  k.softmax_rows[0] = softmax_rows<float>;
  k.softmax_rows[1] = softmax_rows<uint16_t>;
  k.softmax_backward_rows[0] = softmax_backward_rows<float>;
  k.softmax_backward_rows[1] = softmax_backward_rows<uint16_t>;
  k.norm_rows[0] = norm_rows<float>;
  k.norm_rows[1] = norm_rows<uint16_t>;
  k.norm_backward_rows[0] = norm_backward_rows<float>;
  k.norm_backward_rows[1] = norm_backward_rows<uint16_t>;
  k.adamw[0] = adamw<float>;
  k.adamw[1] = adamw<uint16_t>;
  k.bf16_to_f32 = bf16_to_f32;
  k.f32_to_bf16 = f32_to_bf16;
  k.softmax_tile_online = softmax_tile_online;
  k.softmax_tile_recompute = softmax_tile_recompute;
  k.softmax_tile_grad = softmax_tile_grad;
  k.row_dots = row_dots;
  return k;
}

}  // namespace dtensor::backend::cpu::DTENSOR_VEC_NS
