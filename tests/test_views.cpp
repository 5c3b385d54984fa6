// Views share storage and index the right elements; property: a view and its
// materialised copy agree, for many random chains of view operations.
#include <random>

#include "test_helpers.h"

using namespace dtensor;
using dtensor::testing::at;
using dtensor::testing::reference_values;

namespace {
Tensor iota(const Shape& shape) {
  return Tensor::arange(0, static_cast<double>(shape_numel(shape)), 1, DType::F64).reshape(shape);
}
std::vector<double> values(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }
}  // namespace

TEST(Views, SliceNarrowSelect) {
  Tensor x = iota({4, 5});
  Tensor s = x.slice(1, 1, 5, 2);  // columns 1 and 3
  EXPECT_EQ(s.shape(), (Shape{4, 2}));
  EXPECT_TRUE(s.shares_storage(x));
  EXPECT_EQ(values(s), (std::vector<double>{1, 3, 6, 8, 11, 13, 16, 18}));
  EXPECT_EQ(values(x.slice(0, -2, 100)), values(x.narrow(0, 2, 2)));
  EXPECT_EQ(x.slice(0, 3, 1).size(0), 0);  // empty, not an error
  EXPECT_EQ(values(x.select(1, -1)), (std::vector<double>{4, 9, 14, 19}));
  EXPECT_THROW_MSG(x.narrow(1, 3, 3), std::invalid_argument, "[narrow]");
  EXPECT_THROW_MSG(x.select(0, 4), std::invalid_argument, "[select] index 4 out of range");
  EXPECT_THROW_MSG(x.slice(0, 0, 1, 0), std::invalid_argument, "[slice] step must be > 0");
}

TEST(Views, ChunkFollowsTheCeilRule) {
  // 5 rows on 4 ranks -> 2, 2, 1, 0 (DESIGN: chunk size ceil(n/k)).
  std::vector<Tensor> parts = iota({5, 2}).chunk(4, 0);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].size(0), 2);
  EXPECT_EQ(parts[1].size(0), 2);
  EXPECT_EQ(parts[2].size(0), 1);
  EXPECT_EQ(parts[3].size(0), 0);
  EXPECT_EQ(values(parts[2]), (std::vector<double>{8, 9}));
  // 7 on 3 -> 3, 3, 1; 2 on 4 -> 1, 1, 0, 0.
  std::vector<int64_t> sizes;
  for (const Tensor& p : iota({7}).chunk(3)) sizes.push_back(p.numel());
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 1}));
  sizes.clear();
  for (const Tensor& p : iota({2}).chunk(4)) sizes.push_back(p.numel());
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(values(iota({6}).split({1, 5})[1]), (std::vector<double>{1, 2, 3, 4, 5}));
  EXPECT_THROW_MSG(iota({6}).split({1, 4}), std::invalid_argument, "[split] sizes [1, 4] sum to 5 but dim 0 has size 6");
  EXPECT_THROW_MSG(iota({6}).chunk(0), std::invalid_argument, "[chunk]");
}

TEST(Views, TransposePermuteExpandSqueeze) {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(at(p, {3, 1, 2}), at(x, {1, 2, 3}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(values(x.transpose(0, 2)), reference_values(x.transpose(0, 2)));
  Tensor e = iota({3, 1}).expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.stride(0), 0);
  EXPECT_EQ(at(e, {1, 2, 3}), 2.0);
  EXPECT_EQ(iota({1, 3, 1}).squeeze().shape(), (Shape{3}));
  EXPECT_EQ(iota({1, 3, 1}).squeeze(-1).shape(), (Shape{1, 3}));
  EXPECT_EQ(iota({3}).squeeze(0).shape(), (Shape{3}));  // not size 1: unchanged
  EXPECT_EQ(iota({3}).unsqueeze(-1).shape(), (Shape{3, 1}));
  EXPECT_EQ(iota({3}).unsqueeze(0).shape(), (Shape{1, 3}));
  EXPECT_THROW_MSG(x.permute({0, 0, 1}), std::invalid_argument, "[permute] dims must be a permutation");
  EXPECT_THROW_MSG(iota({3, 2}).expand({3, 4}), std::invalid_argument, "[expand] cannot expand [3, 2] to [3, 4]");
  EXPECT_THROW_MSG(x.transpose(0, 3), std::invalid_argument, "[transpose] dim 3 out of range");
}

TEST(Views, ViewNeverCopiesReshapeCopiesWhenItMust) {
  Tensor x = iota({4, 6});
  Tensor v = x.view({2, 2, 6});
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_EQ(x.view({-1}).shape(), (Shape{24}));
  Tensor t = x.t();  // [6, 4] with strides [1, 6]
  Tensor split = t.view({3, 2, 4});  // splits the first dim: still a view
  EXPECT_TRUE(split.shares_storage(x));
  EXPECT_EQ(values(split), values(t.contiguous().view({3, 2, 4})));
  EXPECT_THROW_MSG(t.view({24}), std::invalid_argument, "[view] cannot view [6, 4]");
  Tensor r = t.reshape({24});
  EXPECT_FALSE(r.shares_storage(x));
  EXPECT_EQ(values(r), reference_values(t));
  EXPECT_THROW_MSG(x.view({5, -1}), std::invalid_argument, "[view] shape [5, -1] is invalid for a tensor of 24 elements");
  EXPECT_THROW_MSG(x.reshape({-1, -1}), std::invalid_argument, "only one dim can be -1");
  EXPECT_EQ(iota({2, 3, 4}).flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(iota({2, 3, 4}).flatten(0, 1).shape(), (Shape{6, 4}));
}

// Random chains of views; after each step the view's values (read through the
// copy kernel) must equal the values read directly through shape/strides/offset.
TEST(Views, PropertyViewAgreesWithMaterialisedCopy) {
  std::mt19937 rng(2024);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    Tensor t = iota({pick(1, 5), pick(1, 5), pick(1, 4)});
    for (int step = 0; step < 4; ++step) {
      const int64_t d = pick(0, t.dim() - 1);
      switch (pick(0, 6)) {
        case 0: t = t.transpose(d, pick(0, t.dim() - 1)); break;
        case 1: {
          const int64_t n = t.size(d);
          const int64_t a = pick(0, n), b = pick(a, n);
          t = t.slice(d, a, b, pick(1, 2));
          break;
        }
        case 2: t = t.chunk(pick(1, 3), d)[0]; break;
        case 3: if (t.dim() > 1) t = t.select(d, pick(0, std::max<int64_t>(t.size(d) - 1, 0)) % std::max<int64_t>(t.size(d), 1)); break;
        case 4: t = t.unsqueeze(d).expand([&] { Shape s = t.unsqueeze(d).shape(); s[d] = 2; return s; }()); break;
        case 5: t = t.reshape({-1}); break;
        case 6: {
          std::vector<int64_t> perm(t.dim());
          for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
          std::shuffle(perm.begin(), perm.end(), rng);
          t = t.permute(perm);
          break;
        }
      }
      if (t.numel() == 0 || t.dim() == 0) break;
      ASSERT_EQ(values(t), reference_values(t)) << "trial " << trial << " step " << step;
      ASSERT_EQ(values(t.contiguous()), reference_values(t));
    }
  }
}
