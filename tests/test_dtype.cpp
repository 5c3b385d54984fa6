// DType metadata, promotion and the 16-bit float conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dtensor/dtype.h"

using namespace dtensor;

namespace {
// Exact reference: round x to the nearest representable value among candidates
// produced by decoding every 16-bit pattern (ties to the even pattern).
template <class Decode>
uint16_t nearest_even(float x, Decode decode) {
  uint16_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float v = decode(static_cast<uint16_t>(bits));
    if (std::isnan(v) || std::signbit(v) != std::signbit(x)) continue;
    const double err = std::fabs(static_cast<double>(v) - x);
    if (err < best_err || (err == best_err && (bits & 1) == 0)) {
      best_err = err;
      best = static_cast<uint16_t>(bits);
    }
  }
  return best;
}
}  // namespace

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
  try {
    parse_dtype("float8");
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[parse_dtype]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("float8"), std::string::npos);
  }
}

TEST(DType, Promotion) {
  EXPECT_EQ(promote_types(DType::F32, DType::F32), DType::F32);
  EXPECT_EQ(promote_types(DType::BF16, DType::F32), DType::F32);
  EXPECT_EQ(promote_types(DType::BF16, DType::F16), DType::F32);
  EXPECT_EQ(promote_types(DType::F32, DType::F64), DType::F64);
  EXPECT_EQ(promote_types(DType::I64, DType::F16), DType::F16);
  EXPECT_EQ(promote_types(DType::I32, DType::I64), DType::I64);
  EXPECT_EQ(promote_types(DType::Bool, DType::I32), DType::I32);
  EXPECT_EQ(promote_types(DType::Bool, DType::BF16), DType::BF16);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // Exactly halfway between 1.0 (0x3F80) and the next bf16 (0x3F81): ties go to even.
  EXPECT_EQ(float_to_bf16_bits(1.00390625f), 0x3F80);
  // Halfway between 0x3F81 and 0x3F82: goes up to the even 0x3F82.
  EXPECT_EQ(float_to_bf16_bits(1.01171875f), 0x3F82);
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  EXPECT_TRUE(std::isinf(bf16_bits_to_float(float_to_bf16_bits(INFINITY))));
  // Against the brute-force nearest-even reference on a spread of values.
  auto decode = [](uint16_t b) { return bf16_bits_to_float(b); };
  for (float x : {0.1f, -3.14159f, 1e-30f, 6.5e4f, 1.2345e20f, -7.77e-5f, 3.0e38f}) {
    EXPECT_EQ(float_to_bf16_bits(x), nearest_even(x, decode)) << x;
  }
}

TEST(DType, F16RoundsToNearestEvenIncludingSubnormals) {
  auto decode = [](uint16_t b) { return f16_bits_to_float(b); };
  for (float x : {0.1f, -3.14159f, 65504.0f, 1e-5f, -6.1e-5f, 5.96e-8f, 2.98e-8f, 1.0009765625f,
                  1.00048828125f, 3.0e-6f, 0.33333334f}) {
    EXPECT_EQ(float_to_f16_bits(x), nearest_even(x, decode)) << x;
  }
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7C00);  // rounds to infinity
  EXPECT_EQ(float_to_f16_bits(-65519.0f), 0xFBFF);  // still the largest finite
  EXPECT_EQ(f16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_bits_to_float(0x0001), 5.9604644775390625e-08f);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(std::nanf("")))));
  // Every finite half round-trips exactly.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7C00) == 0x7C00) continue;
    ASSERT_EQ(float_to_f16_bits(f16_bits_to_float(static_cast<uint16_t>(bits))), bits) << bits;
  }
}
