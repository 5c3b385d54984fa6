// A naive double-precision attention that materialises the scores: the reference of
// the fused kernels' tests (test_attention_kernel, test_attention_tiles).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace dtensor::test {

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// q [E, Sq, D], k [E, Sk, D], v [E, Sk, Dv], grad_out [E, Sq, Dv] (row-major doubles);
// the scores scaled by `scale`, 1 / sqrt(D) where it is negative.
inline Reference naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                 const std::vector<double>& v, const std::vector<double>& g, int64_t entries,
                                 int64_t sq, int64_t sk, int64_t d, int64_t dv, bool causal, double scale = -1) {
  Reference r;
  r.out.assign(static_cast<size_t>(entries * sq * dv), 0.0);
  r.lse.assign(static_cast<size_t>(entries * sq), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  if (scale < 0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t e = 0; e < entries; ++e) {
    const double* qe = q.data() + e * sq * d;
    const double* ke = k.data() + e * sk * d;
    const double* ve = v.data() + e * sk * dv;
    const double* ge = g.data() + e * sq * dv;
    for (int64_t i = 0; i < sq; ++i) {
      std::vector<double> p(static_cast<size_t>(sk), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < sk; ++j) {
        if (causal && j > i) continue;
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += qe[i * d + c] * ke[j * d + c];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      double total = 0;
      for (int64_t j = 0; j < sk; ++j) {
        p[j] = (causal && j > i) ? 0.0 : std::exp(p[j] - m);
        total += p[j];
      }
      for (double& x : p) x /= total;
      r.lse[e * sq + i] = m + std::log(total);
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t c = 0; c < dv; ++c) r.out[(e * sq + i) * dv + c] += p[j] * ve[j * dv + c];
      }
      // Backward of row i: dV += p^T g, dp = g V^T, ds = p (dp - <dp, p>), dQ = ds K scale, dK += ds^T q scale.
      std::vector<double> dp(static_cast<size_t>(sk), 0.0);
      double dot = 0;
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t c = 0; c < dv; ++c) {
          r.dv[(e * sk + j) * dv + c] += p[j] * ge[i * dv + c];
          dp[j] += ge[i * dv + c] * ve[j * dv + c];
        }
        dot += dp[j] * p[j];
      }
      for (int64_t j = 0; j < sk; ++j) {
        const double ds = p[j] * (dp[j] - dot) * scale;
        for (int64_t c = 0; c < d; ++c) {
          r.dq[(e * sq + i) * d + c] += ds * ke[j * d + c];
          r.dk[(e * sk + j) * d + c] += ds * qe[i * d + c];
        }
      }
    }
  }
  return r;
}

}  // namespace dtensor::test
