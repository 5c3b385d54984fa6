// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11).
//
// A value is a pure function of (seed, index): no generator state is carried from
// one element to the next. Element i of a random tensor uses index = i (row-major,
// over the *global* tensor for a DistTensor), so any layout, any shard, any device
// draws the same numbers. These functions are inline and header-only, and
// __host__ __device__ under nvcc, so that the CPU kernels and the CUDA kernels
// (src/backend/cuda/factories.cu) share one definition.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DTENSOR_HOST_DEVICE __host__ __device__
#else
#define DTENSOR_HOST_DEVICE
#endif

namespace dtensor::random {

using Philox4x32 = std::array<uint32_t, 4>;

// Ten rounds of Philox-4x32 on counter (index, stream, 0) with key = seed; the four
// output words go to out[0..3] (the form device code calls; std::array is host-only).
DTENSOR_HOST_DEVICE inline void philox4x32_words(uint64_t seed, uint64_t index, uint32_t stream, uint32_t* out) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = stream, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// Ten rounds of Philox-4x32 on counter (index, 0) with key = seed.
inline Philox4x32 philox4x32(uint64_t seed, uint64_t index, uint32_t stream = 0) {
  Philox4x32 r;
  philox4x32_words(seed, index, stream, r.data());
  return r;
}

// Uniform in [0, 1) with 24 random bits (exact in float).
DTENSOR_HOST_DEVICE inline float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Uniform in [0, 1) for element `index`.
DTENSOR_HOST_DEVICE inline float uniform(uint64_t seed, uint64_t index) {
  uint32_t r[4];
  philox4x32_words(seed, index, 0, r);
  return uniform_from_bits(r[0]);
}

// Standard normal for element `index` (Box-Muller on two 32-bit words; the first
// uniform is shifted into (0, 1] so the log is finite). Computed in double and
// rounded once, so CPU and GPU agree to float rounding: the products and the sum
// below are exact or single roundings on both, and the double log, cos and sqrt of
// glibc and CUDA (within 1 ulp) round to the same float unless the exact value lies
// within a few double ulps of a float rounding boundary.
DTENSOR_HOST_DEVICE inline float normal(uint64_t seed, uint64_t index) {
  using std::cos, std::log, std::sqrt;
  uint32_t r[4];
  philox4x32_words(seed, index, 0, r);
  const double u1 = (static_cast<double>(r[0]) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = static_cast<double>(r[1]) * (1.0 / 4294967296.0);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return static_cast<float>(sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2));
}

}  // namespace dtensor::random
