// The order of argsort as unsigned 64-bit keys, shared by the CPU sort and the CUDA
// radix sort (internal): each element becomes a key whose unsigned order is the
// element order, so both devices sort the very same keys and agree bit for bit.
// - F64 (every floating dtype widens to it exactly): -0.0 and +0.0 are one key, and
//   every NaN is the largest key (torch.sort's order: NaN above +inf);
// - I64 (every integer dtype and Bool widen to it): the sign bit flipped;
// - descending: the key's bits inverted, so the sort itself is always ascending and
//   stable (equal elements keep their order in both directions, NaN first when
//   descending).
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/scalar_ops.h"  // DT_HOST_DEVICE

namespace dtensor::backend::sort_key {

inline constexpr uint64_t kSignBit = uint64_t{1} << 63;

DT_HOST_DEVICE inline uint64_t of(double x, bool descending) {
  uint64_t key = ~uint64_t{0};  // NaN
  if (x == x) {
    if (x == 0) x = 0;  // -0.0 -> +0.0
    uint64_t bits = 0;
    memcpy(&bits, &x, sizeof bits);  // unqualified: nvcc's device memcpy
    key = (bits & kSignBit) ? ~bits : (bits | kSignBit);
  }
  return descending ? ~key : key;
}

DT_HOST_DEVICE inline uint64_t of(int64_t x, bool descending) {
  const uint64_t key = static_cast<uint64_t>(x) ^ kSignBit;
  return descending ? ~key : key;
}

}  // namespace dtensor::backend::sort_key
