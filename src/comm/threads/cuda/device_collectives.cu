// The threads backend's collectives on CUDA buffers: device-to-device copies
// (cudaMemcpyAsync / cudaMemcpy2DAsync through unified addressing, so peers on
// other GPUs work where peer access is possible) and one reduction kernel, queued
// on each rank's stream and ordered across the ranks with events (the protocol is
// in device_collectives.h). The reduction combines the sources in rank order with
// the host reduction's combiners (comm/reduce_ops.h) and the CPU's BF16/F16
// rounding, so a CUDA all-reduce gives the CPU one's bits.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/row_kernels.cuh"
#include "comm/block_all_to_all.h"
#include "comm/reduce_ops.h"
#include "comm/threads/algorithms.h"
#include "comm/threads/device_collectives.h"
#include "util/check.h"

namespace dtensor::comm::threads {

using backend::cuda::check;

struct DeviceCall {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr, complete = nullptr;
  DeviceCall() = default;
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;
  // Destroying an event whose work is still queued is allowed (released once it ran).
  ~DeviceCall() {
    for (cudaEvent_t e : {ready, done, complete}) {
      if (e) cudaEventDestroy(e);
    }
  }
};

namespace {

// Makes `device` current on the calling thread for the scope (a rank's own thread
// may have another one current; an async worker has none of its own).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Kernels on `mine` read and write `theirs`' memory: peer access, enabled once per pair.
void ensure_peer_access(int mine, int theirs) {
  if (mine == theirs) return;
  static std::mutex mutex;
  static std::set<std::pair<int, int>> enabled;
  std::lock_guard<std::mutex> lock(mutex);
  if (enabled.count({mine, theirs})) return;
  int can = 0;
  check(cudaDeviceCanAccessPeer(&can, mine, theirs), "cudaDeviceCanAccessPeer");
  DT_CHECK_SUPPORTED(can != 0, "threads", "ranks on cuda:", mine, " and cuda:", theirs,
                     " need peer access between the GPUs, which they do not have");
  const cudaError_t status = cudaDeviceEnablePeerAccess(theirs, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
  } else {
    check(status, "cudaDeviceEnablePeerAccess");
  }
  enabled.insert({mine, theirs});
}

// Runs `body(stream)` (it queues the rank's copies or kernel) between the waits for
// the peers' `ready` and the peers' `done`. Every rank reaches the one barrier
// inside, whatever fails (a throw between the call's barriers would desynchronise
// them); the first failure is rethrown after it.
template <class Body>
void on_device(ThreadsGroup& group, Body body) {
  const CallDesc& me = group.me();
  DeviceCall& call = *me.device_call;
  const int n = group.size();
  std::exception_ptr failed;
  try {
    DeviceGuard guard(call.device);
    for (int r = 0; r < n; ++r) {
      if (r == group.rank()) continue;
      ensure_peer_access(call.device, group.peer(r).device_call->device);
      check(cudaStreamWaitEvent(call.stream, group.peer(r).device_call->ready, 0), "cudaStreamWaitEvent");
    }
    body(call.stream);
    check(cudaEventRecord(call.done, call.stream), "cudaEventRecord");
  } catch (...) {
    failed = std::current_exception();
  }
  group.sync();  // every peer's `done` is recorded (or its rank failed and queued nothing)
  try {
    DeviceGuard guard(call.device);
    for (int r = 0; r < n; ++r) {
      if (r == group.rank()) continue;
      check(cudaStreamWaitEvent(call.stream, group.peer(r).device_call->done, 0), "cudaStreamWaitEvent");
    }
    check(cudaEventRecord(call.complete, call.stream), "cudaEventRecord");
  } catch (...) {
    if (!failed) failed = std::current_exception();
  }
  if (failed) std::rethrow_exception(failed);
}

void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
}

// ---- the reduction kernel ---------------------------------------------------------

constexpr int kMaxRanks = 64;  // pointers passed by value in the kernel's arguments
constexpr int kThreads = 256;

struct Pointers {
  const void* src[kMaxRanks];
  void* dst[kMaxRanks];
};

// Integers and Bool: stored as computed.
template <class T>
struct Plain {
  using S = T;
  using C = T;
  static __device__ __forceinline__ C load(S v) { return v; }
  static __device__ __forceinline__ S store(C v) { return v; }
};

// rows x width elements; source k's element (row, col) at src[k] + row * src_stride
// + col, stored to every destination at dst[d] + row * dst_stride + col.
template <class E, class Combine>
__global__ void reduce_kernel(Pointers p, int n, int ndst, int64_t rows, int64_t width, int64_t src_stride,
                              int64_t dst_stride, int divisor, Combine combine) {
  using S = typename E::S;
  using C = typename E::C;
  const int64_t total = rows * width;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t row = i / width, col = i - row * width;
    const int64_t s = row * src_stride + col, d = row * dst_stride + col;
    C acc = E::load(static_cast<const S*>(p.src[0])[s]);
    for (int k = 1; k < n; ++k) acc = combine(acc, E::load(static_cast<const S*>(p.src[k])[s]));
    if constexpr (std::is_floating_point_v<C>) {
      if (divisor > 1) acc /= static_cast<C>(divisor);
    }
    const S v = E::store(acc);
    for (int k = 0; k < ndst; ++k) static_cast<S*>(p.dst[k])[d] = v;
  }
}

template <class Fn>
void visit_elements(DType dtype, Fn&& fn) {
  namespace rows = backend::cuda::rows;
  switch (dtype) {
    case DType::F32: return fn(rows::F32{});
    case DType::F64: return fn(rows::F64{});
    case DType::BF16: return fn(rows::BF16{});
    case DType::F16: return fn(rows::F16{});
    case DType::I64: return fn(Plain<int64_t>{});
    case DType::I32: return fn(Plain<int32_t>{});
    case DType::Bool: return fn(Plain<bool>{});
  }
}

// The kernel over srcs (n) into dsts (ndst), with the host reduction's semantics
// (reduce_sources in comm/reduce.cpp).
void reduce(DType dtype, ReduceOp op, const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
            int64_t rows, int64_t width, int64_t src_stride, int64_t dst_stride, cudaStream_t stream) {
  const int n = static_cast<int>(srcs.size()), ndst = static_cast<int>(dsts.size());
  DT_CHECK_SUPPORTED(n <= kMaxRanks && ndst <= kMaxRanks, "threads", "reductions of CUDA tensors support up to ",
                     kMaxRanks, " ranks, the group has ", n);
  if (rows * width == 0 || ndst == 0) return;
  Pointers p{};
  std::copy(srcs.begin(), srcs.end(), p.src);
  std::copy(dsts.begin(), dsts.end(), p.dst);
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((rows * width + kThreads - 1) / kThreads, int64_t{1} << 16));
  visit_elements(dtype, [&](auto e) {
    using E = decltype(e);
    auto launch = [&](auto combine, int divisor) {
      reduce_kernel<E>
          <<<blocks, kThreads, 0, stream>>>(p, n, ndst, rows, width, src_stride, dst_stride, divisor, combine);
    };
    if constexpr (std::is_same_v<typename E::C, bool>) {
      if (op == ReduceOp::Sum || op == ReduceOp::Max) {
        launch(reduce_ops::Or{}, 1);
      } else {
        launch(reduce_ops::And{}, 1);
      }
    } else {
      switch (op) {
        case ReduceOp::Sum: launch(reduce_ops::Sum{}, 1); break;
        case ReduceOp::Avg: launch(reduce_ops::Sum{}, n); break;
        case ReduceOp::Product: launch(reduce_ops::Prod{}, 1); break;
        case ReduceOp::Max: launch(reduce_ops::Max{}, 1); break;
        case ReduceOp::Min: launch(reduce_ops::Min{}, 1); break;
      }
    }
  });
  check(cudaGetLastError(), "reduce_kernel");
}

const std::byte* bytes_of(const void* p) { return static_cast<const std::byte*>(p); }
std::byte* bytes_of(void* p) { return static_cast<std::byte*>(p); }

}  // namespace

std::shared_ptr<DeviceCall> begin_device_call(Device device) {
  auto call = std::make_shared<DeviceCall>();
  call->device = device.index;
  // The caller's current stream of the tensors' GPU (that GPU made current by it).
  call->stream = static_cast<cudaStream_t>(backend::cuda::current_stream(device.index));
  DeviceGuard guard(device.index);
  for (cudaEvent_t* e : {&call->ready, &call->done, &call->complete}) {
    check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  }
  check(cudaEventRecord(call->ready, call->stream), "cudaEventRecord");
  return call;
}

void wait_device_call(const DeviceCall& call) { check(cudaEventSynchronize(call.complete), "cudaEventSynchronize"); }

void device_p2p_copy(const DeviceCall& send, const DeviceCall& recv, void* dst, const void* src, size_t bytes) {
  {
    DeviceGuard guard(recv.device);
    check(cudaStreamWaitEvent(recv.stream, send.ready, 0), "cudaStreamWaitEvent");
    copy(dst, src, bytes, recv.stream);  // between GPUs too (unified addressing)
    check(cudaEventRecord(recv.done, recv.stream), "cudaEventRecord");
  }
  DeviceGuard guard(send.device);
  check(cudaStreamWaitEvent(send.stream, recv.done, 0), "cudaStreamWaitEvent");
  check(cudaEventRecord(send.done, send.stream), "cudaEventRecord");
}

bool device_call_finished(const DeviceCall& call) {
  const cudaError_t status = cudaEventQuery(call.done);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clears it
    return false;
  }
  check(status, "cudaEventQuery");
  return true;
}

// all_reduce by chunk owners, as the host's all_reduce_owner: rank r reduces chunk r
// of every input into chunk r of every output (one kernel per rank, 2 x bytes of
// traffic in all). In place is safe: only rank r touches chunk r anywhere, and each
// thread reads its element of every source before storing it.
void device_all_reduce(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    const int n = group.size();
    const int64_t esize = static_cast<int64_t>(dtype_size(me.dtype));
    const int64_t chunk = (me.count + n - 1) / n;
    const int64_t begin = std::min(me.count, group.rank() * chunk);
    const int64_t length = std::min(me.count, begin + chunk) - begin;
    if (length <= 0) return;
    std::vector<const void*> srcs(n);
    std::vector<void*> dsts(n);
    for (int r = 0; r < n; ++r) {
      srcs[r] = bytes_of(group.peer(r).in) + begin * esize;
      dsts[r] = bytes_of(group.peer(r).out) + begin * esize;
    }
    reduce(me.dtype, me.op, dsts, srcs, 1, length, length, length, stream);
  });
}

// Every rank copies every peer's rows into its own output (one 2D copy per peer).
void device_all_gather(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    const int n = group.size();
    const size_t esize = dtype_size(me.dtype);
    const std::vector<int64_t> offsets = prefix_offsets(me.counts);
    const size_t row = static_cast<size_t>(offsets[n]) * esize;
    for (int k = 0; k < n; ++k) {
      const int owner = (group.rank() + k) % n;
      const size_t width = static_cast<size_t>(me.counts[owner]) * esize;
      if (width == 0 || me.outer == 0) continue;
      std::byte* dst = bytes_of(me.out) + offsets[owner] * esize;
      const void* src = group.peer(owner).in;
      if (me.outer == 1) {
        copy(dst, src, width, stream);  // skipped in place (the input is my block)
      } else {
        check(cudaMemcpy2DAsync(dst, row, src, width, width, static_cast<size_t>(me.outer), cudaMemcpyDefault, stream),
              "cudaMemcpy2DAsync");
      }
    }
  });
}

// Rank r reduces block r of every row of every peer's input into its output.
void device_reduce_scatter(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    const int n = group.size();
    const int rank = group.rank();
    const int64_t esize = static_cast<int64_t>(dtype_size(me.dtype));
    const std::vector<int64_t> offsets = prefix_offsets(me.counts);
    std::vector<const void*> srcs(n);
    for (int r = 0; r < n; ++r) srcs[r] = bytes_of(group.peer(r).in) + offsets[rank] * esize;
    reduce(me.dtype, me.op, {me.out}, srcs, me.outer, me.counts[rank], offsets[n], me.counts[rank], stream);
  });
}

// Every rank copies, from each peer's input, the block that peer addressed to it.
void device_all_to_all(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    const int n = group.size();
    const int rank = group.rank();
    const size_t esize = dtype_size(me.dtype);
    const std::vector<int64_t> recv_offsets = prefix_offsets(me.recv_counts);
    for (int k = 0; k < n; ++k) {
      const int sender = (rank + k) % n;
      const CallDesc& peer = group.peer(sender);
      const std::vector<int64_t> send_offsets = prefix_offsets(peer.counts);
      copy(bytes_of(me.out) + recv_offsets[sender] * esize, bytes_of(peer.in) + send_offsets[rank] * esize,
           static_cast<size_t>(me.recv_counts[sender]) * esize, stream);
    }
  });
}

// The strided pieces, read and written where they lie: each peer's piece for this
// rank moved by the 2D copies plan_piece_copy gives (the host path's plan).
void device_all_to_all_blocks(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    const int n = group.size();
    const int rank = group.rank();
    const size_t esize = dtype_size(me.dtype);
    for (int k = 0; k < n; ++k) {
      const int sender = (rank + k) % n;
      const CallDesc& peer = group.peer(sender);
      for (const PieceCopy& c : plan_piece_copy(*me.recv_blocks, sender, *peer.send_blocks, rank)) {
        std::byte* dst = bytes_of(me.out) + c.dst_offset * static_cast<int64_t>(esize);
        const std::byte* src = bytes_of(peer.in) + c.src_offset * static_cast<int64_t>(esize);
        if (dst == src && c.dst_pitch == c.src_pitch) continue;  // in place, a group of one
        check(cudaMemcpy2DAsync(dst, static_cast<size_t>(c.dst_pitch) * esize, src,
                                static_cast<size_t>(c.src_pitch) * esize, static_cast<size_t>(c.width) * esize,
                                static_cast<size_t>(c.height), cudaMemcpyDefault, stream),
              "cudaMemcpy2DAsync");
      }
    }
  });
}

void device_broadcast(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    if (group.rank() == me.root) return;
    copy(me.out, group.peer(me.root).in, static_cast<size_t>(me.count) * dtype_size(me.dtype), stream);
  });
}

void device_gather(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    if (group.rank() != me.root) return;
    const size_t esize = dtype_size(me.dtype);
    const std::vector<int64_t> offsets = prefix_offsets(me.counts);
    for (int r = 0; r < group.size(); ++r) {
      copy(bytes_of(me.out) + offsets[r] * esize, group.peer(r).in, static_cast<size_t>(me.counts[r]) * esize, stream);
    }
  });
}

void device_scatter(ThreadsGroup& group) {
  on_device(group, [&](cudaStream_t stream) {
    const CallDesc& me = group.me();
    const int rank = group.rank();
    const size_t esize = dtype_size(me.dtype);
    const std::vector<int64_t> offsets = prefix_offsets(me.counts);
    copy(me.out, bytes_of(group.peer(me.root).in) + offsets[rank] * esize, static_cast<size_t>(me.counts[rank]) * esize,
         stream);
  });
}

}  // namespace dtensor::comm::threads
