// DType names, sizes, promotion, and the 16-bit float conversions.
#include "dtensor/dtype.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "dtensor/error.h"

namespace dtensor {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_f16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf stays inf, NaN stays a quiet NaN
    return sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): the half is a multiple of 2^-24, so
    // scale exactly and round to nearest even in float arithmetic. 1024 rounds up
    // into the smallest normal, whose encoding is the same integer.
    const float scaled = bits_float(magnitude) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits
  // to nearest even; a carry correctly bumps the exponent.
  magnitude += 0xfffu + ((magnitude >> 13) & 1u);
  magnitude -= 112u << 23;
  return sign | static_cast<uint16_t>(magnitude >> 13);
}

float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float value = static_cast<float>(mantissa) * 5.9604644775390625e-08f;  // 2^-24
    return sign ? -value : value;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::BF16:
    case DType::F16: return 2;
    case DType::Bool: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I64: return "i64";
    case DType::I32: return "i32";
    case DType::Bool: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32,
                  DType::Bool}) {
    if (dtype_name(t) == name) return t;
  }
  throw std::invalid_argument(detail::concat("[parse_dtype] expected one of f32, f64, bf16, f16, ",
                                             "i64, i32, bool; got '", name, "'"));
}

bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16;
}
bool is_integral(DType t) { return !is_floating(t); }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto category = [](DType t) { return t == DType::Bool ? 0 : is_floating(t) ? 2 : 1; };
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  if (category(a) == 1) return DType::I64;  // I32 with I64
  if (a == DType::F64 || b == DType::F64) return DType::F64;
  return DType::F32;  // F32 with a half type, or BF16 with F16
}

std::string shape_to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

}  // namespace dtensor
