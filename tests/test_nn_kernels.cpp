// NN kernels against double-precision references (forward, every float dtype,
// strided inputs) and against finite differences in F64 (backward); argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace dtensor::test {
namespace {

const Shape kShape = {4, 5, 7};

// Reference softmax (or log_softmax) along `dim` of row-major values.
std::vector<double> ref_softmax(const std::vector<double>& v, const Shape& shape, int64_t dim,
                                bool log) {
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[dim], outer = static_cast<int64_t>(v.size()) / (n * inner);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return static_cast<size_t>((o * n + k) * inner + i); };
      double m = -INFINITY, s = 0;
      for (int64_t k = 0; k < n; ++k) m = std::max(m, v[at(k)]);
      for (int64_t k = 0; k < n; ++k) s += std::exp(v[at(k)] - m);
      for (int64_t k = 0; k < n; ++k) {
        out[at(k)] = log ? v[at(k)] - m - std::log(s) : std::exp(v[at(k)] - m) / s;
      }
    }
  }
  return out;
}

TEST(Softmax, MatchesReferenceAlongEveryDim) {
  uint64_t seed = 1;
  for (bool log : {false, true}) {
    for (DType dtype : kFloatDTypes) {
      for (Layout layout : kLayouts) {
        const Tensor x = make_input(kShape, dtype, layout, seed++, -4, 4);
        for (int64_t dim : {0, 1, 2}) {
          const Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
          EXPECT_EQ(y.dtype(), dtype);
          expect_close(y, ref_softmax(values(x), kShape, dim, log),
                       std::string(log ? "log_softmax " : "softmax ") +
                           std::string(dtype_name(dtype)) + " " + layout_name(layout) + " dim " +
                           std::to_string(dim),
                       2.0, 1e-6);
        }
      }
    }
  }
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  const Tensor x = Tensor::from_vector<float>({1000, 1001, 999}, {1, 3});
  expect_close(softmax(x, -1), ref_softmax({0, 1, -1}, {1, 3}, 1, false), "large", 2.0);
  expect_close(log_softmax(x, 1), ref_softmax({0, 1, -1}, {1, 3}, 1, true), "large log", 2.0);
}

// The vectorised row kernel: rows of many registers and with tails, logits
// far below the max (exp underflows to subnormals and 0), -inf entries (0), and the rows
// whose max is +inf or -inf everywhere, which are NaN as in the reference.
TEST(Softmax, LongRowsAndSpecialValuesOnTheVectorPath) {
  for (int64_t n : {1, 15, 16, 17, 127, 128, 129, 300, 4101}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      std::vector<double> v = values(make_input({3, n}, DType::F64, Layout::Contiguous, 40 + n, -30, 30));
      for (int64_t k = 0; k < n; k += 7) v[static_cast<size_t>(k)] = -150.0 - static_cast<double>(k % 5);
      if (n > 2) v[2] = -INFINITY;
      const Tensor x = Tensor::from_vector(v, {3, n}).to(dtype);
      const std::vector<double> xv = values(x);  // the reference sees the rounded inputs
      for (bool log : {false, true}) {
        const Tensor y = log ? log_softmax(x, 1) : softmax(x, 1);
        const std::string what =
            std::string(log ? "log_softmax " : "softmax ") + std::string(dtype_name(dtype)) + " n " + std::to_string(n);
        if (log) {  // -inf entries stay -inf; compare the rest
          const std::vector<double> ref = ref_softmax(xv, {3, n}, 1, true), got = values(y);
          for (size_t i = 0; i < ref.size(); ++i) {
            if (std::isinf(ref[i])) {
              EXPECT_EQ(got[i], ref[i]) << what << " at " << i;
            } else {
              EXPECT_NEAR(got[i], ref[i], 1e-4 * std::max(1.0, std::fabs(ref[i])) * (dtype == DType::BF16 ? 100 : 1))
                  << what << " at " << i;
            }
          }
        } else {
          expect_close(y, ref_softmax(xv, {3, n}, 1, false), what, 2.0, 1e-7);
        }
      }
      std::vector<double> special(static_cast<size_t>(2 * n), -INFINITY);  // row 0: all -inf
      special[static_cast<size_t>(n + n / 2)] = INFINITY;                  // row 1: holds +inf
      for (double value : values(softmax(Tensor::from_vector(special, {2, n}).to(dtype), 1))) {
        EXPECT_TRUE(std::isnan(value)) << "softmax of a row of -inf or with +inf, " << dtype_name(dtype) << " n " << n;
      }
    }
  }
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  for (bool log : {false, true}) {
    for (int64_t dim : {0, 2}) {
      const Tensor x = make_input({3, 4, 5}, DType::F64, Layout::Contiguous, 11 + dim);
      const std::vector<double> g = values(make_input({3, 4, 5}, DType::F64, Layout::Contiguous, 12));
      auto f = [&](const Tensor& t) { return log ? log_softmax(t, dim) : softmax(t, dim); };
      const Tensor y = f(x);
      // Strided grad_out and output exercise the line walk with non-unit steps.
      const Tensor g_t = Tensor::from_vector(g, {3, 4, 5}).t().contiguous().t();
      const Tensor grad = log ? log_softmax_backward(g_t, y, dim) : softmax_backward(g_t, y, dim);
      expect_close(grad, numerical_gradient(x, [&](const Tensor& t) { return weighted_sum(f(t), g); }),
                   "softmax backward", 1e5, 1e-7);
    }
  }
}

// ---- norms --------------------------------------------------------------------------------

struct NormReference {
  std::vector<double> out, mean, rstd;
};

NormReference ref_norm(const std::vector<double>& x, int64_t cols, const std::vector<double>& w,
                       const std::vector<double>& b, double eps, bool centered) {
  NormReference r;
  r.out.resize(x.size());
  for (size_t row = 0; row < x.size() / cols; ++row) {
    const double* xr = &x[row * cols];
    double m = 0, s = 0;
    if (centered) {
      for (int64_t i = 0; i < cols; ++i) m += xr[i] / cols;
    }
    for (int64_t i = 0; i < cols; ++i) s += (xr[i] - m) * (xr[i] - m) / cols;
    const double inv = 1 / std::sqrt(s + eps);
    for (int64_t i = 0; i < cols; ++i) {
      r.out[row * cols + i] = (xr[i] - m) * inv * (w.empty() ? 1 : w[i]) + (b.empty() ? 0 : b[i]);
    }
    r.mean.push_back(m);
    r.rstd.push_back(inv);
  }
  return r;
}

TEST(Norm, ForwardMatchesReference) {
  uint64_t seed = 200;
  for (bool centered : {true, false}) {
    for (DType dtype : kFloatDTypes) {
      for (Layout layout : kLayouts) {
        for (const Shape& normalized : {Shape{7}, Shape{5, 7}}) {
          for (bool affine : {false, true}) {
            const Tensor x = make_input(kShape, dtype, layout, seed++, -3, 5);
            const Tensor w = uniform_f64(normalized, seed++, 0.5, 1.5);  // F64 weights, converted
            const Tensor b = uniform_f64(normalized, seed++, -1, 1).to(dtype);
            const std::optional<Tensor> wo = affine ? std::optional(w) : std::nullopt;
            const NormResult r = centered ? layer_norm(x, normalized, wo, affine ? std::optional(b) : std::nullopt, 1e-5)
                                          : rms_norm(x, normalized, wo, 1e-5);
            const std::string what = std::string(centered ? "layer_norm " : "rms_norm ") +
                                     std::string(dtype_name(dtype)) + " " + layout_name(layout) +
                                     " over " + shape_to_string(normalized) + (affine ? " affine" : "");
            // Weights are rounded to x's dtype before use, as the op documents.
            const std::vector<double> wv = affine ? values(w.to(dtype)) : std::vector<double>{};
            const std::vector<double> bv = affine && centered ? values(b) : std::vector<double>{};
            const NormReference ref = ref_norm(values(x), shape_numel(normalized), wv, bv, 1e-5, centered);
            EXPECT_EQ(r.out.shape(), kShape) << what;
            expect_close(r.out, ref.out, what, 4.0, 1e-5);
            const Shape leading(kShape.begin(), kShape.end() - normalized.size());
            EXPECT_EQ(r.rstd.shape(), leading) << what;
            expect_close(r.rstd, ref.rstd, what + " rstd", 2.0, 1e-5);
            if (centered) expect_close(r.mean, ref.mean, what + " mean", 2.0, 1e-5);
          }
        }
      }
    }
  }
}

TEST(Norm, BackwardMatchesFiniteDifferences) {
  const Shape shape = {3, 2, 6}, normalized = {2, 6};
  for (bool centered : {true, false}) {
    const Tensor x = make_input(shape, DType::F64, Layout::Contiguous, 300, -2, 3);
    const Tensor w = uniform_f64(normalized, 301, 0.5, 1.5);
    const Tensor b = uniform_f64(normalized, 302, -1, 1);
    const std::vector<double> g = values(uniform_f64(shape, 303, -1, 1));
    auto forward = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi) {
      return centered ? layer_norm(xi, normalized, wi, bi, 1e-5).out
                      : rms_norm(xi, normalized, wi, 1e-5).out;
    };
    const NormResult saved = centered ? layer_norm(x, normalized, w, b, 1e-5) : rms_norm(x, normalized, w, 1e-5);
    const Tensor g_t = Tensor::from_vector(g, shape);
    const NormGrads grads = centered ? layer_norm_backward(g_t, x, saved, normalized, w, true)
                                     : rms_norm_backward(g_t, x, saved, normalized, w);
    const std::string what = centered ? "layer_norm" : "rms_norm";
    expect_close(grads.grad_input,
                 numerical_gradient(x, [&](const Tensor& t) { return weighted_sum(forward(t, w, b), g); }),
                 what + " grad_input", 1e5, 1e-7);
    expect_close(grads.grad_weight,
                 numerical_gradient(w, [&](const Tensor& t) { return weighted_sum(forward(x, t, b), g); }),
                 what + " grad_weight", 1e5, 1e-7);
    if (centered) {
      expect_close(grads.grad_bias,
                   numerical_gradient(b, [&](const Tensor& t) { return weighted_sum(forward(x, w, t), g); }),
                   what + " grad_bias", 1e5, 1e-7);
    } else {
      EXPECT_FALSE(grads.grad_bias.defined());
    }
    // Without a weight there is no weight gradient and grad_input uses w = 1.
    const NormResult plain = centered ? layer_norm(x, normalized, std::nullopt, std::nullopt)
                                      : rms_norm(x, normalized, std::nullopt, 1e-5);
    const NormGrads no_weight = centered ? layer_norm_backward(g_t, x, plain, normalized, std::nullopt, false)
                                         : rms_norm_backward(g_t, x, plain, normalized, std::nullopt);
    EXPECT_FALSE(no_weight.grad_weight.defined());
    const Tensor ones = Tensor::ones(normalized, DType::F64), zeros = Tensor::zeros(normalized, DType::F64);
    expect_close(no_weight.grad_input,
                 numerical_gradient(x, [&](const Tensor& t) { return weighted_sum(forward(t, ones, zeros), g); }),
                 what + " grad_input without weight", 1e5, 1e-7);
  }
}

TEST(Norm, BackwardInHalfPrecisionTracksF64) {
  const Shape shape = {6, 33};
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor x64 = make_input(shape, DType::F64, Layout::Contiguous, 310).to(dtype).to(DType::F64);
    const Tensor g64 = make_input(shape, DType::F64, Layout::Contiguous, 311).to(dtype).to(DType::F64);
    const Tensor w64 = uniform_f64({33}, 312, 0.5, 1.5).to(dtype).to(DType::F64);
    const NormGrads want = layer_norm_backward(g64, x64, layer_norm(x64, {33}, w64, std::nullopt), {33}, w64, true);
    const Tensor x = x64.to(dtype), w = w64.to(dtype);
    const NormGrads got = layer_norm_backward(g64.to(dtype), x, layer_norm(x, {33}, w, std::nullopt), {33}, w, true);
    const std::string what = std::string("layer_norm backward ") + std::string(dtype_name(dtype));
    expect_close(got.grad_input, values(want.grad_input), what, 4.0, 4 * rtol_for(dtype));
    expect_close(got.grad_weight, values(want.grad_weight), what + " weight", 4.0, 4 * rtol_for(dtype));
  }
}

// ---- activations' backward ------------------------------------------------------------------

TEST(Activation, BackwardMatchesFiniteDifferencesAndDtypes) {
  const Tensor x = make_input({5, 9}, DType::F64, Layout::Transposed, 400, -4, 4);
  const std::vector<double> g = values(uniform_f64({5, 9}, 401, -1, 1));
  const Tensor g_t = Tensor::from_vector(g, {5, 9});
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> forward;
    std::function<Tensor(const Tensor&, const Tensor&)> backward;
  };
  const std::vector<Case> cases = {
      {"gelu", [](const Tensor& t) { return gelu(t); }, [](const Tensor& go, const Tensor& t) { return gelu_backward(go, t); }},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, GeluApprox::Tanh); },
       [](const Tensor& go, const Tensor& t) { return gelu_backward(go, t, GeluApprox::Tanh); }},
      {"silu", [](const Tensor& t) { return silu(t); }, [](const Tensor& go, const Tensor& t) { return silu_backward(go, t); }},
  };
  for (const Case& c : cases) {
    const Tensor grad = c.backward(g_t, x);
    const std::vector<double> want =
        numerical_gradient(x.contiguous(), [&](const Tensor& t) { return weighted_sum(c.forward(t), g); });
    expect_close(grad, want, std::string(c.name) + " f64", 1e5, 1e-7);
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      // Against the F64 kernel on the same rounded inputs.
      const Tensor xd = x.to(dtype), gd = g_t.to(dtype);
      const Tensor got = c.backward(gd, xd);
      EXPECT_EQ(got.dtype(), dtype);
      expect_close(got, values(c.backward(gd.to(DType::F64), xd.to(DType::F64))),
                   std::string(c.name) + " " + std::string(dtype_name(dtype)), 4.0, 1e-5);
    }
  }
}

// ---- embedding ----------------------------------------------------------------------------------

TEST(Embedding, LooksUpRowsOfAnyDtypeWithIntegerIds) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F64, DType::I64}) {
    const Tensor table = uniform_f64({6, 5}, 500, -3, 3, 1.0).to(dtype);
    const std::vector<double> tv = values(table);
    for (DType id_dtype : {DType::I64, DType::I32}) {
      const Tensor ids = Tensor::from_vector<int64_t>({5, 0, 3, 3, 1, 2}, {2, 3}).to(id_dtype);
      const Tensor out = embedding(table, ids);
      EXPECT_EQ(out.shape(), (Shape{2, 3, 5}));
      std::vector<double> want;
      for (int64_t id : {5, 0, 3, 3, 1, 2}) {
        for (int64_t d = 0; d < 5; ++d) want.push_back(tv[static_cast<size_t>(id * 5 + d)]);
      }
      expect_close(out, want, "embedding", 0.0, 0.0);
    }
  }
  // A column-strided table and strided ids.
  const Tensor t = uniform_f64({5, 4}, 501, -1, 1).t();  // [4, 5]
  const Tensor ids = Tensor::from_vector<int64_t>({3, 9, 1, 9, 0}).slice(0, 0, 5, 2);  // 3, 1, 0
  EXPECT_TRUE(allclose(embedding(t, ids).select(0, 1), t.select(0, 1)));
}

TEST(Embedding, MaskedIdsGiveZeroRowsAndOthersThrow) {
  const Tensor table = Tensor::ones({4, 3});
  const Tensor ids = Tensor::from_vector<int64_t>({-1, 2, 4});
  expect_close(embedding(table, ids, true), {0, 0, 0, 1, 1, 1, 0, 0, 0}, "masked", 0.0, 0.0);
  expect_invalid([&] { embedding(table, ids); }, "[embedding] id -1 at position 0 is outside [0, 4)");
  expect_invalid([&] { embedding(table, Tensor::zeros({2})); }, "[embedding] expected ids of dtype i64 or i32, got f32");
  expect_invalid([&] { embedding(Tensor::ones({4}), ids); }, "[embedding] expected a table [V, D], got [4]");
}

TEST(Embedding, BackwardScatterAddsRepeatedIds) {
  for (DType dtype : kFloatDTypes) {
    const Tensor ids = Tensor::from_vector<int32_t>({2, 0, 2, 5, 2, 7}, {2, 3});
    const Tensor g = uniform_f64({2, 3, 4}, 510, -1, 1).to(dtype);
    const std::vector<double> gv = values(g);
    for (bool masked : {false, true}) {
      if (!masked) {
        expect_invalid([&] { embedding_backward(g, ids, 6, false); }, "[embedding_backward] id 7 at position 5");
        continue;
      }
      const Tensor grad = embedding_backward(g, ids, 6, true);
      EXPECT_EQ(grad.shape(), (Shape{6, 4}));
      std::vector<double> want(24, 0.0);
      const int ids_v[] = {2, 0, 2, 5, 2, 7};
      for (int n = 0; n < 6; ++n) {
        if (ids_v[n] >= 6) continue;
        for (int d = 0; d < 4; ++d) want[ids_v[n] * 4 + d] += gv[n * 4 + d];
      }
      expect_close(grad, want, std::string("embedding_backward ") + std::string(dtype_name(dtype)), 1.0, 1e-6);
    }
  }
}

// ---- cross-entropy --------------------------------------------------------------------------------

std::vector<double> ref_losses(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t classes,
                               int64_t ignore) {
  std::vector<double> out;
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore) {
      out.push_back(0);
      continue;
    }
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < classes; ++c) m = std::max(m, x[n * classes + c]);
    for (int64_t c = 0; c < classes; ++c) s += std::exp(x[n * classes + c] - m);
    out.push_back(m + std::log(s) - x[n * classes + t[n]]);
  }
  return out;
}

TEST(CrossEntropy, MatchesReferenceWithIgnoredRows) {
  const std::vector<int64_t> targets = {3, -100, 0, 6, 2};
  const Tensor t = Tensor::from_vector(targets);
  for (DType dtype : kFloatDTypes) {
    for (Layout layout : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      const Tensor logits = make_input({5, 7}, dtype, layout, 600, -5, 5);
      const std::vector<double> l = ref_losses(values(logits), targets, 7, -100);
      const std::string what = std::string("cross_entropy ") + std::string(dtype_name(dtype)) + " " + layout_name(layout);
      expect_close(cross_entropy(logits, t, LossReduction::None), l, what + " none", 2.0, 1e-5);
      const double total = l[0] + l[2] + l[3] + l[4];
      expect_close(cross_entropy(logits, t, LossReduction::Sum), {total}, what + " sum", 2.0, 1e-5);
      expect_close(cross_entropy(logits, t.to(DType::I32)), {total / 4}, what + " mean", 2.0, 1e-5);
      EXPECT_EQ(cross_entropy(logits, t).dtype(), dtype);
    }
  }
  const Tensor all_ignored = Tensor::from_vector<int64_t>({-100, -100});
  EXPECT_TRUE(std::isnan(cross_entropy(Tensor::zeros({2, 3}), all_ignored).item<float>()));
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const Tensor logits = make_input({4, 6}, DType::F64, Layout::Contiguous, 700, -3, 3);
  const Tensor targets = Tensor::from_vector<int64_t>({1, 5, 7, 0});  // 7 is ignored below
  for (LossReduction reduction : {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
    const bool none = reduction == LossReduction::None;
    const std::vector<double> g = none ? std::vector<double>{0.5, -1.0, 2.0, 1.5} : std::vector<double>{1.7};
    const Tensor grad_loss = none ? Tensor::from_vector(g) : Tensor::full({}, g[0], DType::F64);
    const Tensor grad = cross_entropy_backward(grad_loss, logits.t().contiguous().t(), targets, reduction, 7);
    expect_close(grad,
                 numerical_gradient(logits, [&](const Tensor& x) {
                   return weighted_sum(cross_entropy(x, targets, reduction, 7), g);
                 }),
                 "cross_entropy backward", 1e5, 1e-7);
    const std::vector<double> gv = values(grad);
    for (int c = 0; c < 6; ++c) EXPECT_EQ(gv[2 * 6 + c], 0.0);  // the ignored row
  }
}

TEST(CrossEntropy, ErrorsNameShapesAndDtypes) {
  const Tensor logits = Tensor::zeros({3, 4});
  expect_invalid([&] { cross_entropy(logits, Tensor::zeros({3})); }, "[cross_entropy] expected targets of dtype i64 or i32, got f32");
  expect_invalid([&] { cross_entropy(logits, Tensor::zeros({2}, DType::I64)); },
                 "[cross_entropy] expected targets [3] for logits [3, 4], got [2]");
  expect_invalid([&] { cross_entropy(Tensor::zeros({3}), Tensor::zeros({3}, DType::I64)); },
                 "[cross_entropy] expected logits [N, C], got [3]");
  expect_invalid([&] { cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1})); },
                 "[cross_entropy] target 4 at position 1 is outside [0, 4)");
  expect_invalid([&] { cross_entropy_backward(Tensor::ones({2}), logits, Tensor::zeros({3}, DType::I64)); },
                 "[cross_entropy_backward] expected a one-element grad_loss, got [2]");
}

TEST(NnErrors, NormsSoftmaxAndActivations) {
  const Tensor x = Tensor::zeros({2, 3, 4});
  expect_invalid([&] { layer_norm(x, {3}, std::nullopt, std::nullopt); },
                 "[layer_norm] normalized_shape [3] does not match the trailing dims of the input [2, 3, 4]");
  expect_invalid([&] { rms_norm(x, {4}, Tensor::ones({3})); }, "[rms_norm] expected weight of shape [4], got [3]");
  expect_invalid([&] { layer_norm(x.to(DType::I64), {4}, std::nullopt, std::nullopt); },
                 "[layer_norm] expected a floating dtype for input, got i64");
  expect_invalid([&] { softmax(x, 3); }, "[softmax] dim 3 out of range");
  expect_invalid([&] { softmax(Tensor::zeros({2}, DType::I32), 0); }, "[softmax] expected a floating dtype");
  expect_invalid([&] { softmax_backward(Tensor::zeros({2}), Tensor::zeros({3}), 0); },
                 "[softmax_backward] expected grad_out and output of one shape, got [2] and [3]");
  expect_invalid([&] { gelu_backward(Tensor::zeros({2}), Tensor::zeros({2, 1})); }, "[gelu_backward] expected grad_out and input");
  const NormResult saved = layer_norm(x, {4}, std::nullopt, std::nullopt);
  expect_invalid([&] { layer_norm_backward(x, x, NormResult{saved.out, saved.mean, saved.mean.to(DType::F64)}, {4}, std::nullopt, false); },
                 "[layer_norm_backward] expected saved rstd of shape [2, 3] and dtype f32, got [2, 3] f64");
}

}  // namespace
}  // namespace dtensor::test
