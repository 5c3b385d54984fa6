// Index arithmetic of the CUDA row kernels (internal), host code that the CPU tests
// cover (tests/test_row_ops.cpp).
//
// softmax and its backward work on the 1-D lines along one dim of N tensors of one
// shape, each with its own strides. A LinePlan numbers the lines row-major over the
// other dims: line l of operand k starts at element outer.offsets(l)[k] and steps by
// step[k] along the dim. Example: a [4, 5, 7] tensor, dim 1, contiguous: 28 lines of
// length 5, step 7; line 9 (outer index (1, 2)) starts at 1 * 35 + 2 = 37.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "backend/offset_calc.h"

namespace dtensor::backend {

template <int N>
struct LinePlan {
  OffsetCalc<N> outer;  // over the shape without `dim`
  int64_t step[N] = {};
  int64_t length = 0;  // elements per line
  int64_t lines = 0;   // 0 when the tensors are empty
};

// Returns false when more than kMaxOffsetDims outer dims remain after merging.
template <int N>
bool make_line_plan(const Shape& shape, const std::array<const int64_t*, N>& operand_strides, int64_t dim,
                    LinePlan<N>& plan) {
  plan = LinePlan<N>{};
  Shape outer_shape;
  std::array<std::vector<int64_t>, N> outer_strides;
  int64_t lines = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d == dim) continue;
    outer_shape.push_back(shape[static_cast<size_t>(d)]);
    lines *= shape[static_cast<size_t>(d)];
    for (int k = 0; k < N; ++k) outer_strides[static_cast<size_t>(k)].push_back(operand_strides[k][d]);
  }
  for (int k = 0; k < N; ++k) plan.step[k] = operand_strides[k][dim];
  plan.length = shape[static_cast<size_t>(dim)];
  plan.lines = plan.length == 0 ? 0 : lines;
  std::array<const int64_t*, N> pointers;
  for (int k = 0; k < N; ++k) pointers[static_cast<size_t>(k)] = outer_strides[static_cast<size_t>(k)].data();
  return make_offset_calc<N>(outer_shape, pointers, plan.outer);
}

// The split of a sum over `rows` into per-chunk partials (the norms' weight and bias
// gradients): chunk c covers rows [c * rows_per_chunk, min(rows, (c + 1) *
// rows_per_chunk)); every chunk is non-empty and together they cover each row once.
// The partials are then added in chunk order, so the result does not depend on
// scheduling. Example: rows 1000, target 256 rows per chunk -> 4 chunks of 250.
struct RowChunks {
  int64_t chunks = 0, rows_per_chunk = 0;
};

inline RowChunks make_row_chunks(int64_t rows, int64_t target_rows_per_chunk, int64_t max_chunks) {
  RowChunks c;
  if (rows <= 0) return c;
  int64_t chunks = (rows + target_rows_per_chunk - 1) / target_rows_per_chunk;
  if (chunks > max_chunks) chunks = max_chunks;
  c.rows_per_chunk = (rows + chunks - 1) / chunks;
  c.chunks = (rows + c.rows_per_chunk - 1) / c.rows_per_chunk;
  return c;
}

}  // namespace dtensor::backend

namespace dtensor::backend {

// Threads of the block that handles one row of `length` elements: a power of two
// from one warp (short rows) to 512, so that every thread has work where it can.
inline unsigned row_block_threads(int64_t length) {
  unsigned threads = 32;
  while (threads < 512 && static_cast<int64_t>(threads) < length) threads *= 2;
  return threads;
}

}  // namespace dtensor::backend
