// The vectorised row kernels (src/backend/cpu/vec_kernels.h) of every instruction set
// this CPU runs, against double-precision references: the error bounds that
// vec_math.h states, over dense sweeps, lengths that exercise the vector tails, and
// BF16 rounding bit for bit against the scalar conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/vec_kernels.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cpu {
namespace {

std::vector<const VecKernels*> tables() {
  std::vector<const VecKernels*> out{&vec_kernels_baseline()};
  if (cpu_features().avx2) out.push_back(vec_kernels_avx2());
  if (cpu_features().avx512) out.push_back(vec_kernels_avx512());
  return out;
}

// Distance in units in the last place of float at the reference's magnitude.
double ulps(float got, double want) {
  if (want == 0) return got == 0 ? 0 : std::numeric_limits<double>::infinity();
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::abs(static_cast<double>(got) - want) / ulp;
}

std::vector<float> sweep(float lo, float hi, int n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1);
  return x;
}

std::vector<float> run_unary(const VecKernels& k, VecUnary op, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  k.unary[0](op, x.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

TEST(VecKernels, ExpWithinTwoUlpsAndEdgeCases) {
  for (const VecKernels* k : tables()) {
    SCOPED_TRACE(k->isa);
    const std::vector<float> x = sweep(-87.3f, 88.7f, 200001);
    const std::vector<float> y = run_unary(*k, VecUnary::Exp, x);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulps(y[i], std::exp(static_cast<double>(x[i]))));
    EXPECT_LE(worst, 2.0);
    // Subnormal results, underflow, overflow, NaN.
    const std::vector<float> edge = {-95.0f, -103.0f, -104.0f, -1e30f, 88.72f, 89.0f, 1e30f,
                                     std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f};
    const std::vector<float> e = run_unary(*k, VecUnary::Exp, edge);
    EXPECT_NEAR(e[0], std::exp(-95.0), std::ldexp(1.0, -149));
    EXPECT_NEAR(e[1], std::exp(-103.0), std::ldexp(1.0, -149));
    EXPECT_EQ(e[2], 0.0f);
    EXPECT_EQ(e[3], 0.0f);
    EXPECT_TRUE(std::isfinite(e[4]));
    EXPECT_EQ(e[5], std::numeric_limits<float>::infinity());
    EXPECT_EQ(e[6], std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(e[7]));
    EXPECT_EQ(e[8], 1.0f);
    EXPECT_EQ(e[9], 1.0f);
  }
}

TEST(VecKernels, TanhSigmoidSiluBounds) {
  for (const VecKernels* k : tables()) {
    SCOPED_TRACE(k->isa);
    const std::vector<float> x = sweep(-12.0f, 12.0f, 120001);
    const std::vector<float> t = run_unary(*k, VecUnary::Tanh, x);
    const std::vector<float> s = run_unary(*k, VecUnary::Sigmoid, x);
    const std::vector<float> si = run_unary(*k, VecUnary::Silu, x);
    double tanh_abs = 0, tanh_ulps = 0, sigmoid_ulps = 0, silu_ulps = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double xd = x[i];
      const double tr = std::tanh(xd), sr = 1.0 / (1.0 + std::exp(-xd));
      tanh_abs = std::max(tanh_abs, std::abs(t[i] - tr));
      if (std::abs(xd) >= std::ldexp(1.0, -20)) tanh_ulps = std::max(tanh_ulps, ulps(t[i], tr));
      sigmoid_ulps = std::max(sigmoid_ulps, ulps(s[i], sr));
      if (xd != 0) silu_ulps = std::max(silu_ulps, ulps(si[i], xd * sr));
    }
    EXPECT_LE(tanh_abs, std::ldexp(1.0, -23));
    EXPECT_LE(tanh_ulps, 3.0);
    EXPECT_LE(sigmoid_ulps, 3.0);
    EXPECT_LE(silu_ulps, 4.0);
    // Tiny arguments: tanh x = x.
    const std::vector<float> tiny = run_unary(*k, VecUnary::Tanh, {1e-30f, -1e-8f, 0.0f});
    EXPECT_EQ(tiny[0], 1e-30f);
    EXPECT_EQ(tiny[1], -1e-8f);
    EXPECT_EQ(tiny[2], 0.0f);
    EXPECT_TRUE(std::isnan(run_unary(*k, VecUnary::Tanh, {std::nanf("")})[0]));
  }
}

// 0.5 x (1 + tanh u) written as x / (1 + e^{-2u}): in double too, 1 + tanh u cancels
// below u = -18.
double gelu_tanh_ref(double x) {
  return x / (1.0 + std::exp(-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

TEST(VecKernels, GeluForwardAndBackward) {
  for (const VecKernels* k : tables()) {
    SCOPED_TRACE(k->isa);
    const std::vector<float> x = sweep(-10.0f, 10.0f, 100001);
    const std::vector<float> gt = run_unary(*k, VecUnary::GeluTanh, x);
    const std::vector<float> ge = run_unary(*k, VecUnary::GeluErf, x);
    std::vector<float> ones(x.size(), 1.0f), dt(x.size()), de(x.size());
    k->activation_backward[0](VecUnary::GeluTanh, ones.data(), x.data(), dt.data(), static_cast<int64_t>(x.size()));
    k->activation_backward[0](VecUnary::GeluErf, ones.data(), x.data(), de.data(), static_cast<int64_t>(x.size()));
    double tanh_rel = 0, erf_abs = 0, dt_abs = 0, de_abs = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double xd = x[i], h = 1e-4;
      const double ref = gelu_tanh_ref(xd);
      // x s(2u) keeps relative accuracy for negative x (no 1 + tanh cancellation); what
      // is left is the rounding of u itself, which exp amplifies by |2u|.
      const double u = 0.7978845608028654 * (xd + 0.044715 * xd * xd * xd);
      if (ref != 0) {
        tanh_rel = std::max(tanh_rel, std::abs(gt[i] - ref) / std::abs(ref) / (std::ldexp(1.0, -24) * (1 + 2 * std::abs(u))));
      }
      erf_abs = std::max(erf_abs, std::abs(ge[i] - gelu_erf_ref(xd)) / std::max(1.0, std::abs(xd)));
      const double dref_t = (gelu_tanh_ref(xd + h) - gelu_tanh_ref(xd - h)) / (2 * h);
      const double dref_e = (gelu_erf_ref(xd + h) - gelu_erf_ref(xd - h)) / (2 * h);
      dt_abs = std::max(dt_abs, std::abs(dt[i] - dref_t));
      de_abs = std::max(de_abs, std::abs(de[i] - dref_e));
    }
    EXPECT_LE(tanh_rel, 8.0);
    EXPECT_LE(erf_abs, 3e-7);
    EXPECT_LE(dt_abs, 2e-6);
    EXPECT_LE(de_abs, 2e-6);
  }
}

TEST(VecKernels, Bf16RoundingMatchesScalarConversion) {
  for (const VecKernels* k : tables()) {
    SCOPED_TRACE(k->isa);
    // Every 1021st bit pattern plus the edge cases: ties, NaNs, infinities, subnormals.
    std::vector<float> x;
    for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 1021) {
      const uint32_t b = static_cast<uint32_t>(bits);
      float f;
      std::memcpy(&f, &b, 4);
      x.push_back(f);
    }
    for (uint32_t b : {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u, 0x00000001u,
                       0x807fffffu, 0x7f7fffffu}) {
      float f;
      std::memcpy(&f, &b, 4);
      x.push_back(f);
    }
    std::vector<uint16_t> y(x.size());
    k->f32_to_bf16(x.data(), y.data(), static_cast<int64_t>(x.size()));
    size_t mismatches = 0;
    for (size_t i = 0; i < x.size(); ++i) mismatches += y[i] != float_to_bf16_bits(x[i]);
    EXPECT_EQ(mismatches, 0u);
    std::vector<float> back(x.size());
    k->bf16_to_f32(y.data(), back.data(), static_cast<int64_t>(y.size()));
    for (size_t i = 0; i < y.size(); i += 997) {
      const float want = bf16_bits_to_float(y[i]);
      EXPECT_TRUE(std::memcmp(&back[i], &want, 4) == 0) << i;
    }
  }
}

// Every length from 0 to 3 registers and a few more: the tails are loaded and
// stored through padded buffers and must neither read nor write past n.
TEST(VecKernels, TailsTouchOnlyTheirElements) {
  for (const VecKernels* k : tables()) {
    SCOPED_TRACE(k->isa);
    for (int64_t n = 0; n <= 53; ++n) {
      std::vector<float> x(static_cast<size_t>(n) + 32, 0.5f), y(static_cast<size_t>(n) + 32, -7.0f);
      for (int64_t i = 0; i < n; ++i) x[i] = 0.01f * static_cast<float>(i) - 0.2f;
      k->unary[0](VecUnary::Exp, x.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], std::exp(x[i]), 1e-6 * std::exp(x[i])) << n << " " << i;
      for (size_t i = static_cast<size_t>(n); i < y.size(); ++i) ASSERT_EQ(y[i], -7.0f) << n;
      std::vector<float> z(static_cast<size_t>(n) + 32, -7.0f);
      k->binary[0](VecBinary::Div, x.data(), x.data(), false, z.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(z[i], 1.0f);
      for (size_t i = static_cast<size_t>(n); i < z.size(); ++i) ASSERT_EQ(z[i], -7.0f) << n;
    }
  }
}

TEST(VecKernels, AdamWMatchesDoubleReference) {
  for (const VecKernels* k : tables()) {
    SCOPED_TRACE(k->isa);
    const int64_t n = 77;
    std::vector<float> p(n), g(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = std::sin(0.3f * i);
      g[i] = std::cos(0.7f * i) * 0.1f;
      m[i] = 0.01f * i;
      v[i] = 0.001f * i;
    }
    const std::vector<float> p0 = p, m0 = m, v0 = v;
    AdamWArgs a;
    a.lr = 3e-3f;
    a.beta1 = 0.9f;
    a.beta2 = 0.999f;
    a.eps = 1e-8f;
    a.weight_decay = 0.01f;
    a.bias_correction1 = 1.0f - std::pow(0.9f, 3.0f);
    a.bias_correction2 = 1.0f - std::pow(0.999f, 3.0f);
    k->adamw[0](a, p.data(), g.data(), m.data(), v.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double md = 0.9 * m0[i] + 0.1 * g[i];
      const double vd = 0.999 * v0[i] + 0.001 * static_cast<double>(g[i]) * g[i];
      const double denom = std::sqrt(vd) / std::sqrt(static_cast<double>(a.bias_correction2)) + 1e-8;
      const double pd = p0[i] * (1.0 - 3e-3 * 0.01) - 3e-3 / a.bias_correction1 * md / denom;
      EXPECT_NEAR(m[i], md, 1e-6);
      EXPECT_NEAR(v[i], vd, 1e-7);
      EXPECT_NEAR(p[i], pd, 1e-6);
    }
  }
}

}  // namespace
}  // namespace dtensor::backend::cpu
