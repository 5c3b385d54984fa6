// Flat buffers of several parameters or gradients, and the copies between them
// (internal to src/parallel): the one flat-bucket type of FSDP (a group's sharded and
// gathered buffers, N = the shard group's size) and of DDP (a gradient bucket: the
// N = 1 case, where the three layouts below are the same buffer, the tensors one
// after another).
//
// Three layouts of the same parameters, for N ranks of the shard group:
//   unsharded  [U]      the parameters' local tensors one after another, as forward
//                       uses them (each one a contiguous view);
//   region     [R]      one rank's shards one after another, each padded to
//                       chunk_rows = ceil(rows / N) rows, so that every rank's
//                       region has the same layout and collectives need no sizes;
//   rank-major [N * R]  the regions of all ranks in rank order: the all-gather's
//                       output and the reduce-scatter's input.
// A shard is rows chunk_range(rows, N, rank) of dim 0 (DESIGN's chunk rule), so
// trailing ranks may hold short or empty shards; the padding is zeros.
//
// Example: parameters of 5x2 and 3x1 on 2 ranks: chunk_rows 3 and 2, slots of 6 and 2
// elements, R = 8. Rank 0's region holds rows 0..2 of the first and rows 0..1 of the
// second; rank 1's holds rows 3..4 of the first (4 elements, then 2 of padding) and
// row 2 of the second (1 element, then 1 of padding).
#pragma once

#include <cstdint>
#include <vector>

#include "dtensor/placement.h"
#include "dtensor/tensor.h"

namespace dtensor::parallel::detail {

struct FlatSlot {
  int64_t rows = 0;              // dim 0 of the unsharded local tensor
  int64_t row_numel = 0;         // elements per row
  int64_t chunk_rows = 0;        // rows every rank's slot has room for
  int64_t slot_offset = 0;       // in a region
  int64_t unsharded_offset = 0;  // in the unsharded buffer
  int64_t slot_numel() const { return chunk_rows * row_numel; }
  int64_t numel() const { return rows * row_numel; }
};

class FlatLayout {
 public:
  FlatLayout() = default;
  // One slot per shape, for `rank` of `ranks`. With ranks > 1 (sharding along dim 0)
  // every shape has a dim; with one rank a 0-d shape takes one element.
  FlatLayout(const std::vector<Shape>& unsharded_shapes, int64_t ranks, int64_t rank);

  int64_t ranks() const { return ranks_; }
  int64_t rank() const { return rank_; }
  int64_t region_numel() const { return region_numel_; }
  int64_t unsharded_numel() const { return unsharded_numel_; }
  const std::vector<FlatSlot>& slots() const { return slots_; }
  const Shape& unsharded_shape(size_t i) const { return shapes_[i]; }
  // The shape of this rank's shard of parameter i.
  Shape shard_shape(size_t i) const;

  // Views: parameter i's shard in a region [R], its unsharded tensor in [U].
  Tensor shard_view(const Tensor& region, size_t i) const;
  Tensor unsharded_view(const Tensor& unsharded, size_t i) const;

  // Copies this rank's shard of every parameter from unsharded tensors into a region
  // (padding zeroed): how a group's shard buffer is first filled.
  void scatter_into_region(const std::vector<Tensor>& unsharded, const Tensor& region) const;
  // The gathered rank-major buffer into the unsharded buffer.
  void unpack(const Tensor& rank_major, const Tensor& unsharded) const;
  // Parameter i's whole local gradient into its slots of a rank-major buffer (added to
  // what is there with `accumulate`; dtypes convert).
  void pack(size_t i, const Tensor& grad, const Tensor& rank_major, bool accumulate) const;
  // Zeros parameter i's slots on every rank (a parameter without gradient), or only
  // their padding.
  void zero_slots(size_t i, const Tensor& rank_major) const;
  void zero_padding(const Tensor& rank_major) const;

 private:
  // Parameter i's slots of every rank, [N, slot_numel], a view of a rank-major buffer.
  Tensor slots_of(const Tensor& rank_major, size_t i) const;

  int64_t ranks_ = 1, rank_ = 0;
  std::vector<Shape> shapes_;
  std::vector<FlatSlot> slots_;
  int64_t region_numel_ = 0, unsharded_numel_ = 0;
};

}  // namespace dtensor::parallel::detail
