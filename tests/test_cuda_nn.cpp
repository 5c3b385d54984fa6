// Cross-device conformance of the NN row kernels (label cuda): softmax and
// log_softmax along every dim, the norms, cross entropy and embedding, forward and
// backward, every dtype the CPU op takes, contiguous and strided operands, rows of
// odd lengths and of special values, on CUDA against the CPU's result. Skips with a
// message where no GPU is visible; the shared row math (row_ops.h) and line plan
// are covered on the CPU by test_nn_kernels and test_row_ops.
#include <cmath>
#include <limits>
#include <sstream>

#include "kernel_test_util.h"
#include "test_helpers.h"

using namespace dtensor;
using dtensor::test::Layout;

namespace {

const Device kGpu = Device::cuda(0);

// The same logical input on both devices: one buffer, copied, with one view taken
// on each side (so the GPU kernel sees the strides, not a contiguous copy).
struct Pair {
  Tensor cpu, gpu;
};

Pair input_pair(const Shape& shape, DType dtype, Layout layout, uint64_t seed, double lo = -4, double hi = 4) {
  const size_t n = shape.size();
  Shape buffer = shape;
  if (layout == Layout::Transposed) std::swap(buffer[n - 1], buffer[n - 2]);
  if (layout == Layout::Sliced) buffer[n - 1] = 2 * shape[n - 1] + 1;
  if (layout == Layout::Broadcast) buffer[0] = 1;
  const Tensor host = test::uniform_f64(buffer, seed, lo, hi).to(dtype);
  auto view = [&](const Tensor& t) {
    switch (layout) {
      case Layout::Contiguous: return t;
      case Layout::Transposed: return t.transpose(-1, -2);
      case Layout::Sliced: return t.slice(-1, 1, buffer[n - 1], 2);
      case Layout::Broadcast: return t.expand(shape);
    }
    return t;
  };
  return {view(host), view(host.to(kGpu))};
}

double tolerance(DType t) { return t == DType::BF16 ? 1e-2 : t == DType::F16 ? 2e-3 : t == DType::F32 ? 2e-6 : 1e-13; }

// Element by element: NaN where the CPU has NaN, equal infinities, else within
// tol * (1 + |cpu|) (the 16-bit types: within a rounding step of the CPU's value).
void expect_matches_cpu(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  const std::vector<double> g = test::values(gpu.to(Device::cpu())), c = test::values(cpu);
  size_t bad = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const bool ok = std::isnan(c[i])   ? std::isnan(g[i])
                    : std::isinf(c[i]) ? g[i] == c[i]
                                       : std::abs(g[i] - c[i]) <= tol * (1 + std::abs(c[i]));
    if (!ok && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " on CUDA, " << c[i] << " on the CPU";
  }
  EXPECT_EQ(bad, 0u) << what;
}

std::string name(const char* op, DType t, const char* layout, int64_t dim, const Shape& shape) {
  std::ostringstream s;
  s << op << " " << dtype_name(t) << " " << layout << " dim " << dim << " shape " << shape_to_string(shape);
  return s.str();
}

}  // namespace

TEST(CudaSoftmax, ForwardAndBackwardMatchTheCpuAlongEveryDim) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  // Odd lengths, a line of one element, lines longer than a block (513 threads' worth
  // and more), and many short lines.
  const std::vector<Shape> shapes = {{4, 5, 7}, {3, 1}, {2, 33}, {3, 1500}, {513, 3}, {2, 3, 4, 5}};
  for (const Shape& shape : shapes) {
    for (DType t : test::kFloatDTypes) {
      for (Layout layout : test::kLayouts) {
        const Pair x = input_pair(shape, t, layout, seed++);
        const Pair g = input_pair(shape, t, Layout::Contiguous, seed++, -1, 1);
        for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
          for (bool log : {false, true}) {
            const char* op = log ? "log_softmax" : "softmax";
            const std::string what = name(op, t, test::layout_name(layout), dim, shape);
            const Tensor y_cpu = log ? log_softmax(x.cpu, dim) : softmax(x.cpu, dim);
            const Tensor y_gpu = log ? log_softmax(x.gpu, dim) : softmax(x.gpu, dim);
            expect_matches_cpu(y_gpu, y_cpu, tolerance(t), what);
            // Backward from the same saved output on both sides, with a strided
            // grad_out (transposed) where the shape allows.
            const Tensor y_saved = y_cpu.to(kGpu);
            const Tensor back_cpu = log ? log_softmax_backward(g.cpu, y_cpu, dim) : softmax_backward(g.cpu, y_cpu, dim);
            const Tensor back_gpu =
                log ? log_softmax_backward(g.gpu, y_saved, dim) : softmax_backward(g.gpu, y_saved, dim);
            expect_matches_cpu(back_gpu, back_cpu, tolerance(t) * 4, what + " backward");
          }
        }
      }
    }
  }
}

TEST(CudaSoftmax, BackwardTakesStridedOperands) {
  REQUIRE_GPU();
  for (DType t : test::kFloatDTypes) {
    const Pair y = input_pair({6, 9}, t, Layout::Transposed, 7, 0, 1);
    const Pair g = input_pair({6, 9}, t, Layout::Sliced, 8, -1, 1);
    for (int64_t dim : {0, 1}) {
      expect_matches_cpu(softmax_backward(g.gpu, y.gpu, dim), softmax_backward(g.cpu, y.cpu, dim), tolerance(t) * 4,
                         name("softmax_backward", t, "strided", dim, {6, 9}));
      expect_matches_cpu(log_softmax_backward(g.gpu, y.gpu, dim), log_softmax_backward(g.cpu, y.cpu, dim),
                         tolerance(t) * 4, name("log_softmax_backward", t, "strided", dim, {6, 9}));
    }
  }
}

TEST(CudaSoftmax, SpecialRowsAndLargeLogitsAsTheCpu) {
  REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // Rows: ordinary, large (no overflow), all -inf, one +inf, one NaN, one -inf among
  // finite values, underflowing differences.
  const Tensor rows = Tensor::from_vector<double>({0.5,  -1,   2,    0,     //
                                                   1000, 1001, 999,  998,   //
                                                   -inf, -inf, -inf, -inf,  //
                                                   1,    inf,  2,    3,     //
                                                   1,    nan,  2,    3,     //
                                                   -inf, 1,    2,    3,     //
                                                   0,    -200, -800, 1},
                                                  {7, 4});
  for (DType t : test::kFloatDTypes) {
    const Tensor x = rows.to(t);
    for (bool log : {false, true}) {
      const Tensor cpu = log ? log_softmax(x, 1) : softmax(x, 1);
      const Tensor gpu = log ? log_softmax(x.to(kGpu), 1) : softmax(x.to(kGpu), 1);
      expect_matches_cpu(gpu, cpu, tolerance(t), name(log ? "log_softmax" : "softmax", t, "special", 1, {7, 4}));
    }
  }
}

TEST(CudaSoftmax, EmptyAndScalarInputs) {
  REQUIRE_GPU();
  const Tensor empty = Tensor::empty({0, 5}, DType::F32, kGpu);
  EXPECT_EQ(softmax(empty, 1).shape(), (Shape{0, 5}));
  const Tensor scalar = Tensor::from_vector<float>({3.0f}, Shape{}).to(kGpu);
  expect_matches_cpu(softmax(scalar, 0), softmax(scalar.to(Device::cpu()), 0), 0, "scalar softmax");
}

namespace {

Tensor on(const Tensor& t, Device d) { return t.defined() ? t.to(d) : t; }

}  // namespace

TEST(CudaNorm, LayerNormAndRmsNormMatchTheCpuForwardAndBackward) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  // Odd widths, one column, rows longer than a block, and enough rows for several
  // chunks of the weight/bias gradients' partials (128 rows each).
  const std::vector<Shape> shapes = {{4, 7}, {3, 1}, {5, 33}, {2, 1500}, {300, 65}, {1000, 3}, {2, 3, 8}};
  for (const Shape& shape : shapes) {
    const Shape normalized = {shape.back()};
    for (DType t : test::kFloatDTypes) {
      for (bool rms : {false, true}) {
        for (int params = 0; params < 3; ++params) {  // none, weight, weight and bias
          const Tensor x = test::uniform_f64(shape, seed++, -3, 5).to(t);
          const Tensor g = test::uniform_f64(shape, seed++, -1, 1).to(t);
          std::optional<Tensor> w, b;
          if (params >= 1) w = test::uniform_f64(normalized, seed++, 0.5, 1.5).to(t);
          if (params >= 2 && !rms) b = test::uniform_f64(normalized, seed++, -1, 1).to(t);
          std::optional<Tensor> w_gpu, b_gpu;
          if (w) w_gpu = w->to(kGpu);
          if (b) b_gpu = b->to(kGpu);
          std::ostringstream what;
          what << (rms ? "rms_norm " : "layer_norm ") << dtype_name(t) << " shape " << shape_to_string(shape)
               << " params " << params;
          const NormResult cpu = rms ? rms_norm(x, normalized, w, 1e-5) : layer_norm(x, normalized, w, b, 1e-5);
          const NormResult gpu = rms ? rms_norm(x.to(kGpu), normalized, w_gpu, 1e-5)
                                     : layer_norm(x.to(kGpu), normalized, w_gpu, b_gpu, 1e-5);
          expect_matches_cpu(gpu.out, cpu.out, tolerance(t), what.str() + " out");
          expect_matches_cpu(gpu.rstd, cpu.rstd, tolerance(t == DType::F64 ? t : DType::F32), what.str() + " rstd");
          if (!rms) expect_matches_cpu(gpu.mean, cpu.mean, 1e-6, what.str() + " mean");
          // Backward from the CPU's saved statistics on both sides.
          const NormResult saved{Tensor(), on(cpu.mean, kGpu), cpu.rstd.to(kGpu)};
          const NormGrads back_cpu = rms ? rms_norm_backward(g, x, cpu, normalized, w)
                                         : layer_norm_backward(g, x, cpu, normalized, w, b.has_value());
          const NormGrads back_gpu =
              rms ? rms_norm_backward(g.to(kGpu), x.to(kGpu), saved, normalized, w_gpu)
                  : layer_norm_backward(g.to(kGpu), x.to(kGpu), saved, normalized, w_gpu, b.has_value());
          expect_matches_cpu(back_gpu.grad_input, back_cpu.grad_input, tolerance(t) * 8, what.str() + " grad_input");
          // Column sums over up to 1000 rows: relative to the sum's size.
          const double sum_tol = t == DType::F64 ? 1e-11 : tolerance(t) * (t == DType::F32 ? 50 : 4);
          if (w) expect_matches_cpu(back_gpu.grad_weight, back_cpu.grad_weight, sum_tol, what.str() + " grad_weight");
          if (b) expect_matches_cpu(back_gpu.grad_bias, back_cpu.grad_bias, sum_tol, what.str() + " grad_bias");
          EXPECT_EQ(back_gpu.grad_weight.defined(), w.has_value()) << what.str();
          EXPECT_EQ(back_gpu.grad_bias.defined(), b.has_value()) << what.str();
        }
      }
    }
  }
}

TEST(CudaNorm, ParameterGradientsAreDeterministic) {
  REQUIRE_GPU();
  const Tensor x = test::uniform_f64({777, 96}, 5, -2, 2).to(DType::F32).to(kGpu);
  const Tensor g = test::uniform_f64({777, 96}, 6, -1, 1).to(DType::F32).to(kGpu);
  const Tensor w = Tensor::ones({96}, DType::F32, kGpu), b = Tensor::zeros({96}, DType::F32, kGpu);
  const NormResult saved = layer_norm(x, {96}, w, b, 1e-5);
  const NormGrads first = layer_norm_backward(g, x, saved, {96}, w, true);
  for (int run = 0; run < 3; ++run) {
    const NormGrads again = layer_norm_backward(g, x, saved, {96}, w, true);
    EXPECT_EQ(again.grad_weight.to(Device::cpu()).to_vector<float>(),
              first.grad_weight.to(Device::cpu()).to_vector<float>());
    EXPECT_EQ(again.grad_bias.to(Device::cpu()).to_vector<float>(),
              first.grad_bias.to(Device::cpu()).to_vector<float>());
  }
}

TEST(CudaCrossEntropy, LossesAndGradientsMatchTheCpuWithIgnoredRows) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  // Odd class counts, one class, rows longer than a block, many rows.
  const std::vector<Shape> shapes = {{5, 7}, {4, 1}, {3, 1500}, {600, 11}};
  for (const Shape& shape : shapes) {
    const int64_t rows = shape[0], classes = shape[1];
    for (DType t : test::kFloatDTypes) {
      for (Layout layout : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
        const Pair logits = input_pair(shape, t, layout, seed++, -6, 6);
        std::vector<int64_t> target(static_cast<size_t>(rows));
        for (int64_t n = 0; n < rows; ++n) target[static_cast<size_t>(n)] = n % 3 == 1 ? -100 : (n * 5 + 2) % classes;
        for (DType index : {DType::I64, DType::I32}) {
          const Tensor targets = Tensor::from_vector(target, {rows}).to(index);
          for (LossReduction reduction : {LossReduction::None, LossReduction::Sum, LossReduction::Mean}) {
            const std::string what = name("cross_entropy", t, test::layout_name(layout), 1, shape) + " " +
                                     std::string(dtype_name(index)) + " reduction " +
                                     std::to_string(static_cast<int>(reduction));
            const Tensor cpu = cross_entropy(logits.cpu, targets, reduction);
            const Tensor gpu = cross_entropy(logits.gpu, targets.to(kGpu), reduction);
            expect_matches_cpu(gpu, cpu, tolerance(t) * 4, what);
            const Tensor grad_loss = reduction == LossReduction::None ? test::uniform_f64({rows}, seed++, -1, 1).to(t)
                                                                      : Tensor::full(Shape{}, 0.75, t);
            const Tensor back_cpu = cross_entropy_backward(grad_loss, logits.cpu, targets, reduction);
            const Tensor back_gpu = cross_entropy_backward(grad_loss.to(kGpu), logits.gpu, targets.to(kGpu), reduction);
            expect_matches_cpu(back_gpu, back_cpu, tolerance(t) * 4, what + " backward");
          }
        }
      }
    }
  }
}

TEST(CudaCrossEntropy, BadTargetsGiveTheCpuError) {
  REQUIRE_GPU();
  const Tensor logits = Tensor::zeros({3, 4}, DType::F32, kGpu);
  test::expect_invalid(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}).to(kGpu));
      },
      "[cross_entropy] target 4 at position 1 is outside [0, 4)");
  test::expect_invalid(
      [&] {
        cross_entropy_backward(Tensor::full(Shape{}, 1.0, DType::F32, kGpu), logits,
                               Tensor::from_vector<int32_t>({0, -100, -2}).to(kGpu));
      },
      "[cross_entropy_backward] target -2 at position 2 is outside [0, 4)");
}

TEST(CudaEmbedding, LookupAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 500;
  // Repeated ids (runs of one id in the backward), masked ids outside [0, V) at both
  // ends, odd widths, a width longer than a block.
  const std::vector<std::pair<int64_t, int64_t>> tables = {{7, 5}, {1, 3}, {50, 129}, {300, 1}};
  for (const auto& [rows, width] : tables) {
    for (bool masked : {false, true}) {
      std::vector<int64_t> id;
      for (int64_t n = 0; n < 257; ++n) {
        int64_t v = (n * n + 3 * n) % rows;
        if (masked && n % 7 == 3) v = n % 2 ? -1 - n : rows + n;
        id.push_back(v);
      }
      for (DType index : {DType::I64, DType::I32}) {
        const Tensor ids = Tensor::from_vector(id, {257}).to(index);
        // A strided view of the ids: every other element of a doubled buffer.
        std::vector<int64_t> doubled;
        for (int64_t v : id) doubled.insert(doubled.end(), {v, 0});
        const Tensor wide = Tensor::from_vector(doubled, {514}).to(index);
        for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::Bool}) {
          const std::string what = std::string("embedding ") + std::string(dtype_name(t)) + " " +
                                   std::string(dtype_name(index)) + " [" + std::to_string(rows) + ", " +
                                   std::to_string(width) + "] masked " + std::to_string(masked);
          const Tensor table = test::uniform_f64({rows, width}, seed++, -3, 3).to(t);
          expect_matches_cpu(embedding(table.to(kGpu), ids.to(kGpu), masked), embedding(table, ids, masked), 0, what);
          // A transposed (column-strided) table and strided ids.
          const Tensor buffer = test::uniform_f64({width, rows}, seed++, -3, 3).to(t);
          expect_matches_cpu(embedding(buffer.to(kGpu).transpose(0, 1), ids.to(kGpu), masked),
                             embedding(buffer.transpose(0, 1), ids, masked), 0, what + " transposed table");
          expect_matches_cpu(embedding(table.to(kGpu), wide.to(kGpu).slice(0, 0, 514, 2), masked),
                             embedding(table, ids, masked), 0, what + " strided ids");
          if (!is_floating(t)) continue;
          const Tensor g = test::uniform_f64({257, width}, seed++, -1, 1).to(t);
          const Tensor back_cpu = embedding_backward(g, ids, rows, masked);
          expect_matches_cpu(embedding_backward(g.to(kGpu), ids.to(kGpu), rows, masked), back_cpu, tolerance(t),
                             what + " backward");
          // A transposed grad_out.
          const Tensor g_t = g.transpose(0, 1).contiguous().to(kGpu).transpose(0, 1);
          expect_matches_cpu(embedding_backward(g_t, ids.to(kGpu), rows, masked), back_cpu, tolerance(t),
                             what + " backward, strided grad_out");
        }
      }
    }
  }
}

TEST(CudaEmbedding, BadIdsGiveTheCpuErrorAndBackwardIsDeterministic) {
  REQUIRE_GPU();
  const Tensor table = Tensor::ones({4, 3}, DType::F32, kGpu);
  const Tensor ids = Tensor::from_vector<int64_t>({-1, 2, 4}).to(kGpu);
  test::expect_invalid([&] { embedding(table, ids); }, "[embedding] id -1 at position 0 is outside [0, 4)");
  test::expect_invalid(
      [&] {
        embedding_backward(Tensor::ones({3, 3}, DType::F32, kGpu), ids, 4);
      },
      "[embedding_backward] id -1 at position 0 is outside [0, 4)");
  // Many repeats of few ids: the same bits every run.
  std::vector<int64_t> many(20000);
  for (size_t n = 0; n < many.size(); ++n) many[n] = static_cast<int64_t>((n * 7919) % 13);
  const Tensor rep = Tensor::from_vector(many, {20000}).to(kGpu);
  const Tensor g = test::uniform_f64({20000, 64}, 9, -1, 1).to(DType::F32).to(kGpu);
  const std::vector<float> first = embedding_backward(g, rep, 13).to(Device::cpu()).to_vector<float>();
  for (int run = 0; run < 3; ++run) {
    EXPECT_EQ(embedding_backward(g, rep, 13).to(Device::cpu()).to_vector<float>(), first);
  }
}
