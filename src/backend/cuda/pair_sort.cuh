// The scratch of a stable sort of (64-bit key, int64 position) pairs by CUB's radix
// sort (internal), shared by the embedding backward and argsort: keys in/out,
// positions in/out, then CUB's temporary storage, each 256-byte aligned in one
// buffer the caller takes from the stream-ordered pool.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/cuda_check.h"

namespace dtensor::backend::cuda {

// The number of low key bits that hold every value in [0, limit]: a radix sort need
// not look past them.
inline int key_bits(int64_t limit) {
  int bits = 1;
  while (bits < 64 && (uint64_t{1} << bits) <= static_cast<uint64_t>(limit)) ++bits;
  return bits;
}

struct PairSortScratch {
  size_t keys_in = 0, keys_out = 0, positions_in = 0, positions_out = 0, cub = 0, cub_bytes = 0, total = 0;

  // The layout for `n` pairs and the passes that sort up to each of `end_bits`
  // (CUB's storage is the largest they need; a size query, no device work).
  PairSortScratch(int64_t n, std::initializer_list<int> end_bits) {
    const size_t array = align_up(static_cast<size_t>(n) * 8);
    keys_out = array;
    positions_in = 2 * array;
    positions_out = 3 * array;
    cub = 4 * array;
    for (const int bits : end_bits) {
      size_t bytes = 0;
      check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint64_t*>(nullptr),
                                            static_cast<uint64_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                            static_cast<int64_t*>(nullptr), n, 0, bits),
            "cub::DeviceRadixSort::SortPairs");
      cub_bytes = std::max(cub_bytes, bytes);
    }
    total = cub + align_up(cub_bytes);
  }

  static size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }
};

// The four arrays of a PairSortScratch laid out in `base`.
struct PairSortBuffers {
  uint64_t* keys_in;
  uint64_t* keys_out;
  int64_t* positions_in;
  int64_t* positions_out;
  void* cub;

  PairSortBuffers(void* base, const PairSortScratch& s)
      : keys_in(at<uint64_t>(base, s.keys_in)),
        keys_out(at<uint64_t>(base, s.keys_out)),
        positions_in(at<int64_t>(base, s.positions_in)),
        positions_out(at<int64_t>(base, s.positions_out)),
        cub(static_cast<char*>(base) + s.cub) {}

 private:
  template <class T>
  static T* at(void* base, size_t offset) {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
  }
};

}  // namespace dtensor::backend::cuda
