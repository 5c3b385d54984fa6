// CUDA layer_norm and rms_norm (+ backward) on contiguous [rows, cols] matrices.
//
// Forward and the input gradient: one block per row (grid-stride over rows), sums
// in double as the CPU (the mean, then the squared deviations from it; in the
// backward mean(ghat) and mean(ghat * xhat)), the per-element math of row_ops.h.
// The weight and bias gradients are sums over rows, made deterministic without
// atomics: a first kernel gives each (chunk of rows, column) one F64 partial (32
// columns by 8 row lanes per block, so loads are coalesced along the row), a second
// adds each column's partials in chunk order and rounds once to the dtype.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/row_kernels.cuh"
#include "backend/row_ops.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int64_t kMaxBlocks = int64_t{1} << 20;
constexpr int kColumns = 32, kRowLanes = 8;  // the gradient partials' block

template <class E>
__global__ void norm_kernel(NormShape shape, double eps, const typename E::S* x, const typename E::S* weight,
                            const typename E::S* bias, typename E::S* out, typename E::C* mean,
                            typename E::C* rstd) {
  using C = typename E::C;
  const int64_t cols = shape.cols;
  for (int64_t r = blockIdx.x; r < shape.rows; r += gridDim.x) {
    const typename E::S* xr = x + r * cols;
    typename E::S* yr = out + r * cols;
    double mu = 0;
    if (shape.centered) {
      double s = 0;
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) s += static_cast<double>(E::load(xr[i]));
      mu = row::norm_mean(rows::block_reduce(s, rows::Sum{}, 0.0), cols);
    }
    double spread = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      spread += row::norm_deviation_sq(static_cast<double>(E::load(xr[i])), mu);
    }
    spread = rows::block_reduce(spread, rows::Sum{}, 0.0);
    const C inv = row::norm_rstd<C>(spread, cols, eps);
    const C m = static_cast<C>(mu);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      C w = C(0), b = C(0);
      if (weight) w = E::load(weight[i]);
      if (bias) b = E::load(bias[i]);
      yr[i] = E::store(row::norm_value(E::load(xr[i]), m, inv, weight ? &w : nullptr, bias ? &b : nullptr));
    }
    if (threadIdx.x == 0) {
      if (mean) mean[r] = m;
      rstd[r] = inv;
    }
  }
}

template <class E>
__global__ void norm_grad_in_kernel(NormShape shape, const typename E::S* grad_out, const typename E::S* x,
                                    const typename E::C* mean, const typename E::C* rstd,
                                    const typename E::S* weight, typename E::S* grad_in) {
  using C = typename E::C;
  const int64_t cols = shape.cols;
  for (int64_t r = blockIdx.x; r < shape.rows; r += gridDim.x) {
    const typename E::S* xr = x + r * cols;
    const typename E::S* gr = grad_out + r * cols;
    const C m = mean ? mean[r] : C(0), inv = rstd[r];
    auto ghat_at = [&](int64_t i) { return weight ? C(E::load(gr[i]) * E::load(weight[i])) : E::load(gr[i]); };
    double sum_g = 0, sum_gx = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      const C ghat = ghat_at(i);
      sum_g += static_cast<double>(ghat);
      sum_gx += static_cast<double>(C(ghat * row::norm_xhat(E::load(xr[i]), m, inv)));
    }
    const C mean_g =
        mean ? static_cast<C>(rows::block_reduce(sum_g, rows::Sum{}, 0.0) / static_cast<double>(cols)) : C(0);
    const C mean_gx = static_cast<C>(rows::block_reduce(sum_gx, rows::Sum{}, 0.0) / static_cast<double>(cols));
    typename E::S* gir = grad_in + r * cols;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      gir[i] = E::store(row::norm_grad(inv, ghat_at(i), mean_g, row::norm_xhat(E::load(xr[i]), m, inv), mean_gx));
    }
  }
}

// Block (kColumns, kRowLanes), grid (column tiles, chunks): partial_w/partial_b
// [chunk * cols + col] = sum over the chunk's rows of g * xhat and of g.
template <class E>
__global__ void norm_param_partials_kernel(NormShape shape, RowChunks chunks, const typename E::S* grad_out,
                                           const typename E::S* x, const typename E::C* mean,
                                           const typename E::C* rstd, double* partial_w, double* partial_b) {
  using C = typename E::C;
  __shared__ double lanes_w[kRowLanes][kColumns], lanes_b[kRowLanes][kColumns];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * chunks.rows_per_chunk;
  const int64_t r1 = r0 + chunks.rows_per_chunk < shape.rows ? r0 + chunks.rows_per_chunk : shape.rows;
  double w = 0, b = 0;
  if (col < shape.cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const C g = E::load(grad_out[r * shape.cols + col]);
      if (partial_w) {
        const C m = mean ? mean[r] : C(0);
        w += static_cast<double>(C(g * row::norm_xhat(E::load(x[r * shape.cols + col]), m, rstd[r])));
      }
      b += static_cast<double>(g);
    }
  }
  lanes_w[threadIdx.y][threadIdx.x] = w;
  lanes_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && col < shape.cols) {
    for (int lane = 1; lane < kRowLanes; ++lane) {
      w += lanes_w[lane][threadIdx.x];
      b += lanes_b[lane][threadIdx.x];
    }
    if (partial_w) partial_w[chunk * shape.cols + col] = w;
    if (partial_b) partial_b[chunk * shape.cols + col] = b;
  }
}

// out[col] = the column's partials added in chunk order (0 without rows).
template <class E>
__global__ void column_total_kernel(int64_t cols, int64_t chunks, const double* partial, typename E::S* out) {
  using C = typename E::C;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < cols;
       col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += partial[c * cols + col];
    out[col] = E::store(static_cast<C>(total));
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::max<int64_t>(1, std::min(n, kMaxBlocks))); }

}  // namespace

RowChunks norm_gradient_chunks(int64_t rows) { return make_row_chunks(rows, 128, 256); }

void launch_norm(DType dtype, const NormShape& shape, double eps, const void* x, const void* weight, const void* bias,
                 void* out, void* mean, void* rstd, void* stream) {
  if (shape.rows == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  rows::visit_float(dtype, "layer_norm", [&](auto e) {
    using E = decltype(e);
    using S = typename E::S;
    using C = typename E::C;
    norm_kernel<E><<<blocks_for(shape.rows), row_block_threads(shape.cols), 0, s>>>(
        shape, eps, static_cast<const S*>(x), static_cast<const S*>(weight), static_cast<const S*>(bias),
        static_cast<S*>(out), static_cast<C*>(mean), static_cast<C*>(rstd));
  });
  check(cudaGetLastError(), "norm kernel launch");
}

void launch_norm_backward(DType dtype, const NormShape& shape, const void* grad_out, const void* x, const void* mean,
                          const void* rstd, const void* weight, void* grad_in, void* grad_weight, void* grad_bias,
                          double* partials, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const RowChunks chunks = norm_gradient_chunks(shape.rows);
  double* partial_w = grad_weight ? partials : nullptr;
  double* partial_b = grad_bias ? partials + (grad_weight ? chunks.chunks * shape.cols : 0) : nullptr;
  rows::visit_float(dtype, "layer_norm_backward", [&](auto e) {
    using E = decltype(e);
    using S = typename E::S;
    using C = typename E::C;
    const auto* g = static_cast<const S*>(grad_out);
    const auto* xs = static_cast<const S*>(x);
    const auto* m = static_cast<const C*>(mean);
    const auto* inv = static_cast<const C*>(rstd);
    if (shape.rows > 0) {
      norm_grad_in_kernel<E><<<blocks_for(shape.rows), row_block_threads(shape.cols), 0, s>>>(
          shape, g, xs, m, inv, static_cast<const S*>(weight), static_cast<S*>(grad_in));
    }
    if (!grad_weight && !grad_bias) return;
    if (chunks.chunks > 0 && shape.cols > 0) {
      const dim3 grid(static_cast<unsigned>((shape.cols + kColumns - 1) / kColumns), static_cast<unsigned>(chunks.chunks));
      norm_param_partials_kernel<E>
          <<<grid, dim3(kColumns, kRowLanes), 0, s>>>(shape, chunks, g, xs, m, inv, partial_w, partial_b);
    }
    const unsigned blocks = blocks_for((shape.cols + 255) / 256);
    if (grad_weight) {
      column_total_kernel<E><<<blocks, 256, 0, s>>>(shape.cols, chunks.chunks, partial_w, static_cast<S*>(grad_weight));
    }
    if (grad_bias) {
      column_total_kernel<E><<<blocks, 256, 0, s>>>(shape.cols, chunks.chunks, partial_b, static_cast<S*>(grad_bias));
    }
  });
  check(cudaGetLastError(), "norm_backward kernel launch");
}

}  // namespace dtensor::backend::cuda
