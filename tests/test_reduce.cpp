// Reductions against double-precision references: every dim set, keepdim, every float
// dtype, contiguous and strided inputs of odd sizes; output dtypes; accuracy of long
// sums; argmax ties and NaN; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/scalar_ops.h"
#include "kernel_test_util.h"

namespace dtensor::test {
namespace {

const Shape kShape = {5, 6, 7};

// Groups the row-major values of a tensor of `shape` by their kept-dims index.
std::vector<std::vector<double>> groups(const std::vector<double>& v, const Shape& shape,
                                        const std::vector<int64_t>& dims) {
  std::vector<int64_t> sorted;
  for (int64_t d : dims) sorted.push_back(d < 0 ? d + static_cast<int64_t>(shape.size()) : d);
  if (sorted.empty()) {
    for (size_t d = 0; d < shape.size(); ++d) sorted.push_back(static_cast<int64_t>(d));
  }
  int64_t kept = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (std::find(sorted.begin(), sorted.end(), d) == sorted.end()) kept *= shape[d];
  }
  std::vector<std::vector<double>> out(static_cast<size_t>(kept));
  for (size_t flat = 0; flat < v.size(); ++flat) {
    int64_t rest = static_cast<int64_t>(flat), index = 0, scale = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const int64_t coord = rest % shape[d];
      rest /= shape[d];
      if (std::find(sorted.begin(), sorted.end(), d) != sorted.end()) continue;
      index += coord * scale;
      scale *= shape[d];
    }
    out[static_cast<size_t>(index)].push_back(v[flat]);
  }
  return out;
}

struct ReduceCase {
  const char* name;
  std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)> run;
  std::function<double(const std::vector<double>&)> reference;
};

double ref_sum(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double ref_var(const std::vector<double>& g, int correction) {
  const double m = ref_sum(g) / g.size();
  double s = 0;
  for (double v : g) s += (v - m) * (v - m);
  return s / (g.size() - correction);
}

const std::vector<ReduceCase> kReduceCases = {
    {"sum", [](const Tensor& a, auto d, bool k) { return sum(a, d, k); }, ref_sum},
    {"mean", [](const Tensor& a, auto d, bool k) { return mean(a, d, k); },
     [](const std::vector<double>& g) { return ref_sum(g) / g.size(); }},
    {"amax", [](const Tensor& a, auto d, bool k) { return amax(a, d, k); },
     [](const std::vector<double>& g) { return *std::max_element(g.begin(), g.end()); }},
    {"amin", [](const Tensor& a, auto d, bool k) { return amin(a, d, k); },
     [](const std::vector<double>& g) { return *std::min_element(g.begin(), g.end()); }},
    {"var0", [](const Tensor& a, auto d, bool k) { return var(a, d, 0, k); },
     [](const std::vector<double>& g) { return ref_var(g, 0); }},
    {"var1", [](const Tensor& a, auto d, bool k) { return var(a, d, 1, k); },
     [](const std::vector<double>& g) { return ref_var(g, 1); }},
};

const std::vector<std::vector<int64_t>> kDimSets = {{}, {0}, {1}, {-1}, {0, 2}, {2, 0}, {1, 2}, {0, 1, 2}};

Shape expected_shape(const Shape& shape, std::vector<int64_t> dims, bool keepdim) {
  for (int64_t& d : dims) d = d < 0 ? d + static_cast<int64_t>(shape.size()) : d;
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool reduced = dims.empty() || std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) out.push_back(shape[d]);
    if (reduced && keepdim) out.push_back(1);
  }
  return out;
}

TEST(Reduce, MatchesReferenceOverEveryDimSet) {
  uint64_t seed = 1;
  for (const ReduceCase& c : kReduceCases) {
    for (DType dtype : kFloatDTypes) {
      for (Layout layout : kLayouts) {
        const Tensor a = make_input(kShape, dtype, layout, seed++);
        const std::vector<double> av = values(a);
        for (const auto& dims : kDimSets) {
          for (bool keepdim : {false, true}) {
            const Tensor y = c.run(a, dims, keepdim);
            const std::string what = std::string(c.name) + " " + std::string(dtype_name(dtype)) +
                                     " " + layout_name(layout) + " dims " + shape_to_string(dims) +
                                     (keepdim ? " keepdim" : "");
            EXPECT_EQ(y.shape(), expected_shape(kShape, dims, keepdim)) << what;
            EXPECT_EQ(y.dtype(), dtype) << what;
            std::vector<double> want;
            for (const auto& g : groups(av, kShape, dims)) want.push_back(c.reference(g));
            // F32 results round once from a double accumulator.
            expect_close(y, want, what, 1.0, 1e-5);
          }
        }
      }
    }
  }
}

TEST(Reduce, PermutedInputsReduceLikeTheirCopies) {
  const Tensor a = make_input({4, 9, 5}, DType::F32, Layout::Contiguous, 9).permute({2, 0, 1});
  for (const auto& dims : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}}) {
    EXPECT_TRUE(allclose(sum(a, dims), sum(a.contiguous(), dims), 1e-6, 1e-6));
    EXPECT_TRUE(allclose(var(a, dims), var(a.contiguous(), dims), 1e-6, 1e-6));
  }
}

TEST(Reduce, OutputDtypes) {
  const Tensor i32 = Tensor::from_vector<int32_t>({2147483647, 2147483647, 2147483647});
  const Tensor s = sum(i32);
  EXPECT_EQ(s.dtype(), DType::I64);
  EXPECT_EQ(s.item<int64_t>(), int64_t{3} * 2147483647);  // no I32 overflow
  const Tensor mask = Tensor::from_vector<bool>({true, false, true, true});
  EXPECT_EQ(sum(mask).item<int64_t>(), 3);
  EXPECT_EQ(mean(mask).dtype(), DType::F32);
  EXPECT_FLOAT_EQ(mean(mask).item<float>(), 0.75f);
  EXPECT_EQ(amax(Tensor::from_vector<int64_t>({-5, 9, 2})).item<int64_t>(), 9);
  EXPECT_EQ(amin(Tensor::from_vector<int64_t>({-5, 9, 2})).dtype(), DType::I64);
  EXPECT_EQ(var(Tensor::from_vector<int64_t>({1, 3})).dtype(), DType::F32);
  EXPECT_FLOAT_EQ(var(Tensor::from_vector<int64_t>({1, 3})).item<float>(), 2.0f);
}

TEST(Reduce, ZeroDimAndEmptyInputs) {
  const Tensor scalar = Tensor::full({}, 2.5);
  EXPECT_EQ(sum(scalar).shape(), Shape{});
  EXPECT_EQ(sum(scalar).item<float>(), 2.5f);
  EXPECT_EQ(sum(scalar, {0}, true).shape(), Shape{});
  EXPECT_EQ(sum(Tensor::zeros({0, 3})).item<float>(), 0.0f);
  EXPECT_EQ(sum(Tensor::zeros({0, 3}), {0}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(mean(Tensor::zeros({0})).item<float>()));
}

TEST(Reduce, LongF32SumsKeepF32Accuracy) {
  // A float running sum of 2^22 values of 0.1 drifts by ~1e-3 relative; a double
  // accumulator is exact to the F32 rounding of the result.
  const int64_t n = int64_t{1} << 22;
  const Tensor x = Tensor::full({n}, 0.1, DType::F32);
  const double exact = static_cast<double>(0.1f) * n;
  EXPECT_NEAR(sum(x).item<double>(), exact, exact * 1e-7);
  EXPECT_NEAR(mean(x.view({1024, 4096}), {0}).to_vector<float>()[17], 0.1f, 1e-8);
}

TEST(Reduce, VarianceIsStableUnderALargeMean) {
  std::vector<float> v;
  for (int i = 0; i < 1000; ++i) v.push_back(1e4f + static_cast<float>(i % 2));  // var 0.25
  EXPECT_NEAR(var(Tensor::from_vector(v), {}, 0).item<double>(), 0.25, 1e-6);
  EXPECT_TRUE(std::isinf(var(Tensor::ones({1}), {}, 1).item<float>()) ||
              std::isnan(var(Tensor::ones({1}), {}, 1).item<float>()));
}

TEST(Reduce, MaxAndMinPropagateNaN) {
  const Tensor x = Tensor::from_vector<float>({1, NAN, 3, 2}, {2, 2});
  EXPECT_TRUE(std::isnan(amax(x).item<float>()));
  const std::vector<float> rows = amin(x, {1}).to_vector<float>();
  EXPECT_TRUE(std::isnan(rows[0]));
  EXPECT_EQ(rows[1], 2.0f);
}

// ---- argmax --------------------------------------------------------------------------------

TEST(Argmax, FirstMaximumAlongAnyDimAndLayout) {
  uint64_t seed = 50;
  for (DType dtype : kFloatDTypes) {
    for (Layout layout : kLayouts) {
      // Values on a coarse grid so ties are common.
      const Tensor a = make_input(kShape, dtype, layout, seed++, -2, 2, 1.0);
      const std::vector<double> av = values(a);
      for (int64_t dim : {0, 1, 2, -1}) {
        for (bool keepdim : {false, true}) {
          const Tensor y = argmax(a, dim, keepdim);
          EXPECT_EQ(y.dtype(), DType::I64);
          EXPECT_EQ(y.shape(), expected_shape(kShape, {dim}, keepdim));
          std::vector<double> want;
          for (const auto& g : groups(av, kShape, {dim})) {
            want.push_back(static_cast<double>(std::max_element(g.begin(), g.end()) - g.begin()));
          }
          expect_close(y, want, std::string("argmax ") + std::string(dtype_name(dtype)) + " " +
                                    layout_name(layout) + " dim " + std::to_string(dim), 0.0, 0.0);
        }
      }
    }
  }
}

TEST(Argmax, TiesNaNAndIntegers) {
  EXPECT_EQ(argmax(Tensor::from_vector<float>({1, 3, 3, 2}), 0).item<int64_t>(), 1);
  EXPECT_EQ(argmax(Tensor::from_vector<float>({1, NAN, 5, NAN}), 0).item<int64_t>(), 1);
  EXPECT_EQ(argmax(Tensor::from_vector<int32_t>({4, -1, 7, 7}), -1).item<int64_t>(), 2);
}

// The CUDA argmax combines per-thread (value, index) pairs in a tree with
// scalar::argmax_prefers, the CPU's scan rule: any combination order must give the
// sequential scan's answer (first maximum, first NaN).
TEST(Argmax, PreferenceCombinesInAnyOrderToTheSequentialAnswer) {
  std::vector<float> line(37);
  for (uint64_t trial = 0; trial < 300; ++trial) {
    for (size_t i = 0; i < line.size(); ++i) {
      const uint32_t bits = random::philox4x32(trial, i)[0];
      line[i] = static_cast<float>(bits % 5) - 2.0f;  // many ties
      if (trial % 3 == 0 && bits % 11 == 0) line[i] = NAN;
    }
    const int64_t want = argmax(Tensor::from_vector(line, {static_cast<int64_t>(line.size())}), 0).item<int64_t>();
    // Thread t of `threads` scans t, t + threads, ...; then a halving tree as in reduce.cu.
    for (int threads : {1, 2, 4, 8, 16, 64}) {
      std::vector<float> value(static_cast<size_t>(threads));
      std::vector<int64_t> index(static_cast<size_t>(threads), -1);
      for (int t = 0; t < threads; ++t) {
        for (size_t r = static_cast<size_t>(t); r < line.size(); r += static_cast<size_t>(threads)) {
          const int64_t k = static_cast<int64_t>(r);
          if (index[t] < 0 || backend::scalar::argmax_prefers(line[r], k, value[t], index[t])) {
            value[t] = line[r];
            index[t] = k;
          }
        }
      }
      for (int width = threads / 2; width > 0; width /= 2) {
        for (int t = 0; t < width; ++t) {
          const int o = t + width;
          if (index[o] >= 0 &&
              (index[t] < 0 || backend::scalar::argmax_prefers(value[o], index[o], value[t], index[t]))) {
            value[t] = value[o];
            index[t] = index[o];
          }
        }
      }
      ASSERT_EQ(index[0], want) << "trial " << trial << " with " << threads << " threads";
    }
  }
}

// ---- sorting ---------------------------------------------------------------------------------

// A stable sort of one line by std::stable_sort on doubles with torch.sort's order
// (NaN above every number), the reference for argsort and topk.
std::vector<int64_t> reference_order(const std::vector<double>& line, bool descending) {
  std::vector<int64_t> idx(line.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto less = [](double a, double b) { return std::isnan(a) ? false : (std::isnan(b) || a < b); };
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    const double x = line[static_cast<size_t>(a)], y = line[static_cast<size_t>(b)];
    return descending ? less(y, x) : less(x, y);
  });
  return idx;
}

TEST(Sort, ArgsortIsStableAlongAnyDimInEveryDtype) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool}) {
    // A coarse grid: many ties, which a stable sort keeps in index order.
    const Tensor x = (Tensor::rand({4, 9, 5}, 71, DType::F64) * 6 - 3).to(DType::I64).to(t);
    for (int64_t dim : {0, 1, 2, -1}) {
      for (bool descending : {false, true}) {
        const Tensor got = argsort(x, dim, descending);
        ASSERT_EQ(got.shape(), x.shape());
        ASSERT_EQ(got.dtype(), DType::I64);
        const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
        const Tensor xl = x.transpose(d, 2).to(DType::F64).contiguous(), gl = got.transpose(d, 2).contiguous();
        const std::vector<double> xv = xl.to_vector<double>();
        const std::vector<int64_t> gv = gl.to_vector<int64_t>();
        const int64_t n = x.size(d);
        for (int64_t r = 0; r < x.numel() / n; ++r) {
          const std::vector<double> line(xv.begin() + r * n, xv.begin() + (r + 1) * n);
          const std::vector<int64_t> want = reference_order(line, descending);
          ASSERT_EQ(std::vector<int64_t>(gv.begin() + r * n, gv.begin() + (r + 1) * n), want)
              << dtype_name(t) << " dim " << dim << (descending ? " descending" : "") << " line " << r;
        }
      }
    }
  }
}

TEST(Sort, NaNSignedZerosAndExtremes) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> v = {0.0, NAN, -0.0, -inf, 2.5, inf, -NAN, -1e300, 1e-300, -0.0};
  const Tensor x = Tensor::from_vector(v, {10});
  EXPECT_EQ(argsort(x).to_vector<int64_t>(), reference_order(v, false));
  EXPECT_EQ(argsort(x, 0, true).to_vector<int64_t>(), reference_order(v, true));
  const std::vector<int64_t> ints = {INT64_MIN, 3, -1, INT64_MAX, 0, -1};
  EXPECT_EQ(argsort(Tensor::from_vector(ints, {6})).to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 5, 4, 1, 3}));
  EXPECT_EQ(argsort(Tensor::full({}, 3.0)).item<int64_t>(), 0);
  EXPECT_EQ(argsort(Tensor::zeros({3, 0})).shape(), (Shape{3, 0}));
}

TEST(Sort, TopKIsTheLargestKInOrderWithLowerIndexOnTies) {
  const Tensor x = Tensor::from_vector<float>({1, 5, 3, 5, -2, 0, 7, 7, 7, 1}, {2, 5});
  const TopK top = topk(x, 3);
  EXPECT_EQ(top.values.to_vector<float>(), (std::vector<float>{5, 5, 3, 7, 7, 7}));
  EXPECT_EQ(top.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 2, 1, 2, 3}));
  EXPECT_EQ(top.values.dtype(), DType::F32);
  // Along dim 0, of a strided view, in BF16: values are a's elements, bit for bit.
  const Tensor y = (Tensor::rand({6, 4}, 72, DType::F64) * 8).to(DType::BF16).transpose(0, 1);  // [4, 6]
  const TopK col = topk(y, 2, 0);
  ASSERT_EQ(col.values.shape(), (Shape{2, 6}));
  for (int64_t j = 0; j < 6; ++j) {
    const std::vector<double> line = y.narrow(1, j, 1).to(DType::F64).contiguous().to_vector<double>();
    const std::vector<int64_t> order = reference_order(line, true);
    for (int64_t i = 0; i < 2; ++i) {
      EXPECT_EQ(col.indices.narrow(0, i, 1).narrow(1, j, 1).item<int64_t>(), order[static_cast<size_t>(i)]);
      EXPECT_EQ(col.values.narrow(0, i, 1).narrow(1, j, 1).to(DType::F64).item<double>(),
                line[static_cast<size_t>(order[static_cast<size_t>(i)])]);
    }
  }
  EXPECT_EQ(topk(x, 0).values.shape(), (Shape{2, 0}));
  EXPECT_EQ(topk(Tensor::full({}, 2.0), 1).values.item<float>(), 2.0F);
}

TEST(Sort, BincountCountsIdsInRangeOnly) {
  const Tensor ids = Tensor::from_vector<int64_t>({3, 0, 3, -1, 7, 2, 3, 0}, {8});
  EXPECT_EQ(bincount(ids, 5).to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 1, 3, 0}));
  EXPECT_EQ(bincount(ids.to(DType::I32), 2).to_vector<int64_t>(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(bincount(Tensor::zeros({0}, DType::I64), 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
}

TEST(Sort, ErrorsNameTheOp) {
  expect_invalid([] { topk(Tensor::zeros({2, 3}), 4); }, "[topk] expected 0 <= k <= 3");
  expect_invalid([] { argsort(Tensor::zeros({2, 3}), 2); }, "[argsort] dim 2 out of range");
  expect_invalid([] { bincount(Tensor::zeros({2, 3}, DType::I64), 4); }, "[bincount] expected 1-D ids");
  expect_invalid([] { bincount(Tensor::zeros({3}), 4); }, "[bincount] expected ids of dtype i64 or i32");
}

// ---- errors ----------------------------------------------------------------------------------

TEST(Reduce, ErrorsNameTheOpAndTheDims) {
  const Tensor x = Tensor::zeros({2, 3});
  expect_invalid([&] { sum(x, {1, -1}); }, "[sum] dim 1 appears more than once");
  expect_invalid([&] { mean(x, {2}); }, "[mean] dim 2 out of range");
  expect_invalid([&] { var(x, {0}, -1); }, "[var] expected correction >= 0");
  expect_invalid([] { amax(Tensor::zeros({0, 3}), {0}); }, "[amax] cannot reduce over dim 0 of size 0");
  expect_invalid([] { argmax(Tensor::zeros({4, 0}), 1); }, "[argmax] cannot reduce over dim 1");
  expect_invalid([&] { argmax(x, -3); }, "[argmax] dim -3 out of range");
}

}  // namespace
}  // namespace dtensor::test
