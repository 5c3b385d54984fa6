// The shared counter-based generator (dtensor/random.h, __host__ __device__ since the
// CUDA factories use it) against the numbers the CPU-only version gave before the
// change, recorded as bits: Philox words of two streams, rand's and randn's floats,
// for seeds and indices beyond 32 bits. The kernels' index_offset: element i of a fill
// is the value of index index_offset + i.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/kernels.h"
#include "dtensor/dtensor.h"
#include "dtensor/random.h"

using namespace dtensor;

namespace {

struct Recorded {
  uint64_t seed, index;
  uint32_t words[4];  // philox4x32(seed, index), stream 0
  uint32_t stream3_word0;
  uint32_t uniform_bits, normal_bits;
};

// Printed by the implementation before it became __host__ __device__.
// One recorded draw per line.
// clang-format off
const Recorded kRecorded[] = {
    {0x0ull, 0x0ull, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}, 0xf0a90abcu, 0x3ecc4fd0u, 0x3f7dbb33u},
    {0x0ull, 0x1ull, {0xf8e4cca4u, 0x5cb200dbu, 0xb1a574ebu, 0x097eff67u}, 0x547ade6au, 0x3f78e4ccu, 0xbe1d5357u},
    {0x0ull, 0x11ull, {0x6b266ee3u, 0x1a2236b2u, 0x776abcf7u, 0x8750a017u}, 0x62a63d4du, 0x3ed64cdcu, 0x3f875c00u},
    {0x0ull, 0xf4243ull, {0x9592c3f8u, 0x1087d23fu, 0x7bc9e8f7u, 0xef3a448fu}, 0xbf402ddau, 0x3f1592c3u, 0x3f73da98u},
    {0x0ull, 0xffffffffull, {0xc5b20a9du, 0x4434ec4eu, 0x11bbe4fbu, 0x2a1ef7a5u}, 0xf65f61b3u, 0x3f45b20au, 0xbd97c183u},
    {0x0ull, 0x100000000ull, {0x6ad0c5ecu, 0xea236249u, 0x73a459f5u, 0x074944b3u}, 0x2048a386u, 0x3ed5a18au, 0x3f91747cu},
    {0x0ull, 0x123456789abcull, {0x4bed0422u, 0xa9cf3c7cu, 0x43e3a628u, 0x7ff72055u}, 0x587e02dau, 0x3e97da08u, 0xbf4ecb3fu},
    {0x7ull, 0x0ull, {0xf4607a2du, 0xc009f9dcu, 0x1d3aba42u, 0x15edac82u}, 0x97b356d9u, 0x3f74607au, 0x3998dd84u},
    {0x7ull, 0x1ull, {0x682e8e9bu, 0xcb97bc13u, 0x2bfaff6bu, 0xf535eea6u}, 0x965f7eceu, 0x3ed05d1cu, 0x3ec0b7f6u},
    {0x7ull, 0x11ull, {0x8de9a899u, 0xead4462eu, 0x54645641u, 0x9d7aeac5u}, 0x3ed76370u, 0x3f0de9a8u, 0x3f71604du},
    {0x7ull, 0xf4243ull, {0x13f1f69du, 0x9dab3b68u, 0x98d97587u, 0x22f7b7e1u}, 0x075dfaf8u, 0x3d9f8fb0u, 0xbfd7d895u},
    {0x7ull, 0xffffffffull, {0xca2833cau, 0x1d45172eu, 0x0bd28410u, 0x60baeeecu}, 0x7445a1d4u, 0x3f4a2833u, 0x3f047315u},
    {0x7ull, 0x100000000ull, {0x2ec4f55du, 0x249ef5f4u, 0xf681ec7fu, 0x807a6601u}, 0xfa43867au, 0x3e3b13d4u, 0x3f92ee02u},
    {0x7ull, 0x123456789abcull, {0x313e14b7u, 0x447087b9u, 0xd08a1fdcu, 0xee4d40c5u}, 0x21113bd3u, 0x3e44f850u, 0xbe4a31e2u},
    {0x75bcd15ull, 0x0ull, {0x23bdfdf2u, 0x526f577fu, 0xd3f04ad4u, 0x21a5ec5du}, 0xb08f3295u, 0x3e0ef7f4u, 0xbf5e1612u},
    {0x75bcd15ull, 0x1ull, {0x7f4c1edau, 0x011fd626u, 0x50ed66c5u, 0x2eb295ccu}, 0x8cb51aecu, 0x3efe983cu, 0x3f973f84u},
    {0x75bcd15ull, 0x11ull, {0x7eddc3bcu, 0x69863003u, 0x8ec559c2u, 0x0169e0bdu}, 0x6f4c3400u, 0x3efdbb86u, 0xbf812ca7u},
    {0x75bcd15ull, 0xf4243ull, {0xe480ebd8u, 0x3d2ebf86u, 0x1f7a25bdu, 0x70a67f7cu}, 0x3e028075u, 0x3f6480ebu, 0x3d06e9b5u},
    {0x75bcd15ull, 0xffffffffull, {0x8f27b22cu, 0x372bfd2cu, 0xb6495205u, 0x4b16342au}, 0xedfca627u, 0x3f0f27b2u, 0x3e6d5b87u},
    {0x75bcd15ull, 0x100000000ull, {0x52e3283au, 0xa2a335a2u, 0xe9843f9bu, 0x0748a9c3u}, 0x1277c988u, 0x3ea5c650u, 0xbf7db2d0u},
    {0x75bcd15ull, 0x123456789abcull, {0xa9187875u, 0xe4bfc739u, 0x937e56a7u, 0xc0cfbbabu}, 0xe99d5f3du, 0x3f291878u, 0x3f36e9dfu},
    {0x9e3779b97f4a7c15ull, 0x0ull, {0x40892754u, 0x4f1a097eu, 0x261374e1u, 0x2f9e2f43u}, 0xd457a58au, 0x3e81124eu, 0xbf19f067u},
    {0x9e3779b97f4a7c15ull, 0x1ull, {0xee03f1f9u, 0xc3eb0c5eu, 0xe467d641u, 0x9dc0d8d6u}, 0xbde3fceeu, 0x3f6e03f1u, 0x3d161ceau},
    {0x9e3779b97f4a7c15ull, 0x11ull, {0xf0f85aaau, 0x2af93d73u, 0x718df964u, 0xc8bb7929u}, 0x82fac799u, 0x3f70f85au, 0x3e2fc6f0u},
    {0x9e3779b97f4a7c15ull, 0xf4243ull, {0x8f16ec88u, 0x31017bbau, 0x5243631cu, 0x4ac9f000u}, 0xc8ac3904u, 0x3f0f16ecu, 0x3ec6adeau},
    {0x9e3779b97f4a7c15ull, 0xffffffffull, {0x7bcea248u, 0x9147c5aau, 0xcea12b6au, 0x324afe8eu}, 0x3aa0e8b1u, 0x3ef79d44u, 0xbf8c9deau},
    {0x9e3779b97f4a7c15ull, 0x100000000ull, {0x881e5ea1u, 0xedfc08f8u, 0x6a23d48au, 0x701c663eu}, 0x7d8beb4du, 0x3f081e5eu, 0x3f820811u},
    {0x9e3779b97f4a7c15ull, 0x123456789abcull, {0xc1f8b8ebu, 0xd573dc42u, 0xd65cfb7bu, 0xf1fc3938u}, 0xce9620dcu, 0x3f41f8b8u, 0x3ebfab7du},
};
// clang-format on

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST(RandomShared, TheGeneratorGivesTheRecordedNumbers) {
  for (const Recorded& r : kRecorded) {
    const std::string at = "seed " + std::to_string(r.seed) + " index " + std::to_string(r.index);
    const random::Philox4x32 w = random::philox4x32(r.seed, r.index);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(w[k], r.words[k]) << at << " word " << k;
    uint32_t direct[4];
    random::philox4x32_words(r.seed, r.index, 3, direct);
    EXPECT_EQ(direct[0], r.stream3_word0) << at << " stream 3";
    EXPECT_EQ(random::philox4x32(r.seed, r.index, 3)[0], r.stream3_word0) << at << " stream 3";
    EXPECT_EQ(bits_of(random::uniform(r.seed, r.index)), r.uniform_bits) << at << " uniform";
    EXPECT_EQ(bits_of(random::normal(r.seed, r.index)), r.normal_bits) << at << " normal";
  }
  // Philox-4x32-10's known answer for counter 0, key 0 (Random123's test vectors).
  EXPECT_EQ(random::philox4x32(0, 0), (random::Philox4x32{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(RandomShared, KernelFillsStartAtTheIndexOffset) {
  backend::Kernels& cpu = backend::kernels_for(Device::cpu());
  const uint64_t offset = (uint64_t{1} << 32) - 3;  // the counter's low word wraps inside the fill
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    Tensor normal = Tensor::empty({7}, dtype), uniform = Tensor::empty({7}, dtype);
    cpu.fill_randn(normal, 11, offset);
    cpu.fill_rand(uniform, 11, offset);
    const std::vector<double> n = normal.to(DType::F64).to_vector<double>();
    const std::vector<double> u = uniform.to(DType::F64).to_vector<double>();
    for (uint64_t i = 0; i < 7; ++i) {
      // The F32 value rounded once to the dtype.
      const Tensor want_n = Tensor::full({1}, random::normal(11, offset + i), DType::F32).to(dtype);
      const Tensor want_u = Tensor::full({1}, random::uniform(11, offset + i), DType::F32).to(dtype);
      EXPECT_EQ(n[i], want_n.to(DType::F64).item<double>()) << dtype_name(dtype) << " normal " << i;
      EXPECT_EQ(u[i], want_u.to(DType::F64).item<double>()) << dtype_name(dtype) << " uniform " << i;
    }
  }
}
