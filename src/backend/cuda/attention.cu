// Fused attention on CUDA, forward and backward, never the [Sq, Sk] scores in memory.
// BF16 with head and value dims multiples of 16 runs the tiled tensor-core kernels of
// attention_tiles.h (64-row blocks, wmma products, the CPU tests run the same code
// with HostExec/HostMma); everything else (F32, odd head dims) the row kernels below:
// simple and exact, one block per query row (forward, grad_q) or key row (grad_k,
// grad_v). The semantics are cpu/attention.cpp's: scale applied to the
// scores, the causal mask keeps key j for query i when j <= i (top-left), lse the
// log-sum-exp of each row's scaled scores (F32), arithmetic in F32 and BF16 rounded
// once on store; the batch plan is attention_plan.h's, tested on the CPU.
//
// Forward: the block walks the visible keys in tiles of kThreads, one key per thread
// (its score a dot product over D), and keeps an online softmax (running max m, sum
// l) with the output row accumulated in shared memory, each thread owning columns.
// Backward (FlashAttention-2's formulas): delta = rowsum(dO * O); P = exp(scale S -
// lse) recomputed; dS = scale P (dP - delta), dP = dO V^T; grad_q = dS K per query
// block, then grad_v = P^T dO and grad_k = dS^T Q per key block, so nothing is
// accumulated across blocks (no atomics, deterministic).
//
// The row kernels are not fast (no tensor cores, no shared K/V tiles); the tiled ones
// are a first tensor-core schedule (FlashAttention-2's, through wmma and shared
// memory), not yet FlashAttention's register-resident one.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/attention_tiles.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"

namespace dtensor::backend::cuda {
namespace {

constexpr int kThreads = 128;  // also the tile of keys (forward) or queries (grad_k/grad_v)
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const uint16_t* p, int64_t i) { return scalar::bf16_bits_to_f32(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(uint16_t* p, int64_t i, float v) { p[i] = scalar::f32_to_bf16_bits(v); }

// The block's max or sum of v, returned to every thread; scratch holds kWarps floats.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = scratch[0];
  for (int w = 1; w < kWarps; ++w) total = kMax ? fmaxf(total, scratch[w]) : total + scratch[w];
  __syncthreads();  // scratch is reused by the next call
  return total;
}

// sum over x < n of a[x] * row[x] (a in shared memory, row an operand's row).
template <class T>
__device__ __forceinline__ float dot(const float* a, const T* row, int64_t n) {
  float s = 0;
  for (int64_t x = 0; x < n; ++x) s += a[x] * load(row, x);
  return s;
}

// acc[c] = acc[c] * keep + sum over t < count of weight[t] * rows[t * row_stride + c]
// for the columns c < width this thread owns (c = threadIdx.x mod kThreads).
template <class T>
__device__ __forceinline__ void accumulate_rows(float* acc, int64_t width, float keep, const float* weight,
                                                int64_t count, const T* rows, int64_t row_stride) {
  for (int64_t c = threadIdx.x; c < width; c += kThreads) {
    float a = acc[c] * keep;
    for (int64_t t = 0; t < count; ++t) a += weight[t] * load(rows + t * row_stride, c);
    acc[c] = a;
  }
}

template <class T>
__global__ void forward_kernel(AttentionShape s, AttentionRows qr, AttentionRows kr, AttentionRows vr,
                               AttentionRows outr, const T* q, const T* k, const T* v, T* out, float* lse) {
  extern __shared__ float smem[];
  float* qs = smem;               // [head_dim]
  float* acc = qs + s.head_dim;   // [value_dim]
  float* p = acc + s.value_dim;   // [kThreads]
  float* scratch = p + kThreads;  // [kWarps]
  const int64_t i = blockIdx.x, e = blockIdx.y;
  const T* q_row = q + entry_offset(s.batch, qr, e) + i * qr.row_stride;
  const T* k_entry = k + entry_offset(s.batch, kr, e);
  const T* v_entry = v + entry_offset(s.batch, vr, e);
  for (int64_t x = threadIdx.x; x < s.head_dim; x += kThreads) qs[x] = load(q_row, x);
  for (int64_t c = threadIdx.x; c < s.value_dim; c += kThreads) acc[c] = 0;
  __syncthreads();
  const int64_t key_end = s.causal ? (i + 1 < s.keys ? i + 1 : s.keys) : s.keys;
  float m = -INFINITY, l = 0;
  for (int64_t j0 = 0; j0 < key_end; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    const bool visible = j < key_end;
    const float score = visible ? dot(qs, k_entry + j * kr.row_stride, s.head_dim) * s.scale : -INFINITY;
    const float new_m = fmaxf(m, block_reduce<true>(score, scratch));  // finite: key j0 is visible
    const float pj = visible ? expf(score - new_m) : 0.0f;
    const float correction = expf(m - new_m);  // 0 on the first tile (m = -inf)
    l = l * correction + block_reduce<false>(pj, scratch);
    p[threadIdx.x] = pj;
    __syncthreads();
    const int64_t cols = key_end - j0 < kThreads ? key_end - j0 : kThreads;
    accumulate_rows(acc, s.value_dim, correction, p, cols, v_entry + j0 * vr.row_stride, vr.row_stride);
    __syncthreads();
    m = new_m;
  }
  T* out_row = out + entry_offset(s.batch, outr, e) + i * outr.row_stride;
  const float inv = 1.0f / l;  // no visible key: 0 * inf = NaN, as softmax of nothing (the CPU's)
  for (int64_t c = threadIdx.x; c < s.value_dim; c += kThreads) store(out_row, c, acc[c] * inv);
  if (threadIdx.x == 0) lse[e * s.queries + i] = m + logf(l);
}

template <class T>
__global__ void grad_q_kernel(AttentionShape s, AttentionGradRows r, const T* grad_out, const T* q, const T* k,
                              const T* v, const T* out, const float* lse, float* delta, T* grad_q) {
  extern __shared__ float smem[];
  float* qs = smem;                // [head_dim]
  float* gs = qs + s.head_dim;     // [value_dim]: this row of grad_out
  float* dq = gs + s.value_dim;    // [head_dim]
  float* ds = dq + s.head_dim;     // [kThreads]
  float* scratch = ds + kThreads;  // [kWarps]
  const int64_t i = blockIdx.x, e = blockIdx.y;
  const T* q_row = q + entry_offset(s.batch, r.q, e) + i * r.q.row_stride;
  const T* g_row = grad_out + entry_offset(s.batch, r.grad_out, e) + i * r.grad_out.row_stride;
  const T* o_row = out + entry_offset(s.batch, r.out, e) + i * r.out.row_stride;
  const T* k_entry = k + entry_offset(s.batch, r.k, e);
  const T* v_entry = v + entry_offset(s.batch, r.v, e);
  for (int64_t x = threadIdx.x; x < s.head_dim; x += kThreads) {
    qs[x] = load(q_row, x);
    dq[x] = 0;
  }
  float part = 0;
  for (int64_t c = threadIdx.x; c < s.value_dim; c += kThreads) {
    gs[c] = load(g_row, c);
    part += gs[c] * load(o_row, c);
  }
  const float row_delta = block_reduce<false>(part, scratch);  // its __syncthreads publishes qs, gs
  const float row_lse = lse[e * s.queries + i];
  const int64_t key_end = s.causal ? (i + 1 < s.keys ? i + 1 : s.keys) : s.keys;
  for (int64_t j0 = 0; j0 < key_end; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float dsj = 0;
    if (j < key_end) {
      const float pj = expf(dot(qs, k_entry + j * r.k.row_stride, s.head_dim) * s.scale - row_lse);
      const float dp = dot(gs, v_entry + j * r.v.row_stride, s.value_dim);
      dsj = s.scale * pj * (dp - row_delta);
    }
    ds[threadIdx.x] = dsj;
    __syncthreads();
    const int64_t cols = key_end - j0 < kThreads ? key_end - j0 : kThreads;
    accumulate_rows(dq, s.head_dim, 1.0f, ds, cols, k_entry + j0 * r.k.row_stride, r.k.row_stride);
    __syncthreads();
  }
  T* dq_row = grad_q + entry_offset(s.batch, r.grad_q, e) + i * r.grad_q.row_stride;
  for (int64_t x = threadIdx.x; x < s.head_dim; x += kThreads) store(dq_row, x, dq[x]);
  if (threadIdx.x == 0) delta[e * s.queries + i] = row_delta;
}

template <class T>
__global__ void grad_kv_kernel(AttentionShape s, AttentionGradRows r, const T* grad_out, const T* q, const T* k,
                               const T* v, const float* lse, const float* delta, T* grad_k, T* grad_v) {
  extern __shared__ float smem[];
  float* ks = smem;              // [head_dim]
  float* vs = ks + s.head_dim;   // [value_dim]
  float* dk = vs + s.value_dim;  // [head_dim]
  float* dv = dk + s.head_dim;   // [value_dim]
  float* p = dv + s.value_dim;   // [kThreads]
  float* ds = p + kThreads;      // [kThreads]
  const int64_t j = blockIdx.x, e = blockIdx.y;
  const T* k_row = k + entry_offset(s.batch, r.k, e) + j * r.k.row_stride;
  const T* v_row = v + entry_offset(s.batch, r.v, e) + j * r.v.row_stride;
  const T* q_entry = q + entry_offset(s.batch, r.q, e);
  const T* g_entry = grad_out + entry_offset(s.batch, r.grad_out, e);
  const float* lse_entry = lse + e * s.queries;
  const float* delta_entry = delta + e * s.queries;
  for (int64_t x = threadIdx.x; x < s.head_dim; x += kThreads) {
    ks[x] = load(k_row, x);
    dk[x] = 0;
  }
  for (int64_t c = threadIdx.x; c < s.value_dim; c += kThreads) {
    vs[c] = load(v_row, c);
    dv[c] = 0;
  }
  __syncthreads();
  // With the causal mask only queries i >= j see key j.
  for (int64_t i0 = s.causal ? j : 0; i0 < s.queries; i0 += kThreads) {
    const int64_t i = i0 + threadIdx.x;
    float pi = 0, dsi = 0;
    if (i < s.queries) {
      pi = expf(dot(ks, q_entry + i * r.q.row_stride, s.head_dim) * s.scale - lse_entry[i]);
      const float dp = dot(vs, g_entry + i * r.grad_out.row_stride, s.value_dim);
      dsi = s.scale * pi * (dp - delta_entry[i]);
    }
    p[threadIdx.x] = pi;
    ds[threadIdx.x] = dsi;
    __syncthreads();
    const int64_t rows = s.queries - i0 < kThreads ? s.queries - i0 : kThreads;
    accumulate_rows(dv, s.value_dim, 1.0f, p, rows, g_entry + i0 * r.grad_out.row_stride, r.grad_out.row_stride);
    accumulate_rows(dk, s.head_dim, 1.0f, ds, rows, q_entry + i0 * r.q.row_stride, r.q.row_stride);
    __syncthreads();
  }
  T* dk_row = grad_k + entry_offset(s.batch, r.grad_k, e) + j * r.grad_k.row_stride;
  T* dv_row = grad_v + entry_offset(s.batch, r.grad_v, e) + j * r.grad_v.row_stride;
  for (int64_t x = threadIdx.x; x < s.head_dim; x += kThreads) store(dk_row, x, dk[x]);
  for (int64_t c = threadIdx.x; c < s.value_dim; c += kThreads) store(dv_row, c, dv[c]);
}

// ---- the tiled kernels: attention_tiles.h's blocks with the GPU's Exec and Mma -------

namespace tiles = attention_tiles;
namespace wmma = nvcuda::wmma;

struct DeviceExec {
  template <class F>
  __device__ void threads(F&& f) {
    f(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
  template <class F>
  __device__ void warps(F&& f) {
    f(static_cast<int>(threadIdx.x / 32));
    __syncthreads();
  }
};

// BF16 fragments exist from compute capability 8.0 (crt/mma.h); a build for older
// architectures keeps the tiled kernels empty and never launches them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
struct DeviceMma {
  template <bool kCol>
  using Layout = std::conditional_t<kCol, wmma::col_major, wmma::row_major>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  template <bool kCol>
  using A = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, Layout<kCol>>;
  template <bool kCol>
  using B = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, Layout<kCol>>;
  __device__ static void zero(Acc& acc) { wmma::fill_fragment(acc, 0.0f); }
  __device__ static void load_acc(Acc& acc, const float* p, int ld) {
    wmma::load_matrix_sync(acc, p, ld, wmma::mem_row_major);
  }
  __device__ static void store_acc(float* p, const Acc& acc, int ld) {
    wmma::store_matrix_sync(p, acc, ld, wmma::mem_row_major);
  }
  template <bool kCol>
  __device__ static void load_a(A<kCol>& f, const uint16_t* p, int ld) {
    wmma::load_matrix_sync(f, reinterpret_cast<const __nv_bfloat16*>(p), ld);
  }
  template <bool kCol>
  __device__ static void load_b(B<kCol>& f, const uint16_t* p, int ld) {
    wmma::load_matrix_sync(f, reinterpret_cast<const __nv_bfloat16*>(p), ld);
  }
  template <class FA, class FB>
  __device__ static void mma(Acc& acc, const FA& a, const FB& b) {
    wmma::mma_sync(acc, a, b, acc);
  }
};

// Dynamic shared memory, aligned for the 16-byte chunks and wmma's 32-byte rule.
__device__ unsigned char* tile_memory() {
  extern __shared__ __align__(128) unsigned char tile_smem[];
  return tile_smem;
}
#endif

__global__ void __launch_bounds__(tiles::kThreads)
    tiled_forward_kernel(AttentionShape s, AttentionRows qr, AttentionRows kr, AttentionRows vr, AttentionRows outr,
                         const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out, float* lse) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  DeviceExec ex;
  tiles::forward_block<DeviceExec, DeviceMma>(ex, s, qr, kr, vr, outr, q, k, v, out, lse, blockIdx.x, blockIdx.y,
                                              tile_memory());
#endif
}

// grad_q (kKeys false: blocks of queries) or grad_k/grad_v (blocks of keys).
template <bool kKeys>
__global__ void __launch_bounds__(tiles::kThreads)
    tiled_grad_kernel(AttentionShape s, AttentionGradRows r, tiles::GradOperands x) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  DeviceExec ex;
  if constexpr (kKeys) {
    tiles::grad_kv_block<DeviceExec, DeviceMma>(ex, s, r, x, blockIdx.x, blockIdx.y, tile_memory());
  } else {
    tiles::grad_q_block<DeviceExec, DeviceMma>(ex, s, r, x, blockIdx.x, blockIdx.y, tile_memory());
  }
#endif
}

// The shared memory a block of the tiled kernels may opt in to on the current device,
// 0 where they cannot run (BF16 wmma needs compute capability 8.0); asked once per
// device.
size_t tiled_shared_limit() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> limits[kMaxDevices];  // 0: not asked yet; -1: none
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device >= kMaxDevices) return 0;
  int64_t limit = limits[device].load(std::memory_order_relaxed);
  if (limit == 0) {
    int major = 0, bytes = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
          "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    limit = major >= 8 && bytes > 0 ? bytes : -1;
    limits[device].store(limit, std::memory_order_relaxed);
  }
  return limit > 0 ? static_cast<size_t>(limit) : 0;
}

// Launches `kernel` on a grid of 64-row tiles x entries with `bytes` of shared memory
// (opted in above the default 48 KiB).
template <class Kernel, class... Args>
void launch_tiled(Kernel kernel, int64_t rows, size_t bytes, const AttentionShape& s, cudaStream_t stream,
                  const char* what, Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  const dim3 grid(static_cast<unsigned>((rows + tiles::kTile - 1) / tiles::kTile),
                  static_cast<unsigned>(s.batch.entries));
  kernel<<<grid, tiles::kThreads, bytes, stream>>>(s, args...);
  check(cudaGetLastError(), what);
}

// Calls fn(T{}) with the storage type: float, or uint16_t for BF16 bit patterns.
template <class Fn>
void visit(bool bf16, Fn&& fn) {
  if (bf16) {
    fn(uint16_t{});
  } else {
    fn(float{});
  }
}

// The row kernels' shared memory: the largest of the three is grad_kv's (two rows,
// two accumulators, two tiles).
size_t row_kernel_shared_bytes(const AttentionShape& s) {
  const int64_t floats = 2 * s.head_dim + 2 * s.value_dim + 2 * kThreads + kWarps;
  return static_cast<size_t>(floats) * sizeof(float);
}
constexpr size_t kRowKernelMaxSharedBytes = 48 * 1024;

}  // namespace

bool attention_tiled(const AttentionShape& s, bool backward) {
  if (!tiles::applies(s)) return false;
  const size_t bytes =
      backward ? std::max(tiles::GradQLayout(s).bytes, tiles::GradKVLayout(s).bytes) : tiles::ForwardLayout(s).bytes;
  return bytes <= tiled_shared_limit();
}

bool attention_fits(const AttentionShape& s) {
  const bool rows_fit = row_kernel_shared_bytes(s) <= kRowKernelMaxSharedBytes;
  return (attention_tiled(s, false) || rows_fit) && (attention_tiled(s, true) || rows_fit);
}

void launch_attention(const AttentionShape& s, const AttentionRows& q_rows, const AttentionRows& k_rows,
                      const AttentionRows& v_rows, const AttentionRows& out_rows, const void* q, const void* k,
                      const void* v, void* out, float* lse, void* stream) {
  if (s.queries == 0 || s.batch.entries == 0) return;
  if (attention_tiled(s, false)) {
    launch_tiled(tiled_forward_kernel, s.queries, tiles::ForwardLayout(s).bytes, s, static_cast<cudaStream_t>(stream),
                 "tiled attention kernel launch", q_rows, k_rows, v_rows, out_rows, static_cast<const uint16_t*>(q),
                 static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v), static_cast<uint16_t*>(out), lse);
    return;
  }
  const dim3 grid(static_cast<unsigned>(s.queries), static_cast<unsigned>(s.batch.entries));
  const size_t shared = static_cast<size_t>(s.head_dim + s.value_dim + kThreads + kWarps) * sizeof(float);
  visit(s.bf16, [&](auto tag) {
    using T = decltype(tag);
    forward_kernel<T><<<grid, kThreads, shared, static_cast<cudaStream_t>(stream)>>>(
        s, q_rows, k_rows, v_rows, out_rows, static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), static_cast<T*>(out), lse);
  });
  check(cudaGetLastError(), "attention kernel launch");
}

void launch_attention_backward(const AttentionShape& s, const AttentionGradRows& rows, const void* grad_out,
                               const void* q, const void* k, const void* v, const void* out, const float* lse,
                               float* delta, void* grad_q, void* grad_k, void* grad_v, void* stream) {
  if (s.queries == 0 || s.keys == 0 || s.batch.entries == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  if (attention_tiled(s, true)) {
    const tiles::GradOperands x{static_cast<const uint16_t*>(grad_out),
                                static_cast<const uint16_t*>(q),
                                static_cast<const uint16_t*>(k),
                                static_cast<const uint16_t*>(v),
                                static_cast<const uint16_t*>(out),
                                lse,
                                delta,
                                static_cast<uint16_t*>(grad_q),
                                static_cast<uint16_t*>(grad_k),
                                static_cast<uint16_t*>(grad_v)};
    launch_tiled(tiled_grad_kernel<false>, s.queries, tiles::GradQLayout(s).bytes, s, st,
                 "tiled attention grad_q launch", rows, x);
    // Same stream: it runs after the grad_q kernel has written delta.
    launch_tiled(tiled_grad_kernel<true>, s.keys, tiles::GradKVLayout(s).bytes, s, st, "tiled attention grad_kv launch",
                 rows, x);
    return;
  }
  const unsigned entries = static_cast<unsigned>(s.batch.entries);
  const size_t q_shared = static_cast<size_t>(2 * s.head_dim + s.value_dim + kThreads + kWarps) * sizeof(float);
  const size_t kv_shared = row_kernel_shared_bytes(s);
  visit(s.bf16, [&](auto tag) {
    using T = decltype(tag);
    grad_q_kernel<T><<<dim3(static_cast<unsigned>(s.queries), entries), kThreads, q_shared, st>>>(
        s, rows, static_cast<const T*>(grad_out), static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), static_cast<const T*>(out), lse, delta, static_cast<T*>(grad_q));
    check(cudaGetLastError(), "attention grad_q kernel launch");
    // Same stream: it runs after grad_q_kernel has written delta.
    grad_kv_kernel<T><<<dim3(static_cast<unsigned>(s.keys), entries), kThreads, kv_shared, st>>>(
        s, rows, static_cast<const T*>(grad_out), static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), lse, delta, static_cast<T*>(grad_k), static_cast<T*>(grad_v));
    check(cudaGetLastError(), "attention grad_kv kernel launch");
  });
}

}  // namespace dtensor::backend::cuda
