// Pointwise ops and copies against double-precision references, on every float dtype
// and on contiguous, transposed, sliced and broadcast inputs of odd sizes.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace dtensor::test {
namespace {

const Shape kShape = {7, 13};

// ---- unary ---------------------------------------------------------------------------

struct UnaryCase {
  UnaryOp op;
  double (*reference)(double);
  double lo, hi;  // input domain
};

double ref_gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

const std::vector<UnaryCase> kUnaryCases = {
    {UnaryOp::Neg, [](double x) { return -x; }, -3, 3},
    {UnaryOp::Abs, [](double x) { return std::fabs(x); }, -3, 3},
    {UnaryOp::Exp, [](double x) { return std::exp(x); }, -3, 3},
    {UnaryOp::Log, [](double x) { return std::log(x); }, 0.1, 3},
    {UnaryOp::Sqrt, [](double x) { return std::sqrt(x); }, 0.1, 3},
    {UnaryOp::Rsqrt, [](double x) { return 1 / std::sqrt(x); }, 0.1, 3},
    {UnaryOp::Tanh, [](double x) { return std::tanh(x); }, -3, 3},
    {UnaryOp::Sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, -6, 6},
    {UnaryOp::Relu, [](double x) { return x > 0 ? x : 0.0; }, -3, 3},
    {UnaryOp::GeluTanh, ref_gelu_tanh, -3, 3},
    {UnaryOp::GeluErf, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -3, 3},
    {UnaryOp::Silu, [](double x) { return x / (1 + std::exp(-x)); }, -3, 3},
    {UnaryOp::Square, [](double x) { return x * x; }, -3, 3},
    {UnaryOp::Reciprocal, [](double x) { return 1 / x; }, 0.5, 2},
};

TEST(Unary, MatchesReferenceOnEveryDtypeAndLayout) {
  uint64_t seed = 1;
  for (const UnaryCase& c : kUnaryCases) {
    for (DType dtype : kFloatDTypes) {
      for (Layout layout : kLayouts) {
        const Tensor x = make_input(kShape, dtype, layout, seed++, c.lo, c.hi);
        const Tensor y = unary(c.op, x);
        EXPECT_EQ(y.dtype(), dtype);
        EXPECT_EQ(y.shape(), kShape);
        std::vector<double> want = values(x);
        for (double& v : want) v = c.reference(v);
        // Cancellation in 1 + tanh/erf near x = -3 costs a few F32 ulps of the result.
        expect_close(y, want,
                     std::string(op_name(c.op)) + " " + std::string(dtype_name(dtype)) + " " +
                         layout_name(layout),
                     4.0, 1e-6);
      }
    }
  }
}

TEST(Unary, NamedFunctionsDispatchToTheirOp) {
  const Tensor x = make_input({3, 5}, DType::F64, Layout::Contiguous, 7, 0.5, 2);
  EXPECT_TRUE(allclose(gelu(x, GeluApprox::Tanh), unary(UnaryOp::GeluTanh, x)));
  EXPECT_TRUE(allclose(gelu(x), unary(UnaryOp::GeluErf, x)));
  EXPECT_TRUE(allclose(rsqrt(x), unary(UnaryOp::Rsqrt, x)));
  EXPECT_TRUE(allclose(-x, neg(x)));
  EXPECT_FALSE(allclose(sqrt(x), rsqrt(x)));
}

TEST(Unary, IntegersKeepTheirDtypeWhereTheResultIsIntegral) {
  const Tensor x = Tensor::from_vector<int64_t>({-3, 0, 5});
  EXPECT_EQ(neg(x).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, -5}));
  EXPECT_EQ(abs(x).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 5}));
  EXPECT_EQ(relu(x).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 5}));
  const Tensor i32 = Tensor::from_vector<int32_t>({-4, 3});
  EXPECT_EQ(square(i32).to_vector<int32_t>(), (std::vector<int32_t>{16, 9}));
}

TEST(Unary, IntegersPromoteToF32ForTranscendentalOps) {
  const Tensor y = exp(Tensor::from_vector<int64_t>({0, 1}));
  EXPECT_EQ(y.dtype(), DType::F32);
  expect_close(y, {1.0, std::exp(1.0)}, "exp(i64)");
  EXPECT_EQ(sqrt(Tensor::from_vector<bool>({true, false})).to_vector<float>(),
            (std::vector<float>{1, 0}));
}

// ---- binary ----------------------------------------------------------------------------

struct BinaryCase {
  BinaryOp op;
  double (*reference)(double, double);
  double a_lo, a_hi, b_lo, b_hi, step;  // step > 0: integral-valued inputs with ties
};

const std::vector<BinaryCase> kBinaryCases = {
    {BinaryOp::Add, [](double a, double b) { return a + b; }, -2, 2, -2, 2, 0},
    {BinaryOp::Sub, [](double a, double b) { return a - b; }, -2, 2, -2, 2, 0},
    {BinaryOp::Mul, [](double a, double b) { return a * b; }, -2, 2, -2, 2, 0},
    {BinaryOp::Div, [](double a, double b) { return a / b; }, -2, 2, 0.5, 2, 0},
    {BinaryOp::Pow, [](double a, double b) { return std::pow(a, b); }, 0.5, 2, -2, 2, 0},
    {BinaryOp::Maximum, [](double a, double b) { return std::max(a, b); }, -2, 2, -2, 2, 0},
    {BinaryOp::Minimum, [](double a, double b) { return std::min(a, b); }, -2, 2, -2, 2, 0},
    {BinaryOp::Eq, [](double a, double b) { return double(a == b); }, -2, 2, -2, 2, 1},
    {BinaryOp::Ne, [](double a, double b) { return double(a != b); }, -2, 2, -2, 2, 1},
    {BinaryOp::Lt, [](double a, double b) { return double(a < b); }, -2, 2, -2, 2, 1},
    {BinaryOp::Le, [](double a, double b) { return double(a <= b); }, -2, 2, -2, 2, 1},
    {BinaryOp::Gt, [](double a, double b) { return double(a > b); }, -2, 2, -2, 2, 1},
    {BinaryOp::Ge, [](double a, double b) { return double(a >= b); }, -2, 2, -2, 2, 1},
};

bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

// b's shapes against a [7, 13]: same shape, a row, a column, a 0-d tensor.
const std::vector<Shape> kOtherShapes = {{7, 13}, {13}, {7, 1}, {}};

TEST(Binary, MatchesReferenceWithBroadcasting) {
  uint64_t seed = 100;
  for (const BinaryCase& c : kBinaryCases) {
    for (DType dtype : kFloatDTypes) {
      for (Layout layout : kLayouts) {
        for (const Shape& b_shape : kOtherShapes) {
          const Tensor a = make_input(kShape, dtype, layout, seed++, c.a_lo, c.a_hi, c.step);
          const Tensor b = uniform_f64(b_shape, seed++, c.b_lo, c.b_hi, c.step).to(dtype);
          const Tensor y = binary(c.op, a, b);
          EXPECT_EQ(y.shape(), kShape);
          EXPECT_EQ(y.dtype(), is_comparison(c.op) ? DType::Bool : dtype);
          const std::vector<double> av = values(a), bv = values(b.expand(kShape));
          std::vector<double> want(av.size());
          for (size_t i = 0; i < av.size(); ++i) want[i] = c.reference(av[i], bv[i]);
          expect_close(y, want,
                       std::string(op_name(c.op)) + " " + std::string(dtype_name(dtype)) + " " +
                           layout_name(layout) + " b=" + shape_to_string(b_shape),
                       2.0, 1e-6);
        }
      }
    }
  }
}

TEST(Binary, ScalarOperandKeepsTheTensorDtype) {
  for (const BinaryCase& c : kBinaryCases) {
    if (is_comparison(c.op)) continue;
    for (DType dtype : kFloatDTypes) {
      const Tensor a = make_input(kShape, dtype, Layout::Sliced, 5, c.a_lo, c.a_hi);
      const double s = c.op == BinaryOp::Pow ? 1.5 : 0.75;
      const Tensor y = binary(c.op, a, s);
      EXPECT_EQ(y.dtype(), dtype);
      std::vector<double> want = values(a);
      for (double& v : want) v = c.reference(v, s);
      expect_close(y, want, std::string(op_name(c.op)) + " scalar " + std::string(dtype_name(dtype)),
                   2.0, 1e-6);
    }
  }
}

TEST(Binary, PromotesDtypes) {
  const Tensor f32 = Tensor::ones({2}, DType::F32), f64 = Tensor::ones({2}, DType::F64);
  const Tensor i64 = Tensor::from_vector<int64_t>({7, -7}), i32 = Tensor::from_vector<int32_t>({2, 2});
  EXPECT_EQ(add(f32, f64).dtype(), DType::F64);
  EXPECT_EQ(add(i64, f32).dtype(), DType::F32);
  EXPECT_EQ(add(Tensor::ones({2}, DType::BF16), Tensor::ones({2}, DType::F16)).dtype(), DType::F32);
  EXPECT_EQ(add(i64, i32).to_vector<int64_t>(), (std::vector<int64_t>{9, -5}));
  // Integer division is true division, in F32.
  EXPECT_EQ(div(i64, i32).to_vector<float>(), (std::vector<float>{3.5f, -3.5f}));
  EXPECT_EQ(pow(i64, i32).to_vector<int64_t>(), (std::vector<int64_t>{49, 49}));
  // An integral scalar keeps integers; a fractional one promotes instead of truncating.
  EXPECT_EQ(mul(i64, 3.0).to_vector<int64_t>(), (std::vector<int64_t>{21, -21}));
  EXPECT_EQ(mul(i64, 0.5).to_vector<float>(), (std::vector<float>{3.5f, -3.5f}));
  EXPECT_EQ(mul(Tensor::ones({2}, DType::BF16), 2.0).dtype(), DType::BF16);
  const Tensor flags = Tensor::from_vector<bool>({true, false});
  EXPECT_EQ(add(flags, flags).to_vector<int64_t>(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(eq(flags, flags).to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ(binary(BinaryOp::Lt, i64, 0.0).to_vector<bool>(), (std::vector<bool>{false, true}));
}

TEST(Binary, MaximumAndMinimumPropagateNaN) {
  const Tensor a = Tensor::from_vector<float>({NAN, 1, 2});
  const Tensor b = Tensor::from_vector<float>({0, NAN, 1});
  for (const Tensor& y : {maximum(a, b), minimum(a, b)}) {
    const std::vector<float> v = y.to_vector<float>();
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]));
  }
  EXPECT_EQ(maximum(a, b).to_vector<float>()[2], 2.0f);
  EXPECT_EQ(minimum(a, b).to_vector<float>()[2], 1.0f);
}

TEST(Binary, OperatorsAndEmptyTensors) {
  const Tensor a = Tensor::from_vector<double>({1, 2, 3});
  EXPECT_EQ(((a + a) * 2.0 - a / a).to_vector<double>(), (std::vector<double>{3, 7, 11}));
  EXPECT_EQ(add(Tensor::zeros({0, 3}), Tensor::ones({3})).shape(), (Shape{0, 3}));
  EXPECT_EQ(add(Tensor::zeros({0, 3}), 1.0).numel(), 0);
}

TEST(Binary, ErrorsNameTheOpAndTheShapes) {
  expect_invalid([] { add(Tensor::zeros({2, 3}), Tensor::zeros({4})); },
                 "[add] shapes [2, 3] and [4] do not broadcast");
  expect_invalid([] { ge(Tensor::zeros({5}), Tensor::zeros({2, 3})); }, "[ge] shapes");
  expect_invalid([] { neg(Tensor::from_vector<bool>({true})); }, "[neg] expected a numeric dtype, got bool");
  expect_invalid([] { mul(Tensor(), 2.0); }, "[mul] expected a defined tensor");
}

// ---- where --------------------------------------------------------------------------------

TEST(Where, SelectsWithBroadcastingAndPromotion) {
  for (DType dtype : kFloatDTypes) {
    for (Layout layout : kLayouts) {
      const Tensor a = make_input(kShape, dtype, layout, 31);
      const Tensor cond = binary(BinaryOp::Gt, make_input({7, 1}, DType::F32, Layout::Contiguous, 32), 0.0);
      const Tensor b = uniform_f64({13}, 33, -2, 2).to(dtype);
      const Tensor y = where(cond, a, b);
      EXPECT_EQ(y.dtype(), dtype);
      const std::vector<double> av = values(a), bv = values(b.expand(kShape)),
                                cv = values(cond.expand(kShape));
      std::vector<double> want(av.size());
      for (size_t i = 0; i < av.size(); ++i) want[i] = cv[i] != 0 ? av[i] : bv[i];
      expect_close(y, want, std::string("where ") + std::string(dtype_name(dtype)) + " " +
                                layout_name(layout), 0.0, 0.0);
    }
  }
  const Tensor mixed = where(Tensor::from_vector<bool>({true, false}),
                             Tensor::from_vector<int64_t>({1, 2}), Tensor::full({}, 0.5));
  EXPECT_EQ(mixed.to_vector<float>(), (std::vector<float>{1.0f, 0.5f}));
}

TEST(Where, RejectsANonBoolCondition) {
  expect_invalid([] { where(Tensor::ones({2}), Tensor::ones({2}), Tensor::ones({2})); },
                 "[where] expected a bool condition, got f32");
  expect_invalid([] { where(Tensor::ones({3}, DType::Bool), Tensor::ones({2}), Tensor::ones({2})); },
                 "[where] shapes [3] and [2] do not broadcast");
}

// ---- copy, fill, random, arange (the copy_fill kernels) ------------------------------------

TEST(Copy, ConvertsBetweenEveryPairOfDtypesOnStridedViews) {
  const std::vector<DType> all = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                  DType::I64, DType::I32, DType::Bool};
  // Integral values in [-3, 3] are exact in every dtype (bool keeps only nonzero-ness).
  const Tensor base = uniform_f64({5, 9}, 41, -3, 3, 1.0);
  for (DType from : all) {
    for (DType to : all) {
      const Tensor src = base.to(from).t();  // strided source
      const Tensor dst = src.to(to);
      std::vector<double> want = values(base.t());
      for (double& v : want) {
        if (from == DType::Bool || to == DType::Bool) v = v != 0 ? 1.0 : 0.0;
      }
      expect_close(dst, want, std::string(dtype_name(from)) + "->" + std::string(dtype_name(to)),
                   0.0, 0.0);
    }
  }
}

TEST(Copy, FloatToIntTruncatesAndNonzeroIsTrue) {
  const Tensor x = Tensor::from_vector<float>({-2.7f, -0.5f, 0.0f, 0.5f, 2.7f});
  EXPECT_EQ(x.to(DType::I64).to_vector<int64_t>(), (std::vector<int64_t>{-2, 0, 0, 0, 2}));
  EXPECT_EQ(x.to(DType::Bool).to_vector<bool>(),
            (std::vector<bool>{true, true, false, true, true}));
}

TEST(Copy, IntoAStridedDestination) {
  Tensor dst = Tensor::zeros({4, 6}, DType::F64);
  Tensor columns = dst.slice(1, 1, 6, 2);  // [4, 3], stride 2
  columns.copy_(Tensor::from_vector<float>({1, 2, 3}, {3}));  // broadcast over rows
  EXPECT_EQ(dst.to_vector<double>()[0], 0.0);
  EXPECT_EQ(dst.to_vector<double>()[1], 1.0);
  EXPECT_EQ(dst.to_vector<double>()[3], 2.0);
  EXPECT_EQ(dst.to_vector<double>()[23], 3.0);
  EXPECT_EQ(sum(dst).item<double>(), 24.0);
}

TEST(Fill, FillsStridedViewsOnly) {
  Tensor t = Tensor::zeros({3, 4}, DType::BF16);
  Tensor column = t.select(1, 2);
  column.fill_(1.5);
  EXPECT_EQ(sum(t).item<double>(), 4.5);
  EXPECT_EQ(t.to(DType::F32).to_vector<float>()[2], 1.5f);
}

TEST(Random, ElementIIsThePhiloxDrawAtIndexI) {
  const Tensor n = Tensor::randn({3, 7}, 1234, DType::F64);
  const Tensor u = Tensor::rand({21}, 99);
  const std::vector<double> nv = n.to_vector<double>();
  const std::vector<float> uv = u.to_vector<float>();
  for (size_t i = 0; i < 21; ++i) {
    EXPECT_EQ(nv[i], static_cast<double>(random::normal(1234, i)));
    EXPECT_EQ(uv[i], random::uniform(99, i));
  }
  // Same seed and index give the same value whatever the shape.
  EXPECT_EQ(Tensor::randn({21}, 1234, DType::F64).to_vector<double>(), nv);
}

TEST(Arange, StartsAndStepsWithoutDrift) {
  EXPECT_EQ(Tensor::arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const std::vector<float> v = Tensor::arange(0.5, 2.0, 0.25).to_vector<float>();
  EXPECT_EQ(v, (std::vector<float>{0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f}));
  const Tensor long_range = Tensor::arange(0.0, 1.0, 1e-6, DType::F64);
  EXPECT_DOUBLE_EQ(long_range.to_vector<double>().back(), 999999 * 1e-6);
}

}  // namespace
}  // namespace dtensor::test
