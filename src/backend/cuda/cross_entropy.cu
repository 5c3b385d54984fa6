// CUDA cross entropy (+ backward) over the rows of strided [N, C] logits.
//
// One block per row (grid-stride over rows): the row maximum (NaN wins) and the sum
// of exp(x - max) in double, as the CPU's scalar loop, then the loss of the target
// or each class's gradient through row_ops.h's formulas. Rows whose target is
// ignore_index give loss 0 and a zero gradient row.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/row_kernels.cuh"
#include "backend/line_plan.h"
#include "backend/row_ops.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int64_t kMaxBlocks = int64_t{1} << 20;

// The row's maximum and lse = log(sum exp(x - max)), on every thread of the block.
template <class E>
__device__ void row_max_lse(const typename E::S* line, int64_t classes, int64_t step, typename E::C& m,
                            typename E::C& lse) {
  double total;
  rows::line_max_and_exp_sum<E>(line, classes, step, m, total);
  lse = row::log_softmax_shift<typename E::C>(total);
}

template <class E, class I>
__global__ void cross_entropy_kernel(CrossEntropyRows shape, const typename E::S* logits, const I* targets,
                                     typename E::C* losses) {
  using C = typename E::C;
  for (int64_t n = blockIdx.x; n < shape.rows; n += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[n * shape.target_stride]);
    if (t == shape.ignore_index) {  // uniform across the block: no reduction skipped by some threads only
      if (threadIdx.x == 0) losses[n] = C(0);
      continue;
    }
    const typename E::S* line = logits + n * shape.row_stride;
    C m, lse;
    row_max_lse<E>(line, shape.classes, shape.class_stride, m, lse);
    if (threadIdx.x == 0) {
      losses[n] = static_cast<C>(row::cross_entropy_loss(lse, m, E::load(line[t * shape.class_stride])));
    }
  }
}

template <class E, class I>
__global__ void cross_entropy_backward_kernel(CrossEntropyRows shape, const double* grad_rows,
                                              const typename E::S* logits, const I* targets,
                                              typename E::S* grad_logits) {
  using C = typename E::C;
  for (int64_t n = blockIdx.x; n < shape.rows; n += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[n * shape.target_stride]);
    typename E::S* out = grad_logits + n * shape.classes;
    if (t == shape.ignore_index) {
      for (int64_t c = threadIdx.x; c < shape.classes; c += blockDim.x) out[c] = E::store(C(0));
      continue;
    }
    const typename E::S* line = logits + n * shape.row_stride;
    C m, lse;
    row_max_lse<E>(line, shape.classes, shape.class_stride, m, lse);
    const C g = static_cast<C>(grad_rows[n]);
    for (int64_t c = threadIdx.x; c < shape.classes; c += blockDim.x) {
      out[c] = E::store(row::cross_entropy_grad(g, E::load(line[c * shape.class_stride]), m, lse, c == t));
    }
  }
}

}  // namespace

void launch_cross_entropy(DType dtype, DType target_dtype, const CrossEntropyRows& shape, const void* logits,
                          const void* targets, void* losses, void* stream) {
  if (shape.rows == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min(shape.rows, kMaxBlocks));
  rows::visit_float(dtype, "cross_entropy", [&](auto e) {
    using E = decltype(e);
    rows::visit_index(target_dtype, [&](auto i) {
      using I = decltype(i);
      cross_entropy_kernel<E, I><<<blocks, row_block_threads(shape.classes), 0, static_cast<cudaStream_t>(stream)>>>(
          shape, static_cast<const typename E::S*>(logits), static_cast<const I*>(targets),
          static_cast<typename E::C*>(losses));
    });
  });
  check(cudaGetLastError(), "cross_entropy kernel launch");
}

void launch_cross_entropy_backward(DType dtype, DType target_dtype, const CrossEntropyRows& shape,
                                   const double* grad_rows, const void* logits, const void* targets, void* grad_logits,
                                   void* stream) {
  if (shape.rows == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min(shape.rows, kMaxBlocks));
  rows::visit_float(dtype, "cross_entropy_backward", [&](auto e) {
    using E = decltype(e);
    rows::visit_index(target_dtype, [&](auto i) {
      using I = decltype(i);
      cross_entropy_backward_kernel<E, I>
          <<<blocks, row_block_threads(shape.classes), 0, static_cast<cudaStream_t>(stream)>>>(
              shape, grad_rows, static_cast<const typename E::S*>(logits), static_cast<const I*>(targets),
              static_cast<typename E::S*>(grad_logits));
    });
  });
  check(cudaGetLastError(), "cross_entropy_backward kernel launch");
}

}  // namespace dtensor::backend::cuda
