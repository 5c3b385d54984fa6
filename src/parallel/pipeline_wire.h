// The wire format of the pipeline's transfers (internal to src/parallel): the header
// sent ahead of an activation, the layout a gradient travels in, and the send buffers
// a failing rank must keep.
#pragma once

#include <cstdint>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor::parallel {

// dtype, ndim, 8 dims, length of the placements text, the text (one char per slot).
inline constexpr int64_t kMaxDims = 8;
inline constexpr int64_t kTextStart = 2 + kMaxDims + 1;
inline constexpr int64_t kHeaderSlots = kTextStart + 96;

struct ActivationHeader {
  Shape shape;
  DType dtype = DType::F32;
  Placements placements;
};

Tensor encode_header(const DistTensor& t);
ActivationHeader decode_header(const Tensor& header);

// The layout a gradient of `t` travels in: t's, with Partial read as Replicate (the
// gradient of a partial sum is the whole gradient on every coordinate).
Placements gradient_layout(const DistTensor& t);

// Buffers of sends a failing rank posted: a peer may still match one before it learns
// of the failure, so they must outlive the failing rank's stack (a few tensors, once
// per failed job).
void keep_until_exit(std::vector<Tensor> tensors);

}  // namespace dtensor::parallel
