// all_to_all between strided pieces of tensors (comm_backend.h, BlockLayout), for
// redistribution: Shard(d) -> Shard(e) sends column blocks of its local tensor and
// receives into row blocks of the output without packing or unpacking copies on
// backends that can address peers' memory.
#pragma once

#include "comm/comm_backend.h"
#include "dtensor/group.h"
#include "dtensor/tensor.h"

namespace dtensor::comm {

// The layout of the n pieces of `t` (contiguous) cut along `dim` with `sizes`:
// piece s is t.narrow(dim, sizes[0] + ... + sizes[s-1], sizes[s]).
BlockLayout blocks_along(const Tensor& t, int64_t dim, const std::vector<int64_t>& sizes);

// Sends piece s of `input` (layout `send`) to rank s and receives piece s of
// `output` (layout `recv`) from it. Both tensors contiguous, same dtype; what rank s
// sends rank r must have the size r expects. Synchronous; counted by CommDebugMode
// as one all_to_all of input.nbytes().
void all_to_all_blocks(const Group& group, const Tensor& input, const BlockLayout& send, const Tensor& output,
                       const BlockLayout& recv);

// One strided copy of a piece exchange, in elements: `height` runs of `width`
// elements, run h from src_offset + h * src_pitch to dst_offset + h * dst_pitch
// (pitches >= width, as cudaMemcpy2D wants).
struct PieceCopy {
  int64_t dst_offset = 0, dst_pitch = 0, src_offset = 0, src_pitch = 0, width = 0, height = 0;
};

// The copies that move the element stream of piece `from_piece` of `from_layout`
// into piece `to_piece` of `to_layout` (equal element counts): one where the two
// cut the stream alike (the same width, or either side dense), else one per run of
// a period of lcm(widths) elements, `height` periods each. copy_piece runs them on
// the host, the threads backend as 2D copies on a GPU.
std::vector<PieceCopy> plan_piece_copy(const BlockLayout& to_layout, int to_piece, const BlockLayout& from_layout,
                                       int from_piece);

// Copies the element stream of piece `from_piece` of `from_layout` in `src` into
// piece `to_piece` of `to_layout` in `dst` (equal element counts).
void copy_piece(std::byte* dst, const BlockLayout& to_layout, int to_piece, const std::byte* src,
                const BlockLayout& from_layout, int from_piece, size_t element_size);

}  // namespace dtensor::comm
