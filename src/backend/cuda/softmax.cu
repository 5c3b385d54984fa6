// CUDA softmax and log_softmax (+ backward) along any dim of strided operands.
//
// One block per line (grid-stride over lines), its size from row_block_threads: a
// warp for short lines up to 512 threads for long ones. Three passes over the line,
// as the CPU's scalar loop: the maximum (NaN wins), the sum of exp(x - max) in double,
// then the outputs; the per-element math is row_ops.h's, shared with cpu/nn.cpp. The
// line is read from global memory each pass (L1/L2 serve the repeats); a shared-
// memory copy of short lines and vector loads of contiguous ones are left for later.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/row_kernels.cuh"
#include "backend/cuda/softmax.h"
#include "backend/row_ops.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int64_t kMaxBlocks = int64_t{1} << 20;

template <class E>
__global__ void softmax_kernel(LinePlan<2> plan, bool log, typename E::S* out, const typename E::S* in) {
  using C = typename E::C;
  const int64_t n = plan.length, sy = plan.step[0], sx = plan.step[1];
  for (int64_t line = blockIdx.x; line < plan.lines; line += gridDim.x) {
    int64_t base[2];
    plan.outer.offsets(line, base);
    typename E::S* y = out + base[0];
    const typename E::S* x = in + base[1];
    C m;
    double total;
    rows::line_max_and_exp_sum<E>(x, n, sx, m, total);
    if (log) {
      const C log_total = row::log_softmax_shift<C>(total);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        y[i * sy] = E::store(row::log_softmax_value(E::load(x[i * sx]), m, log_total));
      }
    } else {
      const C scale = row::softmax_scale<C>(total);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        y[i * sy] = E::store(row::softmax_value(row::shifted_exp(E::load(x[i * sx]), m), scale));
      }
    }
  }
}

template <class E>
__global__ void softmax_backward_kernel(LinePlan<3> plan, bool log, typename E::S* grad_in,
                                        const typename E::S* grad_out, const typename E::S* out) {
  using C = typename E::C;
  const int64_t n = plan.length, si = plan.step[0], sg = plan.step[1], sy = plan.step[2];
  for (int64_t line = blockIdx.x; line < plan.lines; line += gridDim.x) {
    int64_t base[3];
    plan.outer.offsets(line, base);
    typename E::S* gi = grad_in + base[0];
    const typename E::S* g = grad_out + base[1];
    const typename E::S* y = out + base[2];
    // log: total = sum g; else: dot = sum g * y (products in C), both in double.
    double acc = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C gv = E::load(g[i * sg]);
      acc += static_cast<double>(log ? gv : C(gv * E::load(y[i * sy])));
    }
    const C s = static_cast<C>(rows::block_reduce(acc, rows::Sum{}, 0.0));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C gv = E::load(g[i * sg]), yv = E::load(y[i * sy]);
      gi[i * si] = E::store(log ? row::log_softmax_grad(gv, yv, s) : row::softmax_grad(gv, yv, s));
    }
  }
}

unsigned blocks_for(int64_t lines) { return static_cast<unsigned>(std::min(lines, kMaxBlocks)); }

}  // namespace

void launch_softmax(DType dtype, const LinePlan<2>& plan, bool log, void* out, const void* in, void* stream) {
  if (plan.lines == 0) return;
  rows::visit_float(dtype, "softmax", [&](auto e) {
    using E = decltype(e);
    using S = typename E::S;
    softmax_kernel<E><<<blocks_for(plan.lines), row_block_threads(plan.length), 0, static_cast<cudaStream_t>(stream)>>>(
        plan, log, static_cast<S*>(out), static_cast<const S*>(in));
  });
  check(cudaGetLastError(), "softmax kernel launch");
}

void launch_softmax_backward(DType dtype, const LinePlan<3>& plan, bool log, void* grad_in, const void* grad_out,
                             const void* out, void* stream) {
  if (plan.lines == 0) return;
  rows::visit_float(dtype, "softmax_backward", [&](auto e) {
    using E = decltype(e);
    using S = typename E::S;
    softmax_backward_kernel<E>
        <<<blocks_for(plan.lines), row_block_threads(plan.length), 0, static_cast<cudaStream_t>(stream)>>>(
            plan, log, static_cast<S*>(grad_in), static_cast<const S*>(grad_out), static_cast<const S*>(out));
  });
  check(cudaGetLastError(), "softmax_backward kernel launch");
}

}  // namespace dtensor::backend::cuda
