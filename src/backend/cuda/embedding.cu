// CUDA embedding (+ backward).
//
// Forward: one block per id (grid-stride over ids), its threads copying the row's
// elements as raw bits (so every dtype is served by four kernels, by element size).
// Backward, deterministic: the (id, position) pairs are sorted by id with CUB's
// radix sort, which is stable, so each id's positions stay ascending; masked ids
// outside [0, V) get the key V and sort last, where no block reads them. Then one
// block per sorted position that starts a run of equal ids sums that run's gradient
// rows in double, position by position as the CPU does, and adds the total to the
// table's row once. A run is walked by one block, so a very frequent id (padding)
// makes that block long: acceptable for token batches, a segmented split would fix it.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/embedding.h"
#include "backend/cuda/pair_sort.cuh"
#include "backend/cuda/row_kernels.cuh"

namespace dtensor::backend::cuda {
namespace {

constexpr int64_t kMaxBlocks = int64_t{1} << 20;
constexpr unsigned kThreads = 128;

__device__ __forceinline__ bool id_inside(int64_t id, int64_t rows) { return id >= 0 && id < rows; }

template <class B, class I>
__global__ void embedding_kernel(EmbeddingShape shape, const B* table, const I* ids, B* out) {
  for (int64_t n = blockIdx.x; n < shape.ids; n += gridDim.x) {
    const int64_t id = static_cast<int64_t>(ids[n * shape.id_stride]);
    B* o = out + n * shape.width;
    if (!id_inside(id, shape.rows)) {  // masked (unmasked ids were checked on the host)
      for (int64_t d = threadIdx.x; d < shape.width; d += blockDim.x) o[d] = B(0);  // +0 in every dtype
      continue;
    }
    const B* row = table + id * shape.table_row_stride;
    for (int64_t d = threadIdx.x; d < shape.width; d += blockDim.x) o[d] = row[d * shape.table_col_stride];
  }
}

// keys[n] = id (V for a masked id outside [0, V)), positions[n] = n.
template <class I>
__global__ void sort_keys_kernel(EmbeddingShape shape, const I* ids, uint64_t* keys, int64_t* positions) {
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < shape.ids;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t id = static_cast<int64_t>(ids[n * shape.id_stride]);
    keys[n] = static_cast<uint64_t>(id_inside(id, shape.rows) ? id : shape.rows);
    positions[n] = n;
  }
}

template <class E>
__global__ void embedding_backward_kernel(EmbeddingShape shape, const typename E::S* grad_out, int64_t grad_row_stride,
                                          int64_t grad_col_stride, const uint64_t* keys, const int64_t* positions,
                                          typename E::S* grad_table) {
  using C = typename E::C;
  for (int64_t i = blockIdx.x; i < shape.ids; i += gridDim.x) {
    const uint64_t key = keys[i];
    if (key >= static_cast<uint64_t>(shape.rows) || (i > 0 && keys[i - 1] == key)) continue;  // not a run's start
    int64_t end = i + 1;
    while (end < shape.ids && keys[end] == key) ++end;
    typename E::S* dst = grad_table + static_cast<int64_t>(key) * shape.table_row_stride;
    for (int64_t d = threadIdx.x; d < shape.width; d += blockDim.x) {
      double acc = 0;
      for (int64_t j = i; j < end; ++j) {
        acc += static_cast<double>(E::load(grad_out[positions[j] * grad_row_stride + d * grad_col_stride]));
      }
      typename E::S& cell = dst[d * shape.table_col_stride];
      cell = E::store(static_cast<C>(static_cast<double>(E::load(cell)) + acc));
    }
  }
}

}  // namespace

void launch_embedding(size_t element_size, DType id_dtype, const EmbeddingShape& shape, const void* table,
                      const void* ids, void* out, void* stream) {
  if (shape.ids == 0 || shape.width == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min(shape.ids, kMaxBlocks));
  const auto s = static_cast<cudaStream_t>(stream);
  rows::visit_index(id_dtype, [&](auto index) {
    using I = decltype(index);
    const auto* id = static_cast<const I*>(ids);
    auto run = [&](auto bits) {
      using B = decltype(bits);
      embedding_kernel<B, I><<<blocks, kThreads, 0, s>>>(shape, static_cast<const B*>(table), id, static_cast<B*>(out));
    };
    switch (element_size) {
      case 1: run(uint8_t{}); break;
      case 2: run(uint16_t{}); break;
      case 4: run(uint32_t{}); break;
      default: run(uint64_t{}); break;
    }
  });
  check(cudaGetLastError(), "embedding kernel launch");
}

size_t embedding_backward_scratch_bytes(const EmbeddingShape& shape) {
  return shape.ids == 0 ? 0 : PairSortScratch(shape.ids, {key_bits(shape.rows)}).total;
}

void launch_embedding_backward(DType dtype, DType id_dtype, const EmbeddingShape& shape, const void* grad_out,
                               int64_t grad_row_stride, int64_t grad_col_stride, const void* ids, void* grad_table,
                               void* scratch, size_t scratch_bytes, void* stream) {
  if (shape.ids == 0 || shape.width == 0) return;
  const PairSortScratch layout(shape.ids, {key_bits(shape.rows)});
  if (scratch_bytes < layout.total) throw std::logic_error("[embedding_backward] scratch too small");
  const PairSortBuffers b(scratch, layout);
  const auto s = static_cast<cudaStream_t>(stream);
  rows::visit_index(id_dtype, [&](auto index) {
    using I = decltype(index);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((shape.ids + 255) / 256, kMaxBlocks));
    sort_keys_kernel<I><<<blocks, 256, 0, s>>>(shape, static_cast<const I*>(ids), b.keys_in, b.positions_in);
  });
  check(cudaGetLastError(), "embedding_backward key kernel launch");
  size_t cub_bytes = layout.cub_bytes;
  check(cub::DeviceRadixSort::SortPairs(b.cub, cub_bytes, b.keys_in, b.keys_out, b.positions_in, b.positions_out,
                                        shape.ids, 0, key_bits(shape.rows), s),
        "cub::DeviceRadixSort::SortPairs");
  rows::visit_float(dtype, "embedding_backward", [&](auto e) {
    using E = decltype(e);
    embedding_backward_kernel<E><<<static_cast<unsigned>(std::min(shape.ids, kMaxBlocks)), kThreads, 0, s>>>(
        shape, static_cast<const typename E::S*>(grad_out), grad_row_stride, grad_col_stride, b.keys_out,
        b.positions_out, static_cast<typename E::S*>(grad_table));
  });
  check(cudaGetLastError(), "embedding_backward kernel launch");
}

}  // namespace dtensor::backend::cuda
