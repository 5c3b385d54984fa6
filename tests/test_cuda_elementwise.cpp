// Cross-device conformance of the elementwise ops and reductions (label cuda): every
// op and dtype on CUDA against the CPU result, on contiguous, broadcast and strided
// operands.
// Skips with a message where no GPU is visible; the shared scalar math and the
// launcher's index arithmetic are covered on the CPU by the pointwise suites and
// test_offset_calc (the reduction plan too).
#include "test_helpers.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

// Values in (lo, hi), reproducible, of `dtype`.
Tensor values(const Shape& shape, DType dtype, double lo, double hi, uint64_t seed) {
  Tensor u = Tensor::rand(shape, seed);
  return (u * (hi - lo) + lo).to(dtype);
}

void expect_same(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  Tensor back = gpu.to(Device::cpu());
  ASSERT_EQ(back.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(back.shape(), cpu.shape()) << what;
  EXPECT_TRUE(allclose(back.to(DType::F64), cpu.to(DType::F64), tol, tol)) << what;
}

double tolerance(DType t) { return t == DType::BF16 ? 2e-2 : t == DType::F16 ? 2e-3 : t == DType::F32 ? 1e-5 : 1e-12; }

}  // namespace

TEST(CudaElementwise, UnaryOpsMatchTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    Tensor x = values({33, 17}, t, 0.1, 3.0, 1);
    Tensor g = x.to(kGpu);
    for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt,
                       UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::GeluTanh, UnaryOp::GeluErf,
                       UnaryOp::Silu, UnaryOp::Square, UnaryOp::Reciprocal}) {
      expect_same(unary(op, g), unary(op, x), tolerance(t),
                  std::string(op_name(op)) + " " + std::string(dtype_name(t)));
      // A transposed (strided) input.
      expect_same(unary(op, g.transpose(0, 1)), unary(op, x.transpose(0, 1)), tolerance(t),
                  std::string(op_name(op)) + " transposed");
    }
  }
  Tensor ints = Tensor::from_vector<int64_t>({-3, 0, 5, 1LL << 40}, {4});
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Square}) {
    expect_same(unary(op, ints.to(kGpu)), unary(op, ints), 0, op_name(op));
  }
}

TEST(CudaElementwise, BinaryOpsBroadcastAndCompareLikeTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32}) {
    const bool integral = is_integral(t);
    Tensor a = values({4, 1, 6}, t, integral ? -5 : 0.5, integral ? 9 : 2.5, 2);
    Tensor b = values({3, 1}, t, integral ? 1 : 0.5, integral ? 4 : 2.5, 3);
    for (BinaryOp op :
         {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow, BinaryOp::Maximum,
          BinaryOp::Minimum, BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt, BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge}) {
      const std::string what = std::string(op_name(op)) + " " + std::string(dtype_name(t));
      expect_same(binary(op, a.to(kGpu), b.to(kGpu)), binary(op, a, b), tolerance(t) * 10, what);
      expect_same(binary(op, a.to(kGpu), 2.0), binary(op, a, 2.0), tolerance(t) * 10, what + " scalar");
    }
  }
  Tensor nan = Tensor::from_vector<float>({std::nanf(""), 1.0f}, {2});
  Tensor one = Tensor::from_vector<float>({0.0f, std::nanf("")}, {2});
  Tensor m = maximum(nan.to(kGpu), one.to(kGpu)).to(Device::cpu());
  EXPECT_TRUE(std::isnan(m.to_vector<float>()[0]) && std::isnan(m.to_vector<float>()[1]));  // NaN wins
}

TEST(CudaElementwise, CopiesConvertEveryDtypePairLikeTheCpu) {
  REQUIRE_GPU();
  const std::vector<DType> all = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool};
  Tensor base = Tensor::from_vector<double>({-2.75, -1, 0, 0.5, 1.5, 3.999, 100, 65504}, {2, 4});
  for (DType from : all) {
    Tensor src = base.to(from);
    for (DType to : all) {
      const std::string what = std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to));
      expect_same(src.to(kGpu).to(to), src.to(to), 0, what);
      // Strided destination and source: a transposed copy_ on the device.
      Tensor dst = Tensor::zeros({4, 2}, to, kGpu);
      dst.copy_(src.to(kGpu).transpose(0, 1));
      expect_same(dst, src.transpose(0, 1).to(to), 0, what + " transposed");
    }
  }
}

TEST(CudaElementwise, FillsAndWhereMoveTheCpusBits) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool}) {
    expect_same(Tensor::full({5, 3}, 1.3, t, kGpu), Tensor::full({5, 3}, 1.3, t), 0, std::string(dtype_name(t)));
    Tensor half = Tensor::zeros({6, 4}, t, kGpu).slice(1, 0, 4, 2);  // a strided destination
    half.fill_(1.0);
    expect_same(half, Tensor::ones({6, 2}, t), 0, "strided fill");
    Tensor c = Tensor::from_vector<bool>({true, false, true}, {3, 1});
    Tensor a = Tensor::full({1, 4}, 7, t);
    Tensor b = Tensor::full({3, 4}, 2, t);
    expect_same(where(c.to(kGpu), a.to(kGpu), b.to(kGpu)), where(c, a, b), 0, "where");
  }
}

TEST(CudaElementwise, ActivationBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    // Both tails of the activations and the curved middle.
    Tensor x = values({33, 17}, t, -6, 6, 11);
    Tensor g = values({33, 17}, t, -1, 1, 12);
    const Tensor xg = x.to(kGpu), gg = g.to(kGpu);
    const std::string dt(dtype_name(t));
    for (GeluApprox approx : {GeluApprox::None, GeluApprox::Tanh}) {
      const std::string what = std::string(approx == GeluApprox::Tanh ? "gelu tanh " : "gelu erf ") + dt;
      expect_same(gelu_backward(gg, xg, approx), gelu_backward(g, x, approx), tolerance(t), what);
      // Strided operands (the CPU then takes its scalar loop, the same formulas).
      expect_same(gelu_backward(gg.transpose(0, 1), xg.transpose(0, 1), approx),
                  gelu_backward(g.transpose(0, 1), x.transpose(0, 1), approx), tolerance(t), what + " transposed");
    }
    expect_same(silu_backward(gg, xg), silu_backward(g, x), tolerance(t), "silu " + dt);
    expect_same(silu_backward(gg.transpose(0, 1), xg.transpose(0, 1)),
                silu_backward(g.transpose(0, 1), x.transpose(0, 1)), tolerance(t), "silu transposed " + dt);
  }
  // The two GELU derivatives differ by more than the F32 tolerance: a swapped op fails.
  Tensor x = values({64}, DType::F32, -3, 3, 13).to(kGpu), g = Tensor::ones({64}, DType::F32, kGpu);
  EXPECT_FALSE(allclose(gelu_backward(g, x, GeluApprox::None).to(Device::cpu()),
                        gelu_backward(g, x, GeluApprox::Tanh).to(Device::cpu()), 1e-5, 1e-5));
}

TEST(CudaElementwise, MixedDevicesFailClearly) {
  REQUIRE_GPU();
  Tensor g = Tensor::ones({2, 2}, DType::F32, kGpu);
  EXPECT_THROW_MSG(add(g, Tensor::ones({2, 2})), std::invalid_argument, "devices differ: cuda:0 and cpu");
  EXPECT_THROW_MSG(matmul(g, Tensor::ones({2, 2})), std::invalid_argument, "devices differ");
}

TEST(CudaReduce, SumMeanMaxMinMatchTheCpuOverAnyDims) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool}) {
    const std::string dt(dtype_name(t));
    Tensor a = values({5, 7, 300}, t, -4, 4, 21);
    Tensor g = a.to(kGpu);
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{2}, {0}, {0, 2}, {1}, {0, 1, 2}}) {
      const std::string what = dt + " over " + std::to_string(dims.size()) + " dims from " + std::to_string(dims[0]);
      const double tol = t == DType::BF16 ? 2e-2 : t == DType::F16 ? 2e-3 : 1e-6;
      expect_same(sum(g, dims), sum(a, dims), tol, "sum " + what);
      expect_same(mean(g, dims), mean(a, dims), tol, "mean " + what);
      expect_same(amax(g, dims), amax(a, dims), 0, "max " + what);
      expect_same(amin(g, dims), amin(a, dims), 0, "min " + what);
    }
    // A transposed (strided) input.
    expect_same(sum(g.transpose(0, 2), {1}), sum(a.transpose(0, 2), {1}), 1e-3, "sum transposed " + dt);
  }
  Tensor nan = Tensor::from_vector<float>({1, std::nanf(""), 3}, {3});
  EXPECT_TRUE(std::isnan(amax(nan.to(kGpu)).item<float>()));  // NaN wins, as on the CPU
}

TEST(CudaReduce, VarAndArgmaxMatchTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool}) {
    const std::string dt(dtype_name(t));
    // A mean far from zero against the spread: the two passes must not cancel. Integer
    // values on a coarse grid give argmax many ties; rows of 300 span every thread.
    Tensor a = is_floating(t) ? values({5, 7, 300}, t, 96, 104, 31) : values({5, 7, 300}, t, -3, 3, 31);
    Tensor g = a.to(kGpu);
    const double tol = t == DType::BF16 ? 2e-2 : t == DType::F16 ? 2e-3 : t == DType::F64 ? 1e-10 : 1e-5;
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{2}, {0}, {0, 2}, {1}, {0, 1, 2}}) {
      for (int64_t correction : {0, 1, 2}) {
        const std::string what = "var " + dt + " correction " + std::to_string(correction) + " over " +
                                 std::to_string(dims.size()) + " dims from " + std::to_string(dims[0]);
        expect_same(var(g, dims, correction), var(a, dims, correction), tol, what);
      }
    }
    expect_same(var(g.transpose(0, 2), {1}), var(a.transpose(0, 2), {1}), tol, "var transposed " + dt);
    for (int64_t dim : {0, 1, 2}) {
      expect_same(argmax(g, dim), argmax(a, dim), 0, "argmax " + dt + " dim " + std::to_string(dim));
      expect_same(argmax(g.transpose(0, 2), dim), argmax(a.transpose(0, 2), dim), 0, "argmax transposed " + dt);
    }
  }
  // NaN wins, the first one: NaNs at 5 and 280 are seen by threads 5 and 24.
  std::vector<float> row(300, 1.0f);
  row[280] = row[5] = std::nanf("");
  row[100] = 7.0f;
  EXPECT_EQ(argmax(Tensor::from_vector(row, {300}).to(kGpu), 0).to(Device::cpu()).item<int64_t>(), 5);
  // Ties across threads: the first maximum, as on the CPU.
  std::vector<float> ties(300, 0.0f);
  ties[290] = ties[37] = ties[200] = 3.0f;
  EXPECT_EQ(argmax(Tensor::from_vector(ties, {300}).to(kGpu), 0).to(Device::cpu()).item<int64_t>(), 37);
  // No deviations left (n - correction <= 0): the CPU's inf/NaN.
  Tensor one = Tensor::full({1, 3}, 2.0, DType::F32);
  EXPECT_TRUE(std::isnan(var(one.to(kGpu), {0}, 1).to(Device::cpu()).to_vector<float>()[0]));
  EXPECT_TRUE(
      std::isinf(var(Tensor::from_vector<float>({1, 3}, {2}).to(kGpu), {0}, 2).to(Device::cpu()).item<float>()));
}

TEST(CudaSort, ArgsortTopkAndBincountMatchTheCpu) {
  REQUIRE_GPU();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool}) {
    const std::string dt(dtype_name(t));
    // Many ties (a coarse grid) and rows longer than a block; the sort is stable on
    // both devices, so the indices agree exactly.
    const Tensor a = values({3, 5, 700}, t, -4, 4, 41).to(DType::I64).to(t);
    const Tensor g = a.to(kGpu);
    for (int64_t dim : {0, 1, 2}) {
      for (bool descending : {false, true}) {
        expect_same(argsort(g, dim, descending), argsort(a, dim, descending), 0,
                    "argsort " + dt + " dim " + std::to_string(dim));
      }
      expect_same(topk(g, 2, dim).indices, topk(a, 2, dim).indices, 0, "topk " + dt);
      expect_same(topk(g, 2, dim).values, topk(a, 2, dim).values, 0, "topk values " + dt);
    }
    expect_same(argsort(g.transpose(0, 2), 1), argsort(a.transpose(0, 2), 1), 0, "argsort transposed " + dt);
  }
  std::vector<double> special = {0.0, std::nan(""), -0.0, -1e308, 3.0, -std::nan(""), 1e-300, -0.0};
  const Tensor s = Tensor::from_vector(special, {8});
  expect_same(argsort(s.to(kGpu)), argsort(s), 0, "argsort NaN and signed zeros");
  expect_same(argsort(s.to(kGpu), 0, true), argsort(s, 0, true), 0, "argsort NaN descending");
  const Tensor ids = values({5000}, DType::F64, -3, 70, 42).to(DType::I64);
  expect_same(bincount(ids.to(kGpu), 64), bincount(ids, 64), 0, "bincount");
  expect_same(bincount(ids.to(DType::I32).to(kGpu), 64), bincount(ids.to(DType::I32), 64), 0, "bincount i32");
}
