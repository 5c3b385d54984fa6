// CUDA argsort (CUB's stable radix sort over sort_key.h's keys, the CPU's keys) and
// bincount (atomics on 64-bit integers).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pair_sort.cuh"
#include "backend/cuda/row_kernels.cuh"
#include "backend/cuda/sort.h"
#include "backend/sort_key.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int64_t kMaxBlocks = int64_t{1} << 20;
constexpr unsigned kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks)); }

// fn(i) for every i in [0, n), spread over the grid's threads.
template <class Fn>
__device__ void for_each_index(int64_t n, Fn&& fn) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    fn(i);
  }
}

template <class T>
__global__ void encode_kernel(int64_t total, const T* in, bool descending, uint64_t* keys, int64_t* positions) {
  for_each_index(total, [&](int64_t i) {
    keys[i] = sort_key::of(in[i], descending);
    positions[i] = i;
  });
}

// The second pass's key: the row of each flat position.
__global__ void row_key_kernel(int64_t total, int64_t n, const int64_t* positions, uint64_t* keys) {
  for_each_index(total, [&](int64_t i) { keys[i] = static_cast<uint64_t>(positions[i] / n); });
}

// Sorted flat positions -> indices within their row (slot i belongs to row i / n).
__global__ void finish_kernel(int64_t total, int64_t n, const int64_t* positions, int64_t* out) {
  for_each_index(total, [&](int64_t i) { out[i] = positions[i] - (i / n) * n; });
}

template <class I>
__global__ void bincount_kernel(int64_t n, const I* ids, int64_t bins, unsigned long long* counts) {
  for_each_index(n, [&](int64_t i) {
    const auto id = static_cast<int64_t>(ids[i]);
    if (id >= 0 && id < bins) atomicAdd(counts + id, 1ULL);
  });
}

}  // namespace

namespace {

// A first pass over the whole keys, then one by the row.
PairSortScratch argsort_scratch(int64_t rows, int64_t n) { return PairSortScratch(rows * n, {64, key_bits(rows - 1)}); }

}  // namespace

size_t argsort_scratch_bytes(int64_t rows, int64_t n) { return rows * n == 0 ? 0 : argsort_scratch(rows, n).total; }

void launch_argsort(DType dtype, int64_t rows, int64_t n, bool descending, const void* in, int64_t* out,
                    void* scratch, size_t scratch_bytes, void* stream) {
  const int64_t total = rows * n;
  if (total == 0) return;
  const PairSortScratch layout = argsort_scratch(rows, n);
  if (scratch_bytes < layout.total) throw std::logic_error("[argsort] scratch too small");
  const PairSortBuffers b(scratch, layout);
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = blocks_for(total);
  if (dtype == DType::F64) {
    encode_kernel<<<blocks, kThreads, 0, s>>>(total, static_cast<const double*>(in), descending, b.keys_in,
                                              b.positions_in);
  } else {
    encode_kernel<<<blocks, kThreads, 0, s>>>(total, static_cast<const int64_t*>(in), descending, b.keys_in,
                                              b.positions_in);
  }
  check(cudaGetLastError(), "argsort key kernel launch");
  size_t cub_bytes = layout.cub_bytes;
  check(cub::DeviceRadixSort::SortPairs(b.cub, cub_bytes, b.keys_in, b.keys_out, b.positions_in, b.positions_out,
                                        total, 0, 64, s),
        "cub::DeviceRadixSort::SortPairs");
  const int64_t* sorted = b.positions_out;
  if (rows > 1) {
    row_key_kernel<<<blocks, kThreads, 0, s>>>(total, n, b.positions_out, b.keys_in);
    check(cudaGetLastError(), "argsort row kernel launch");
    cub_bytes = layout.cub_bytes;
    check(cub::DeviceRadixSort::SortPairs(b.cub, cub_bytes, b.keys_in, b.keys_out, b.positions_out, b.positions_in,
                                          total, 0, key_bits(rows - 1), s),
          "cub::DeviceRadixSort::SortPairs");
    sorted = b.positions_in;
  }
  finish_kernel<<<blocks, kThreads, 0, s>>>(total, n, sorted, out);
  check(cudaGetLastError(), "argsort finish kernel launch");
}

void launch_bincount(DType id_dtype, int64_t n, const void* ids, int64_t bins, int64_t* counts, void* stream) {
  if (n == 0 || bins == 0) return;
  static_assert(sizeof(unsigned long long) == sizeof(int64_t));
  rows::visit_index(id_dtype, [&](auto index) {
    using I = decltype(index);
    bincount_kernel<I><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        n, static_cast<const I*>(ids), bins, reinterpret_cast<unsigned long long*>(counts));
  });
  check(cudaGetLastError(), "bincount kernel launch");
}

}  // namespace dtensor::backend::cuda
