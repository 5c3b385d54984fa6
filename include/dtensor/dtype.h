// Element types of a tensor and the 16-bit float formats stored by them.
//
// BF16 and F16 are storage formats: the CPU computes in F32 and rounds back with
// round-to-nearest-even, the same rounding the hardware formats use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dtensor {

enum class DType : uint8_t { F32, F64, BF16, F16, I64, I32, Bool };

// 16-bit brain float: the top half of an IEEE F32.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f);
  operator float() const;
};

// IEEE 754 binary16.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f);
  operator float() const;
};

uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_f16_bits(float f);
float f16_bits_to_float(uint16_t bits);

inline bf16::bf16(float f) : bits(float_to_bf16_bits(f)) {}
inline bf16::operator float() const { return bf16_bits_to_float(bits); }
inline f16::f16(float f) : bits(float_to_f16_bits(f)) {}
inline f16::operator float() const { return f16_bits_to_float(bits); }

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", ...
DType parse_dtype(std::string_view name);
bool is_floating(DType t);  // F32, F64, BF16, F16
bool is_integral(DType t);  // I64, I32, Bool

// The dtype two operands are computed in (NumPy/PyTorch-style category promotion:
// bool < integers < floats; within floats the wider wins, BF16 with F16 gives F32).
DType promote_types(DType a, DType b);

template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

// Calls fn(T{}) with the C++ type stored for `t` (bf16/f16 for the half types).
template <class Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(float{});
    case DType::F64: return fn(double{});
    case DType::BF16: return fn(bf16{});
    case DType::F16: return fn(f16{});
    case DType::I64: return fn(int64_t{});
    case DType::I32: return fn(int32_t{});
    case DType::Bool: return fn(bool{});
  }
  return fn(float{});
}

}  // namespace dtensor
