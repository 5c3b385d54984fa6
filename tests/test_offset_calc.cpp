// The CUDA elementwise launcher's index arithmetic (backend/offset_calc.h) on the
// CPU: for views of every kind (transposed, sliced, broadcast, size-1 dims) the
// offsets of each linear index equal the ones computed from the multi-index.
#include <gtest/gtest.h>

#include <random>

#include "backend/offset_calc.h"
#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"

using namespace dtensor;
using dtensor::backend::make_offset_calc;
using dtensor::backend::OffsetCalc;

namespace {

// The offset of row-major element `linear` of `shape` in a tensor of `strides`.
int64_t naive_offset(const Shape& shape, const Strides& strides, int64_t linear) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (linear % shape[d]) * strides[d];
    linear /= shape[d];
  }
  return off;
}

void expect_offsets_match(const Tensor& out, const Tensor& a, const Tensor& b) {
  ASSERT_EQ(out.shape(), a.shape());
  ASSERT_EQ(out.shape(), b.shape());
  OffsetCalc<3> calc;
  ASSERT_TRUE(make_offset_calc<3>(out.shape(), {out.strides().data(), a.strides().data(), b.strides().data()}, calc));
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t off[3];
    calc.offsets(i, off);
    ASSERT_EQ(off[0], naive_offset(out.shape(), out.strides(), i)) << i;
    ASSERT_EQ(off[1], naive_offset(a.shape(), a.strides(), i)) << i;
    ASSERT_EQ(off[2], naive_offset(b.shape(), b.strides(), i)) << i;
  }
}

}  // namespace

TEST(OffsetCalc, ContiguousOperandsCollapseToTheLinearIndex) {
  Tensor x = Tensor::empty({2, 3, 4});
  OffsetCalc<2> calc;
  ASSERT_TRUE(make_offset_calc<2>(x.shape(), {x.strides().data(), x.strides().data()}, calc));
  EXPECT_EQ(calc.dims, 1);
  EXPECT_TRUE(calc.contiguous);
  EXPECT_EQ(calc.sizes[0], 24);
  Tensor one = Tensor::empty({1, 1});
  ASSERT_TRUE(make_offset_calc<2>(one.shape(), {one.strides().data(), one.strides().data()}, calc));
  EXPECT_EQ(calc.dims, 0);
  EXPECT_TRUE(calc.contiguous);
}

TEST(OffsetCalc, BroadcastAndTransposedViewsKeepTheirDims) {
  Tensor out = Tensor::empty({4, 3});
  Tensor row = Tensor::empty({1, 3}).expand({4, 3});  // stride 0 along dim 0
  Tensor t = Tensor::empty({3, 4}).transpose(0, 1);
  OffsetCalc<3> calc;
  ASSERT_TRUE(make_offset_calc<3>(out.shape(), {out.strides().data(), row.strides().data(), t.strides().data()}, calc));
  EXPECT_EQ(calc.dims, 2);
  EXPECT_FALSE(calc.contiguous);
  expect_offsets_match(out, row, t);
}

TEST(OffsetCalc, RandomViewsMatchTheMultiIndex) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 5);
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 4));
    Tensor out = Tensor::empty(shape);
    // a: a permuted, then sliced, view; b: broadcast along random dims.
    Shape big = shape;
    for (auto& s : big) s = 2 * s + 1;
    Tensor a = Tensor::empty(big);
    for (int d = 0; d < rank; ++d)
      a = a.slice(d, static_cast<int64_t>(rng() % 2), a.size(d)).slice(d, 0, shape[static_cast<size_t>(d)]);
    if (rank >= 2 && trial % 2) {
      const int64_t p = static_cast<int64_t>(rng() % rank), q = static_cast<int64_t>(rng() % rank);
      Shape swapped = shape;
      std::swap(swapped[static_cast<size_t>(p)], swapped[static_cast<size_t>(q)]);
      a = Tensor::empty(swapped).transpose(p, q);
    }
    Shape bshape = shape;
    for (auto& s : bshape) {
      if (rng() % 2) s = 1;
    }
    Tensor b = Tensor::empty(bshape).expand(shape);
    expect_offsets_match(out, a, b);
  }
}

TEST(OffsetCalc, TooManyStridedDimsAreRefused) {
  Shape shape(12, 2);
  Tensor out = Tensor::empty(shape);
  Strides odd(12);
  for (size_t d = 0; d < 12; ++d) odd[d] = int64_t{1} << (2 * (11 - d) + 1);  // never mergeable
  OffsetCalc<2> calc;
  EXPECT_FALSE(make_offset_calc<2>(shape, {out.strides().data(), odd.data()}, calc));
}

TEST(OffsetCalc, ReducePlanSumsMatchTheCpuForStridedViews) {
  // The plan's (kept, reduced) offsets, walked on the host, give the CPU's sums.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 4));
    Tensor a = Tensor::randn(shape, static_cast<uint64_t>(trial), DType::F64);
    if (rank >= 2 && trial % 2)
      a = Tensor::randn(shape, 5, DType::F64).transpose(0, rank - 1).contiguous().transpose(0, rank - 1);
    std::vector<int64_t> dims;
    for (int d = 0; d < rank; ++d) {
      if (rng() % 2) dims.push_back(d);
    }
    if (dims.empty()) dims.push_back(static_cast<int64_t>(rng() % rank));
    dtensor::backend::ReducePlan plan;
    ASSERT_TRUE(dtensor::backend::make_reduce_plan(a.shape(), a.strides().data(), dims, plan));
    Tensor expected = sum(a, dims);
    ASSERT_EQ(expected.numel(), plan.kept_numel);
    const double* x = static_cast<const double*>(a.data_ptr());
    for (int64_t o = 0; o < plan.kept_numel; ++o) {
      int64_t base[1];
      plan.kept.offsets(o, base);
      double s = 0;
      for (int64_t r = 0; r < plan.reduced_numel; ++r) {
        int64_t off[1];
        plan.reduced.offsets(r, off);
        s += x[base[0] + off[0]];
      }
      EXPECT_NEAR(s, expected.reshape({-1}).to_vector<double>()[static_cast<size_t>(o)], 1e-12) << trial;
    }
  }
}
