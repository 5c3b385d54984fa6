// Counter-based randomness: values depend on (seed, index) only.
#include <gtest/gtest.h>

#include <cmath>

#include "dtensor/dtensor.h"

using namespace dtensor;

TEST(Random, SameSeedSameIndexWhateverTheShape) {
  Tensor flat = Tensor::randn({24}, 7);
  Tensor cube = Tensor::randn({2, 3, 4}, 7);
  EXPECT_EQ(flat.to_vector<float>(), cube.to_vector<float>());
  Tensor longer = Tensor::randn({30}, 7);
  EXPECT_EQ(longer.slice(0, 0, 24).to_vector<float>(), flat.to_vector<float>());
  // Element i is random::normal(seed, i).
  EXPECT_EQ(cube.to_vector<float>()[17], random::normal(7, 17));
  EXPECT_EQ(Tensor::rand({5}, 3).to_vector<float>()[4], random::uniform(3, 4));
}

TEST(Random, DifferentSeedsDiffer) {
  EXPECT_NE(Tensor::randn({16}, 1).to_vector<float>(), Tensor::randn({16}, 2).to_vector<float>());
}

TEST(Random, Moments) {
  const int64_t n = 200000;
  std::vector<double> x = Tensor::randn({n}, 123, DType::F64).to_vector<double>();
  double mean = 0, sq = 0;
  for (double v : x) mean += v;
  mean /= n;
  for (double v : x) sq += (v - mean) * (v - mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
  std::vector<float> u = Tensor::rand({n}, 9).to_vector<float>();
  double umean = 0;
  for (float v : u) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, 1.0f);
    umean += v;
  }
  EXPECT_NEAR(umean / n, 0.5, 0.01);
}

TEST(Random, HalfDtypesRoundTheF32Values) {
  Tensor f = Tensor::randn({64}, 5);
  Tensor h = Tensor::randn({64}, 5, DType::BF16);
  EXPECT_TRUE(allclose(h.to(DType::F32), f.to(DType::BF16).to(DType::F32), 0, 0));
  EXPECT_THROW(Tensor::randn({2}, 1, DType::I64), std::invalid_argument);
}
