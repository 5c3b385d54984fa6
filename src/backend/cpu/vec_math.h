// Vector types and polynomial math for one instruction set (internal; included by
// vec_impl.h only, inside the namespace of the ISA being built).
//
// The including file defines DTENSOR_VEC_BYTES (64, 32 or 16) and is compiled with
// the matching -m flags, so GCC's vector extensions below become AVX-512, AVX2 or
// SSE2 instructions. Error bounds (measured over dense sweeps in
// tests/test_vec_kernels.cpp, against double-precision references):
//   vexp      relative error <= 2 ulp on [-87.3, 88.7]; subnormal results keep
//             absolute error < 2^-149; 0 below -103.9, +inf above 88.72, NaN -> NaN
//   vtanh     absolute error <= 2^-23 and relative error <= 3 ulp for |x| >= 2^-20
//   vsigmoid  relative error <= 3 ulp where the result is >= 2^-126
//   verf      absolute error <= 3e-7 (Abramowitz & Stegun 7.1.26 plus rounding)
//   vgelu_tanh relative error <= 8 (1 + 2|u|) 2^-24: GELU (tanh form) is computed as
//             x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3), which equals
//             0.5 x (1 + tanh u) and keeps relative accuracy for negative x, where
//             1 + tanh u cancels; the |u| term is u's own rounding, amplified by exp
//   vgelu_erf absolute error <= 3e-7 max(1, |x|); the derivatives of both forms are
//             within 2e-6 of the exact ones

// Nothing here may be an instantiation shared with other translation units (a
// std:: template or inline function compiled with AVX-512 flags could be picked by
// the linker for code that runs on any CPU): only builtins, memcpy and names of
// this ISA's namespace are used. vec_impl.h includes <cstdint> and <cstring>.

constexpr int W = DTENSOR_VEC_BYTES / 4;  // floats per register
typedef float vf __attribute__((vector_size(DTENSOR_VEC_BYTES)));
typedef int32_t vi __attribute__((vector_size(DTENSOR_VEC_BYTES)));
typedef uint32_t vu __attribute__((vector_size(DTENSOR_VEC_BYTES)));
typedef uint16_t vh __attribute__((vector_size(DTENSOR_VEC_BYTES / 2)));
typedef float vfh __attribute__((vector_size(DTENSOR_VEC_BYTES / 2)));  // half a register
typedef double vd __attribute__((vector_size(DTENSOR_VEC_BYTES)));      // W / 2 doubles

#define DT_INLINE inline __attribute__((always_inline))

DT_INLINE vf splat(float x) { return vf{} + x; }
// Same-size vector casts reinterpret the bits (GCC vector extensions).
DT_INLINE vi as_int(vf v) { return (vi)v; }
DT_INLINE vu as_uint(vf v) { return (vu)v; }
DT_INLINE vf as_float(vi v) { return (vf)v; }
DT_INLINE vf as_float(vu v) { return (vf)v; }

// max/min that return b when a is NaN (callers that must propagate NaN say so).
DT_INLINE vf vmax(vf a, vf b) { return a > b ? a : b; }
DT_INLINE vf vmin(vf a, vf b) { return a < b ? a : b; }
DT_INLINE vf vabs(vf a) { return as_float(as_int(a) & 0x7fffffff); }
DT_INLINE vf vcopysign(vf magnitude, vf sign) {
  return as_float((as_int(magnitude) & 0x7fffffff) | (as_int(sign) & int32_t(0x80000000u)));
}
DT_INLINE vf vsqrt(vf a) {
#if DTENSOR_VEC_BYTES == 64 && defined(__clang__)
  return _mm512_sqrt_ps(a);
#elif DTENSOR_VEC_BYTES == 64
  // _mm512_sqrt_ps with the result itself as the (fully overwritten) pass-through:
  // GCC 12's intrinsic warns about its undefined one. Clang has no such builtin
  // (the sanitizer and fuzz builds use Clang) and no such warning.
  return __builtin_ia32_sqrtps512_mask(a, a, static_cast<__mmask16>(-1), _MM_FROUND_CUR_DIRECTION);
#elif DTENSOR_VEC_BYTES == 32
  return _mm256_sqrt_ps(a);
#else
  return _mm_sqrt_ps(a);
#endif
}

constexpr float kInf = __builtin_inff();
DT_INLINE float quiet_nan() { return __builtin_nanf(""); }
DT_INLINE int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
DT_INLINE int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
DT_INLINE float fmax1(float a, float b) { return a > b ? a : b; }
DT_INLINE void fill(float* p, int64_t n, float v) {
  for (int64_t i = 0; i < n; ++i) p[i] = v;
}

DT_INLINE float hsum(vf v) {
  float s = 0;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}
DT_INLINE float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < W; ++i) m = (v[i] > m || v[i] != v[i]) ? v[i] : m;
  return m;
}

// Half `H` (0 low, 1 high) of a register, as a shuffle, which stays in registers (an
// extract). A memcpy of each half made GCC 12 spill the register and reload its halves,
// and the reload of the upper half missed store forwarding: ~15 cycles per vector,
// which had softmax at a quarter of its speed.
template <int H>
DT_INLINE vfh half_of(vf v) {
  constexpr int o = H * W / 2;
#if DTENSOR_VEC_BYTES == 64
  return __builtin_shufflevector(v, v, o, o + 1, o + 2, o + 3, o + 4, o + 5, o + 6, o + 7);
#elif DTENSOR_VEC_BYTES == 32
  return __builtin_shufflevector(v, v, o, o + 1, o + 2, o + 3);
#else
  return __builtin_shufflevector(v, v, o, o + 1);
#endif
}

// A running sum of float vectors kept in double lanes: the row statistics (softmax
// sums, norm moments, dot products) accumulate in double, as the scalar kernels do,
// so a row's statistic does not depend on its length's rounding.
struct DSum {
  vd lo = vd{}, hi = vd{};
  DT_INLINE void add(vf v) {
    lo += __builtin_convertvector(half_of<0>(v), vd);
    hi += __builtin_convertvector(half_of<1>(v), vd);
  }
  DT_INLINE double total() const {
    const vd both = lo + hi;
    double s = 0;
    for (int i = 0; i < W / 2; ++i) s += both[i];
    return s;
  }
};

// ---- loads and stores of F32 and BF16 (raw uint16_t bits) ----------------------------

DT_INLINE vf vload(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
DT_INLINE void vstore(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
DT_INLINE vf vload(const uint16_t* p) {
  vh h;
  __builtin_memcpy(&h, p, sizeof h);
  return as_float(__builtin_convertvector(h, vu) << 16);
}
// Round to nearest even; NaN stays a quiet NaN (as float_to_bf16_bits).
DT_INLINE void vstore(uint16_t* p, vf v) {
  const vu u = as_uint(v);
  const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const vu quiet = (u >> 16) | 0x40u;
  const vu bits = (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
  const vh h = __builtin_convertvector(bits, vh);
  __builtin_memcpy(p, &h, sizeof h);
}

inline uint16_t bf16_bits_of(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The first `count` (< W) elements, the rest `pad`.
template <class T>
DT_INLINE vf vload_part(const T* p, int64_t count, float pad) {
  T tmp[W];
  if constexpr (sizeof(T) == 4) {
    for (int i = 0; i < W; ++i) tmp[i] = pad;
  } else {
    const uint16_t bits = bf16_bits_of(pad);
    for (int i = 0; i < W; ++i) tmp[i] = bits;
  }
  __builtin_memcpy(tmp, p, static_cast<size_t>(count) * sizeof(T));
  return vload(tmp);
}
template <class T>
DT_INLINE void vstore_part(T* p, vf v, int64_t count) {
  T tmp[W];
  vstore(tmp, v);
  __builtin_memcpy(p, tmp, static_cast<size_t>(count) * sizeof(T));
}

// Lanes [0, count) all ones, the rest zero.
DT_INLINE vi lanes_below(int64_t count) {
  vi lane;
  for (int i = 0; i < W; ++i) lane[i] = i;
  return lane < static_cast<int32_t>(count);
}

// ---- exp and friends ---------------------------------------------------------------

// e^x: n = round(x / ln 2) by the 1.5 * 2^23 trick, r = x - n ln 2 in two parts
// (Cody-Waite), e^r by Cephes' degree-6 polynomial, then 2^n applied in two halves
// so that subnormal and near-overflow results come out right. vexp_clamped is that
// core on x already clamped to [kExpLo, kExpHi]; vexp adds the out-of-range and NaN
// cases.
DT_INLINE vf vexp_clamped(vf xc) {
  const vf shifter = splat(12582912.0f);  // 1.5 * 2^23
  const vf t = xc * 1.44269504088896341f + shifter;
  const vf n = t - shifter;
  const vi ni = as_int(t) - as_int(shifter);
  vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vf y = p * (r * r) + r + 1.0f;
  const vi half = ni >> 1;
  return y * as_float((half + 127) << 23) * as_float((ni - half + 127) << 23);
}
constexpr float kExpHi = 88.72283905206835f, kExpLo = -103.97207708f;

DT_INLINE vf vexp(vf x) {
  vf y = vexp_clamped(vmin(vmax(x, splat(kExpLo)), splat(kExpHi)));
  y = x > kExpHi ? splat(kInf) : y;
  y = x < kExpLo ? splat(0.0f) : y;
  return x != x ? x : y;
}

// e^x for x <= 0 and not NaN (softmax's x - max), the same values as vexp there
// without its overflow and NaN cases.
DT_INLINE vf vexp_nonpositive(vf x) {
  const vf y = vexp_clamped(vmax(x, splat(kExpLo)));
  return x < kExpLo ? splat(0.0f) : y;
}

// tanh: Cephes' odd polynomial below 0.625, 1 - 2 / (e^{2|x|} + 1) above (tanh is 1
// in float beyond 9).
DT_INLINE vf vtanh(vf x) {
  const vf ax = vabs(x);
  const vf z = x * x;
  vf p = splat(-5.70498872745e-3f);
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const vf small = p * z * x + x;
  const vf e = vexp(vmin(ax, splat(9.0f)) * 2.0f);
  const vf large = vcopysign(1.0f - 2.0f / (e + 1.0f), x);
  const vf y = ax < 0.625f ? small : large;
  return x != x ? x : y;
}

DT_INLINE vf vsigmoid(vf x) { return 1.0f / (1.0f + vexp(-x)); }

DT_INLINE vf vsilu(vf x) { return x / (1.0f + vexp(-x)); }

constexpr float kSqrt2OverPi = 0.7978845608028654f, kGeluC = 0.044715f;
constexpr float kSqrtHalf = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;

DT_INLINE vf vgelu_tanh(vf x) {
  const vf u = kSqrt2OverPi * (x + kGeluC * x * x * x);
  return x / (1.0f + vexp(-2.0f * u));
}

// d/dx x s(2u) = s + x s (1 - s) 2 u', u' = sqrt(2/pi) (1 + 3 c x^2).
DT_INLINE vf vgelu_tanh_grad(vf x) {
  const vf x2 = x * x;
  const vf u = kSqrt2OverPi * (x + kGeluC * x2 * x);
  const vf s = 1.0f / (1.0f + vexp(-2.0f * u));
  const vf du = (2.0f * kSqrt2OverPi) * (1.0f + (3.0f * kGeluC) * x2);
  return s + x * s * (1.0f - s) * du;
}

// erf(z) = 1 - t (a1 + t (a2 + ...)) e^{-z^2}, t = 1 / (1 + p |z|), with the sign of
// z; also returns e^{-z^2} (the normal density needs it).
DT_INLINE vf verf(vf z, vf* exp_minus_z2) {
  const vf az = vabs(z);
  const vf t = 1.0f / (1.0f + 0.3275911f * az);
  vf poly = splat(1.061405429f);
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  const vf e = vexp(-(z * z));
  *exp_minus_z2 = e;
  const vf y = vcopysign(1.0f - poly * t * e, z);
  return z != z ? z : y;
}

DT_INLINE vf vgelu_erf(vf x) {
  vf e;
  return 0.5f * x * (1.0f + verf(x * kSqrtHalf, &e));
}

// d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = e^{-x^2/2} / sqrt(2 pi).
DT_INLINE vf vgelu_erf_grad(vf x) {
  vf e;
  const vf cdf = 0.5f * (1.0f + verf(x * kSqrtHalf, &e));
  return cdf + x * e * kInvSqrt2Pi;
}

DT_INLINE vf vsilu_grad(vf x) {
  const vf s = vsigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}
