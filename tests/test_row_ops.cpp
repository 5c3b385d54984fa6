// The CUDA row kernels' host-side arithmetic and shared math on the CPU: the line
// plan of softmax (line_plan.h) against the multi-index for strided views, the row
// chunks of the norms' parameter gradients, and row_ops.h's special values. The
// formulas themselves also run in the CPU's scalar loops (cpu/nn.cpp), which
// test_nn_kernels checks against double-precision references for F64 and F16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "backend/line_plan.h"
#include "backend/row_ops.h"
#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"

using namespace dtensor;
using dtensor::backend::LinePlan;
using dtensor::backend::make_line_plan;

namespace {

int64_t naive_offset(const Shape& shape, const Strides& strides, const std::vector<int64_t>& index) {
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d) off += index[d] * strides[d];
  return off;
}

// Every (line, i) of the plan addresses the element whose multi-index has i at `dim`
// and the line's row-major index over the other dims, in both operands.
void expect_lines_match(const Tensor& out, const Tensor& a, int64_t dim) {
  LinePlan<2> plan;
  ASSERT_TRUE(make_line_plan<2>(out.shape(), {out.strides().data(), a.strides().data()}, dim, plan));
  const Shape& shape = out.shape();
  ASSERT_EQ(plan.length, shape[static_cast<size_t>(dim)]);
  ASSERT_EQ(plan.lines * plan.length, out.numel());
  for (int64_t line = 0; line < plan.lines; ++line) {
    std::vector<int64_t> index(shape.size(), 0);
    int64_t rest = line;
    for (size_t d = shape.size(); d-- > 0;) {
      if (static_cast<int64_t>(d) == dim) continue;
      index[d] = rest % shape[d];
      rest /= shape[d];
    }
    int64_t base[2];
    plan.outer.offsets(line, base);
    for (int64_t i = 0; i < plan.length; ++i) {
      index[static_cast<size_t>(dim)] = i;
      ASSERT_EQ(base[0] + i * plan.step[0], naive_offset(shape, out.strides(), index)) << line << " " << i;
      ASSERT_EQ(base[1] + i * plan.step[1], naive_offset(shape, a.strides(), index)) << line << " " << i;
    }
  }
}

}  // namespace

TEST(LinePlan, WorkedExampleOfTheHeader) {
  Tensor x = Tensor::empty({4, 5, 7});
  LinePlan<2> plan;
  ASSERT_TRUE(make_line_plan<2>(x.shape(), {x.strides().data(), x.strides().data()}, 1, plan));
  EXPECT_EQ(plan.lines, 28);
  EXPECT_EQ(plan.length, 5);
  EXPECT_EQ(plan.step[0], 7);
  int64_t base[2];
  plan.outer.offsets(9, base);
  EXPECT_EQ(base[0], 37);
  EXPECT_EQ(base[1], 37);
}

TEST(LinePlan, RandomStridedViewsMatchTheMultiIndex) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 5));
    Tensor out = Tensor::empty(shape);
    // a: a sliced view of a wider buffer, or a transposed one, or a broadcast one.
    Tensor a;
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 0) {
      Shape wide = shape;
      for (auto& s : wide) s = 2 * s + 1;
      a = Tensor::empty(wide);
      for (int d = 0; d < rank; ++d) a = a.slice(d, 1, a.size(d), 2).slice(d, 0, shape[static_cast<size_t>(d)]);
    } else if (kind == 1 && rank >= 2) {
      const int64_t p = static_cast<int64_t>(rng() % rank), q = static_cast<int64_t>(rng() % rank);
      Shape swapped = shape;
      std::swap(swapped[static_cast<size_t>(p)], swapped[static_cast<size_t>(q)]);
      a = Tensor::empty(swapped).transpose(p, q);
    } else {
      Shape one = shape;
      for (auto& s : one) {
        if (rng() % 2) s = 1;
      }
      a = Tensor::empty(one).expand(shape);
    }
    ASSERT_EQ(a.shape(), shape);
    const int64_t dim = static_cast<int64_t>(rng() % rank);
    expect_lines_match(out, a, dim);
  }
}

TEST(LinePlan, EmptyTensorsHaveNoLines) {
  Tensor x = Tensor::empty({3, 0, 2});
  LinePlan<2> plan;
  ASSERT_TRUE(make_line_plan<2>(x.shape(), {x.strides().data(), x.strides().data()}, 1, plan));
  EXPECT_EQ(plan.lines, 0);
  ASSERT_TRUE(make_line_plan<2>(x.shape(), {x.strides().data(), x.strides().data()}, 0, plan));
  EXPECT_EQ(plan.lines, 0);
  EXPECT_EQ(plan.length, 3);
}

TEST(LinePlan, RowBlockThreadsArePowersOfTwoFromAWarpTo512) {
  EXPECT_EQ(backend::row_block_threads(1), 32u);
  EXPECT_EQ(backend::row_block_threads(32), 32u);
  EXPECT_EQ(backend::row_block_threads(33), 64u);
  EXPECT_EQ(backend::row_block_threads(257), 512u);
  EXPECT_EQ(backend::row_block_threads(1 << 20), 512u);
}

TEST(RowChunks, CoverEveryRowOnceWithNonEmptyChunks) {
  const backend::RowChunks example = backend::make_row_chunks(1000, 256, 1024);
  EXPECT_EQ(example.chunks, 4);
  EXPECT_EQ(example.rows_per_chunk, 250);
  EXPECT_EQ(backend::make_row_chunks(0, 256, 1024).chunks, 0);
  for (int64_t rows : {1, 2, 7, 255, 256, 257, 1000, 4097, 100000, 1000003}) {
    for (int64_t target : {1, 16, 256}) {
      for (int64_t cap : {1, 3, 64, 1024}) {
        const backend::RowChunks c = backend::make_row_chunks(rows, target, cap);
        ASSERT_GE(c.chunks, 1);
        ASSERT_LE(c.chunks, cap);
        EXPECT_GE(c.chunks * c.rows_per_chunk, rows) << rows << " " << target << " " << cap;
        EXPECT_LT((c.chunks - 1) * c.rows_per_chunk, rows) << rows << " " << target << " " << cap;  // last non-empty
      }
    }
  }
}

TEST(RowOps, SoftmaxOfSpecialRowsAsTheCpu) {
  using backend::row::log_softmax_value;
  using backend::row::shifted_exp;
  const float inf = std::numeric_limits<float>::infinity();
  // A -inf row: m = -inf, every x - m is NaN.
  EXPECT_TRUE(std::isnan(shifted_exp(-inf, -inf)));
  // An +inf element with m = +inf: NaN; a finite one: exp(-inf) = 0.
  EXPECT_TRUE(std::isnan(shifted_exp(inf, inf)));
  EXPECT_EQ(shifted_exp(1.0f, inf), 0.0f);
  // A NaN maximum wins against everything after it.
  float m = -inf;
  for (float v : {1.0f, std::nanf(""), 5.0f}) m = backend::scalar::reduce_max(m, v);
  EXPECT_TRUE(std::isnan(m));
  // Ordinary values.
  EXPECT_FLOAT_EQ(log_softmax_value(2.0f, 3.0f, backend::row::log_softmax_shift<float>(std::exp(1.0))), -2.0f);
  EXPECT_FLOAT_EQ(backend::row::softmax_value(shifted_exp(3.0f, 3.0f), backend::row::softmax_scale<float>(4.0)), 0.25f);
}

TEST(RowOps, SoftmaxGradientsMatchTheJacobian) {
  // y = softmax([0, ln 3]) = [0.25, 0.75]; dx_i = y_i (g_i - <g, y>).
  const double y0 = 0.25, y1 = 0.75, g0 = 1, g1 = -2, dot = g0 * y0 + g1 * y1;
  EXPECT_DOUBLE_EQ(backend::row::softmax_grad(g0, y0, dot), y0 * (1 - y0) * g0 - y0 * y1 * g1);
  EXPECT_DOUBLE_EQ(backend::row::softmax_grad(g1, y1, dot), -y1 * y0 * g0 + y1 * (1 - y1) * g1);
  // log_softmax: dx_i = g_i - p_i sum g.
  EXPECT_DOUBLE_EQ(backend::row::log_softmax_grad(g0, std::log(y0), g0 + g1), g0 - y0 * (g0 + g1));
}
