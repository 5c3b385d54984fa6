// Blocked reduction: a block of every source is combined in L1 and then written
// once to each destination, so n sources cost one pass over memory instead of n
// read-modify-write passes over a destination.
#include "comm/reduce.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "comm/reduce_ops.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm {
namespace {

// Inline BF16 conversions: the out-of-line ones in dtype.cpp cost a call per
// element, which halves the bandwidth of a BF16 all-reduce. Same rounding (RNE).
inline float load(bf16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16); }
inline void store(bf16& d, float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    d.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  d.bits = static_cast<uint16_t>(u >> 16);
}
inline float load(f16 v) { return static_cast<float>(v); }
inline void store(f16& d, float f) { d = f16(f); }
template <class T>
inline T load(T v) {
  return v;
}
template <class T, class A>
inline void store(T& d, A v) {
  d = static_cast<T>(v);
}

template <class T> struct Acc { using type = T; };
template <> struct Acc<bf16> { using type = float; };
template <> struct Acc<f16> { using type = float; };

using namespace reduce_ops;  // Sum, Prod, Max, Min, Or, And: shared with the CUDA kernel

// The reduction loops are compiled twice, for AVX2 and for the baseline, and the
// loader picks one per machine (GCC/Clang function multiversioning): the library
// stays portable, and AVX2 made the 1 MiB all-reduce 16% faster here. GCC on
// glibc only: Clang does not multiversion templates, and the loader's choice needs
// ifunc (glibc, ELF). Not under ThreadSanitizer: the ifunc resolvers run while the
// loader relocates the library, before the TSan runtime is initialised, and crash.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    defined(__ELF__) && !defined(__SANITIZE_THREAD__)
#define DTENSOR_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DTENSOR_SIMD_CLONES
#endif

constexpr int64_t kBlock = 2048;  // elements per block: 8 KiB of F32, well inside L1

// Copies an L1-hot block to memory; `stream` uses non-temporal stores, which skip
// reading the destination's lines first and do not evict the working set (for
// results larger than the last-level cache). Call store_fence() after streaming.
void store_block(void* dst, const void* src, size_t bytes, bool stream) {
#if defined(__x86_64__)
  if (stream) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// The general path: each block of the sources is combined in an accumulator (F32
// for BF16/F16), converted once, and stored to every destination. All sources of
// a block are read before any destination is written, so destinations may alias
// sources.
template <class T, class Combine>
DTENSOR_SIMD_CLONES void reduce_via_accumulator(T* const* dsts, int ndst, const T* const* srcs, int n, int64_t count,
                            Combine combine, int64_t divisor, bool stream) {
  using A = typename Acc<T>::type;
  alignas(64) A acc[kBlock];
  alignas(64) T staged[std::is_same_v<A, T> ? 1 : kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = std::min(kBlock, count - base);
    const T* s0 = srcs[0] + base;
    if (n == 1) {
      for (int64_t j = 0; j < len; ++j) acc[j] = load(s0[j]);
    } else {
      const T* s1 = srcs[1] + base;
      for (int64_t j = 0; j < len; ++j) {
        acc[j] = combine(static_cast<A>(load(s0[j])), static_cast<A>(load(s1[j])));
      }
    }
    for (int k = 2; k < n; ++k) {
      const T* src = srcs[k] + base;
      for (int64_t j = 0; j < len; ++j) acc[j] = combine(acc[j], static_cast<A>(load(src[j])));
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (divisor > 1) {
        for (int64_t j = 0; j < len; ++j) acc[j] /= static_cast<A>(divisor);
      }
    }
    const T* result = nullptr;
    if constexpr (std::is_same_v<A, T>) {
      result = acc;
    } else {
      for (int64_t j = 0; j < len; ++j) store(staged[j], acc[j]);
      result = staged;
    }
    for (int d = 0; d < ndst; ++d) store_block(dsts[d] + base, result, len * sizeof(T), stream);
  }
  if (stream) store_fence();
}

// The common case (no conversion, cached stores): the result is computed straight
// into the first destination's block, which then stays in L1 for the copies to
// the others. Every loop stores to a single stream: storing to two buffers that
// lie a multiple of 256 MiB apart in one loop (per-thread malloc arenas do that)
// thrashes AMD's L1 way predictor and ran 20x slower (docs/communication.md).
// Needs dsts[0] to differ from srcs[2..] (it is written before those are read).
template <class T, class Combine>
DTENSOR_SIMD_CLONES void reduce_direct(T* const* dsts, int ndst, const T* const* srcs, int n, int64_t count,
                   Combine combine, int64_t divisor) {
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t len = std::min(kBlock, count - base);
    T* d0 = dsts[0] + base;
    const T* s0 = srcs[0] + base;
    if (n == 1) {
      std::memmove(d0, s0, len * sizeof(T));
    } else {
      const T* s1 = srcs[1] + base;
      for (int64_t j = 0; j < len; ++j) d0[j] = combine(s0[j], s1[j]);
      for (int k = 2; k < n; ++k) {
        const T* src = srcs[k] + base;
        for (int64_t j = 0; j < len; ++j) d0[j] = combine(d0[j], src[j]);
      }
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (divisor > 1) {
        for (int64_t j = 0; j < len; ++j) d0[j] /= static_cast<T>(divisor);
      }
    }
    for (int d = 1; d < ndst; ++d) {
      if (dsts[d] + base != d0) std::memcpy(dsts[d] + base, d0, len * sizeof(T));
    }
  }
}

template <class T, class Combine>
void reduce_blocks(T* const* dsts, int ndst, const T* const* srcs, int n, int64_t count,
                   Combine combine, int64_t divisor, bool stream) {
  if (ndst <= 0 || count <= 0) return;
  if constexpr (std::is_same_v<typename Acc<T>::type, T>) {
    bool direct = !stream;
    for (int k = 2; k < n && direct; ++k) direct = srcs[k] != dsts[0];
    if (direct) return reduce_direct(dsts, ndst, srcs, n, count, combine, divisor);
  }
  reduce_via_accumulator(dsts, ndst, srcs, n, count, combine, divisor, stream);
}

}  // namespace

void check_reduce_supported(DType dtype, ReduceOp op, const char* op_name) {
  DT_CHECK_ARG(op != ReduceOp::Avg || is_floating(dtype), op_name,
               "ReduceOp::Avg needs a floating dtype, got ", dtype_name(dtype));
}

void reduce_sources(DType dtype, ReduceOp op, void* const* dsts, int ndst,
                    const void* const* srcs, int n, int64_t count, bool stream) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    auto* d = reinterpret_cast<T* const*>(dsts);
    auto* s = reinterpret_cast<const T* const*>(srcs);
    if constexpr (std::is_same_v<T, bool>) {
      if (op == ReduceOp::Sum || op == ReduceOp::Max) {
        reduce_blocks(d, ndst, s, n, count, Or{}, 1, stream);
      } else {
        reduce_blocks(d, ndst, s, n, count, And{}, 1, stream);
      }
    } else {
      switch (op) {
        case ReduceOp::Sum: reduce_blocks(d, ndst, s, n, count, Sum{}, 1, stream); break;
        case ReduceOp::Avg: reduce_blocks(d, ndst, s, n, count, Sum{}, n, stream); break;
        case ReduceOp::Product: reduce_blocks(d, ndst, s, n, count, Prod{}, 1, stream); break;
        case ReduceOp::Max: reduce_blocks(d, ndst, s, n, count, Max{}, 1, stream); break;
        case ReduceOp::Min: reduce_blocks(d, ndst, s, n, count, Min{}, 1, stream); break;
      }
    }
  });
}

void reduce_sources(DType dtype, ReduceOp op, void* dst, const void* const* srcs, int n,
                    int64_t count) {
  reduce_sources(dtype, op, &dst, 1, srcs, n, count, false);
}

void divide_by(DType dtype, void* data, int64_t count, int64_t divisor) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    using A = typename Acc<T>::type;
    if constexpr (std::is_floating_point_v<A>) {
      T* p = static_cast<T*>(data);
      for (int64_t i = 0; i < count; ++i) store(p[i], load(p[i]) / static_cast<A>(divisor));
    }
  });
}

}  // namespace dtensor::comm
