// matmul / linear against a naive double-precision reference: contiguous, transposed
// and sliced operands, batches with broadcasting, 1-D operands, every float dtype.
#include "test_helpers.h"

using namespace dtensor;
using dtensor::testing::at;

namespace {

// Reference [..., m, k] @ [..., k, n] for 2-D or equal-batch 3-D operands, in double.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b) {
  const bool batched = a.dim() == 3 || b.dim() == 3;
  const int64_t batch = batched ? std::max(a.dim() == 3 ? a.size(0) : 1, b.dim() == 3 ? b.size(0) : 1) : 1;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  std::vector<double> out;
  for (int64_t p = 0; p < batch; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double x = a.dim() == 3 ? at(a, {a.size(0) == 1 ? 0 : p, i, q}) : at(a, {i, q});
          const double y = b.dim() == 3 ? at(b, {b.size(0) == 1 ? 0 : p, q, j}) : at(b, {q, j});
          acc += x * y;
        }
        out.push_back(acc);
      }
    }
  }
  return out;
}

double tolerance(DType t) { return t == DType::F64 ? 1e-12 : t == DType::F32 ? 1e-5 : t == DType::F16 ? 2e-3 : 1.6e-2; }

void expect_matches(const Tensor& got, const std::vector<double>& want, DType dtype) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  std::vector<double> g = got.to(DType::F64).to_vector<double>();
  // The output is rounded to dtype once, so scale the tolerance by the magnitude.
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(g[i], want[i], tolerance(dtype) * (1 + std::fabs(want[i]))) << "element " << i;
  }
}

// Same shape, dtype and values, bit for bit (F32 and F64 values convert to F64 exactly).
bool identical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         a.to(DType::F64).to_vector<double>() == b.to(DType::F64).to_vector<double>();
}

}  // namespace

class MatmulDtypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulDtypes, ContiguousStridedAndOddSizes) {
  const DType dt = GetParam();
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 5, 7}, {17, 9, 33}, {64, 31, 2}}) {
    // Values rounded to the dtype first, so the reference sees the same inputs.
    Tensor a = Tensor::randn({m, k}, 1, dt);
    Tensor b = Tensor::randn({k, n}, 2, dt);
    expect_matches(matmul(a, b), reference_matmul(a, b), dt);
    // Transposed operands (BLAS Trans, no copies) and sliced rows (leading dim > cols).
    Tensor at_ = Tensor::randn({k, m}, 3, dt).t();
    Tensor bt = Tensor::randn({n, k}, 4, dt).t();
    expect_matches(matmul(at_, bt), reference_matmul(at_, bt), dt);
    Tensor wide = Tensor::randn({m, k + 3}, 5, dt).slice(1, 1, k + 1);
    expect_matches(matmul(wide, b), reference_matmul(wide, b), dt);
    // Every other column: no unit stride, copied before BLAS.
    Tensor strided = Tensor::randn({m, 2 * k}, 6, dt).slice(1, 0, 2 * k, 2);
    expect_matches(matmul(strided, b), reference_matmul(strided, b), dt);
  }
}

TEST_P(MatmulDtypes, BatchedAndBroadcast) {
  const DType dt = GetParam();
  Tensor a = Tensor::randn({3, 4, 5}, 7, dt);
  Tensor b = Tensor::randn({3, 5, 2}, 8, dt);
  expect_matches(matmul(a, b), reference_matmul(a, b), dt);
  Tensor b1 = Tensor::randn({1, 5, 2}, 9, dt);  // broadcast batch
  Tensor out = matmul(a, b1);
  EXPECT_EQ(out.shape(), (Shape{3, 4, 2}));
  expect_matches(out, reference_matmul(a, b1), dt);
  Tensor w = Tensor::randn({5, 6}, 10, dt);  // [B, m, k] @ [k, n]: one stacked GEMM
  Tensor y = matmul(a, w);
  EXPECT_EQ(y.shape(), (Shape{3, 4, 6}));
  expect_matches(y, reference_matmul(a.reshape({12, 5}), w), dt);
  Tensor bt = Tensor::randn({3, 2, 5}, 11, dt).transpose(1, 2);  // transposed batch operand
  expect_matches(matmul(a, bt), reference_matmul(a, bt), dt);
}

INSTANTIATE_TEST_SUITE_P(AllFloat, MatmulDtypes, ::testing::Values(DType::F32, DType::F64, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Matmul, VectorsAndBatchBroadcastAcrossRanks) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor m = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(matmul(a, m).to_vector<float>(), (std::vector<float>{4, 5}));
  EXPECT_EQ(matmul(m.t(), a).to_vector<float>(), (std::vector<float>{4, 5}));
  EXPECT_EQ(matmul(a, a).dim(), 0);
  EXPECT_EQ(matmul(a, a).item<float>(), 14.0f);
  Tensor x = Tensor::randn({2, 1, 3, 4}, 1);
  Tensor y = Tensor::randn({5, 4, 2}, 2);
  EXPECT_EQ(matmul(x, y).shape(), (Shape{2, 5, 3, 2}));
  EXPECT_EQ(matmul(Tensor::zeros({2, 0}), Tensor::zeros({0, 3})).to_vector<float>(), std::vector<float>(6, 0));
}

TEST(Matmul, LinearMatchesMatmulPlusBias) {
  Tensor x = Tensor::randn({2, 3, 4}, 1);
  Tensor w = Tensor::randn({5, 4}, 2);
  Tensor b = Tensor::from_vector<float>({1, 2, 3, 4, 5});
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  std::vector<double> ref = reference_matmul(x.reshape({6, 4}), w.t());
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += static_cast<double>(i % 5 + 1);
  expect_matches(y, ref, DType::F32);
  EXPECT_THROW_MSG(linear(x, Tensor::zeros({5, 3}), std::nullopt), std::invalid_argument,
                   "[linear] input features differ: x is [2, 3, 4], weight is [5, 3]");
  EXPECT_THROW_MSG(linear(x, w, Tensor::zeros({4})), std::invalid_argument, "[linear] expected bias [5], got [4]");
}

// The bias epilogue: F32 and F64 bit-identical to the GEMM followed by an add, for
// sizes that split into several tiles and tasks, transposed and sliced inputs,
// 1-D inputs and an empty contraction; BF16 and F16 within one rounding.
TEST(Matmul, LinearBiasEpilogueEqualsMatmulThenAdd) {
  for (DType dt : {DType::F32, DType::F64}) {
    for (auto [rows, k, n] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {6, 4, 5}, {70, 300, 130}, {257, 64, 96}}) {
      const Tensor w = Tensor::randn({n, k}, 2, dt), b = Tensor::randn({n}, 3, dt);
      const Tensor x = Tensor::randn({rows, k}, 1, dt);
      const Tensor xt = Tensor::randn({k, rows}, 4, dt).t();                     // transposed view
      const Tensor xs = Tensor::randn({rows, k + 2}, 5, dt).slice(1, 1, k + 1);  // leading dim > k
      for (const Tensor& in : {x, xt, xs}) {
        EXPECT_TRUE(identical(linear(in, w, b), add(matmul(in, w.t()), b)))
            << dtype_name(dt) << " " << rows << "x" << k << "x" << n;
      }
      if (rows % 2 == 0) {  // a batch of row slices: x is copied into one [rows, k] block
        const Tensor xb = x.reshape({2, rows / 2, k}).slice(1, 0, rows / 4 + 1);
        EXPECT_TRUE(identical(linear(xb, w, b), add(matmul(xb, w.t()), b)));
      }
    }
    const Tensor v = Tensor::randn({4}, 6, dt), w = Tensor::randn({3, 4}, 7, dt), b = Tensor::randn({3}, 8, dt);
    EXPECT_EQ(linear(v, w, b).shape(), (Shape{3}));
    EXPECT_TRUE(identical(linear(v, w, b), add(matmul(v, w.t()), b)));
    // k == 0: an empty sum, so every row is the bias.
    const Tensor bias = Tensor::randn({3}, 9, dt);
    EXPECT_TRUE(identical(linear(Tensor::zeros({2, 5, 0}, dt), Tensor::zeros({3, 0}, dt), bias),
                          bias.expand({2, 5, 3}).contiguous()));
    EXPECT_EQ(linear(Tensor::zeros({0, 4}, dt), Tensor::zeros({3, 4}, dt), bias).shape(), (Shape{0, 3}));
  }
  for (DType dt : {DType::BF16, DType::F16}) {
    const Tensor x = Tensor::randn({70, 40}, 1, dt), w = Tensor::randn({130, 40}, 2, dt);
    const Tensor b = Tensor::randn({130}, 3, dt);
    const Tensor y = linear(x, w, b);
    EXPECT_EQ(y.dtype(), dt);
    std::vector<double> ref = reference_matmul(x, w.t());
    const std::vector<double> bias = b.to(DType::F64).to_vector<double>();
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += bias[i % 130];
    expect_matches(y, ref, dt);
  }
}

// A bias of another dtype promotes as add() does; one on another device is add()'s error.
TEST(Matmul, LinearBiasOfAnotherDtypePromotes) {
  const Tensor x = Tensor::randn({3, 4}, 1), w = Tensor::randn({5, 4}, 2);
  const Tensor b = Tensor::randn({5}, 3, DType::F64);
  const Tensor y = linear(x, w, b);
  EXPECT_EQ(y.dtype(), DType::F64);
  EXPECT_TRUE(identical(y, add(matmul(x, w.t()), b)));
}

// linear_gelu: the GELU in the bias epilogue's task, bit for bit linear then gelu
// (F32 and BF16 through the epilogue, either GELU form, with and without a bias,
// sizes over several tiles and tasks, transposed inputs and 1-D ones; F64, F16 and an
// empty contraction through the two ops), and linear's output as `pre`.
TEST(Matmul, LinearGeluEqualsLinearThenGelu) {
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::F16}) {
    for (GeluApprox approx : {GeluApprox::Tanh, GeluApprox::None}) {
      for (auto [rows, k, n] :
           std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {6, 4, 5}, {70, 300, 130}, {257, 64, 96}}) {
        const Tensor w = Tensor::randn({n, k}, 2, dt), b = Tensor::randn({n}, 3, dt);
        const Tensor x = Tensor::randn({rows, k}, 1, dt);
        const Tensor xt = Tensor::randn({k, rows}, 4, dt).t();
        for (const Tensor& in : {x, xt}) {
          for (const std::optional<Tensor>& bias : {std::optional<Tensor>(b), std::optional<Tensor>()}) {
            const LinearGeluResult r = linear_gelu(in, w, bias, approx);
            const Tensor want_pre = linear(in, w, bias);
            EXPECT_TRUE(identical(r.pre, want_pre)) << dtype_name(dt) << " " << rows << "x" << k << "x" << n;
            EXPECT_TRUE(identical(r.out, gelu(want_pre, approx)))
                << dtype_name(dt) << " " << rows << "x" << k << "x" << n << (bias ? " bias" : "")
                << (approx == GeluApprox::Tanh ? " tanh" : " erf");
          }
        }
      }
      const Tensor v = Tensor::randn({4}, 6, dt), w = Tensor::randn({3, 4}, 7, dt), b = Tensor::randn({3}, 8, dt);
      const LinearGeluResult r = linear_gelu(v, w, b, approx);
      EXPECT_EQ(r.out.shape(), (Shape{3}));
      EXPECT_TRUE(identical(r.out, gelu(linear(v, w, b), approx)));
      const Tensor batched = Tensor::randn({2, 3, 4}, 9, dt);
      EXPECT_EQ(linear_gelu(batched, w, b, approx).out.shape(), (Shape{2, 3, 3}));
      EXPECT_TRUE(identical(linear_gelu(batched, w, b, approx).out, gelu(linear(batched, w, b), approx)));
      const Tensor empty = linear_gelu(Tensor::zeros({2, 0}, dt), Tensor::zeros({3, 0}, dt), b, approx).out;
      EXPECT_TRUE(identical(empty, gelu(b.expand({2, 3}).contiguous(), approx)));
    }
  }
  const Tensor x = Tensor::randn({2, 4}, 1), w = Tensor::randn({3, 4}, 2);
  EXPECT_THROW_MSG(linear_gelu(x, Tensor::zeros({3, 5}), std::nullopt), std::invalid_argument,
                   "[linear_gelu] input features differ: x is [2, 4], weight is [3, 5]");
  EXPECT_THROW_MSG(linear_gelu(x, w, Tensor::zeros({4})), std::invalid_argument,
                   "[linear_gelu] expected bias [3], got [4]");
  // A bias of another dtype: linear's promotion, then the GELU.
  const Tensor b64 = Tensor::randn({3}, 3, DType::F64);
  EXPECT_TRUE(identical(linear_gelu(x, w, b64).out, gelu(linear(x, w, b64))));
}

TEST(Matmul, BadInputsThrowWithShapes) {
  EXPECT_THROW_MSG(matmul(Tensor::zeros({4, 8}), Tensor::zeros({6, 3})), std::invalid_argument,
                   "[matmul] inner dims differ: a is [4, 8], b is [6, 3]");
  EXPECT_THROW_MSG(matmul(Tensor::zeros({2, 2}), Tensor::zeros({2, 2}, DType::F64)), std::invalid_argument,
                   "[matmul] dtypes differ: a is f32, b is f64");
  EXPECT_THROW_MSG(matmul(Tensor::zeros({2, 2}, DType::I64), Tensor::zeros({2, 2}, DType::I64)), std::invalid_argument,
                   "[matmul] expected a floating dtype, got i64");
  EXPECT_THROW_MSG(matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 2})), std::invalid_argument,
                   "do not broadcast");
  EXPECT_THROW_MSG(matmul(Tensor::scalar(1.0f), Tensor::zeros({2})), std::invalid_argument,
                   "[matmul] expected tensors with at least 1 dim");
}
