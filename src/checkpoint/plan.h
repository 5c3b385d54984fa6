// The shard arithmetic of checkpoints (internal, pure functions): which rank writes
// which chunk of an entry, and which byte ranges of the saved chunks a rank reads to
// fill the block it needs.
//
// A chunk is one rank's block of a tensor, stored row-major and contiguous. Saving
// writes each distinct non-empty block once: the holder whose coordinate is 0 on
// every mesh dim that does not shard the tensor. Loading intersects the block a rank
// needs (any mesh, any placements) with every saved chunk; each intersection is a
// set of byte runs, contiguous in the chunk and in the destination, which is what the
// rank reads. Worked example: [4, 6] f32 saved S(0) on 2 ranks, loaded S(1) on 3
// ranks. Chunks rows 0-1 and 2-3; rank 1 of the load needs columns 2-3 of every row,
// so from each chunk it reads 2 runs of 8 bytes (one per row), at chunk byte offsets
// 8 and 32, into destination bytes 0 and 8 (the first chunk) and 16 and 24.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/placement.h"

namespace dtensor::checkpoint::detail {

// A box of a global tensor: one Range per tensor dim (a scalar has none).
using Box = std::vector<Range>;

int64_t box_numel(const Box& box);
// The whole tensor.
Box full_box(const Shape& shape);
// Shape of the box (its lengths).
Shape box_shape(const Box& box);
// The common part of two boxes of one tensor; nullopt when it is empty.
std::optional<Box> intersect(const Box& a, const Box& b);

// The block this coordinate of a mesh holds (Partial dims hold the whole tensor along
// them, like Replicate).
Box block_of(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
             const std::vector<int64_t>& coordinate);

// Does the holder at `coordinate` write its block? Yes when the block is not empty and
// the coordinate is 0 on every mesh dim that does not split the tensor (Replicate,
// Partial, or a Shard over a mesh dim of size 1), so each distinct block is written
// exactly once.
bool writes_block(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                  const std::vector<int64_t>& coordinate);

// A contiguous piece of a read: `length` bytes at byte `source` of the chunk go to byte
// `destination` of the destination box (row-major, contiguous).
struct ByteRun {
  int64_t source = 0;
  int64_t destination = 0;
  int64_t length = 0;
  bool operator==(const ByteRun&) const = default;
};

// The runs that move `part` (inside both `chunk` and `destination`) from the chunk's
// bytes to the destination's, in row-major order of `part`, adjacent runs merged.
// Their lengths sum to box_numel(part) * element_size.
std::vector<ByteRun> byte_runs(const Box& chunk, const Box& destination, const Box& part, int64_t element_size);

// A byte range [begin, end) of one chunk.
struct ByteRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t length() const { return end - begin; }
  bool operator==(const ByteRange&) const = default;
};

// The ranges of a chunk of `chunk_bytes` to read for `runs`: with `block_bytes` > 0
// each run is widened to whole checksum blocks (so every byte read can be verified),
// blocks [k*block_bytes, min((k+1)*block_bytes, chunk_bytes)); then overlapping and
// touching ranges are merged. Sorted by begin.
std::vector<ByteRange> read_ranges(const std::vector<ByteRun>& runs, int64_t chunk_bytes, int64_t block_bytes);

// Number of checksum blocks of a chunk: ceil(chunk_bytes / block_bytes), 0 for an
// empty chunk.
int64_t block_count(int64_t chunk_bytes, int64_t block_bytes);

}  // namespace dtensor::checkpoint::detail
