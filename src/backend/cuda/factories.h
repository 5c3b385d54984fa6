// CUDA factories (internal): factories.cu. out is contiguous with n elements of
// `dtype`; each queues its kernel on `stream` (a cudaStream_t) and checks the launch.
#pragma once

#include <cstdint>

#include "dtensor/dtype.h"

namespace dtensor::backend::cuda {

enum class RandomKind : uint8_t { Normal, Uniform };

// out[i] = random::normal/uniform(seed, index_offset + i) converted to `dtype`.
void launch_random(RandomKind kind, uint64_t seed, uint64_t index_offset, int64_t n, DType dtype, void* out,
                   void* stream);
// out[i] = start + i * step (in double) converted to `dtype`.
void launch_arange(double start, double step, int64_t n, DType dtype, void* out, void* stream);

}  // namespace dtensor::backend::cuda
