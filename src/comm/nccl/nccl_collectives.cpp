// The NCCL backend's collectives and point to point (nccl_group.h for the ordering).
// Row blocks (comm_backend.h) map onto NCCL's equal contiguous blocks directly, by
// packing, or per rank (nccl_support.h's BlockRoute); host buffers go to the host group.
#include <algorithm>
#include <numeric>
#include <thread>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "comm/nccl/nccl_group.h"
#include "comm/nccl_support.h"
#include "util/check.h"

namespace dtensor::comm::nccl {

namespace {

using backend::cuda::check;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I64: return ncclInt64;
    case DType::I32: return ncclInt32;
    case DType::Bool: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(DType dtype, ReduceOp op) {
  switch (nccl_reduce_op(dtype, op)) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Product: return ncclProd;
  }
  return ncclSum;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), int64_t{0});
  return offsets;
}

const std::byte* at(const void* p, int64_t elements, size_t esize) {
  return static_cast<const std::byte*>(p) + elements * static_cast<int64_t>(esize);
}
std::byte* at(void* p, int64_t elements, size_t esize) {
  return static_cast<std::byte*>(p) + elements * static_cast<int64_t>(esize);
}

// `rows` segments of `width` elements, `src_stride` apart, to `dst_stride` apart.
void copy_rows(void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t width, int64_t rows,
               size_t esize, cudaStream_t stream) {
  if (width == 0 || rows == 0) return;
  if (rows == 1) {  // a single segment: its stride means nothing (it may be 0)
    backend::cuda::check(cudaMemcpyAsync(dst, src, width * esize, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    return;
  }
  backend::cuda::check(cudaMemcpy2DAsync(dst, dst_stride * esize, src, src_stride * esize, width * esize, rows,
                                         cudaMemcpyDeviceToDevice, stream),
                       "cudaMemcpy2DAsync");
}

// ncclGroupStart for the scope: an exception before end() still closes the group
// (NCCL's group depth is per thread: left open, every later call of the thread would
// be held in it).
class NcclGroupScope {
 public:
  NcclGroupScope() : open_(ncclGroupStart() == ncclSuccess) {}
  ~NcclGroupScope() {
    if (open_) ncclGroupEnd();
  }
  NcclGroupScope(const NcclGroupScope&) = delete;
  NcclGroupScope& operator=(const NcclGroupScope&) = delete;
  ncclResult_t end() {
    if (!open_) return ncclInternalError;
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_;
};

}  // namespace

WorkPtr NcclGroup::all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, bool async) {
  const char* kOp = "all_reduce";
  if (host_buffers(kOp)) return host().all_reduce(in, out, count, dtype, op, async);
  const Call call = begin(kOp);
  nccl_check(ncclAllReduce(in, out, count, nccl_type(dtype), nccl_op(dtype, op), comm_, stream_), kOp, "ncclAllReduce");
  return end(call, async);
}

WorkPtr NcclGroup::all_gather(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer, DType dtype,
                              bool async) {
  const char* kOp = "all_gather";
  if (host_buffers(kOp)) return host().all_gather(in, out, counts, outer, dtype, async);
  const Call call = begin(kOp);
  const size_t esize = dtype_size(dtype);
  const ncclDataType_t type = nccl_type(dtype);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const std::vector<int64_t> offsets = offsets_of(counts);
  // Several rows: every rank's rows land whole in a packed buffer (rank r's at
  // outer * offsets[r]), then go to their columns.
  std::vector<void*> temporaries;
  void* packed = outer == 1 ? out : temporaries.emplace_back(scratch(total * outer * esize));
  if (block_route(counts, outer) == BlockRoute::PerRank) {
    NcclGroupScope grouped;
    for (int r = 0; r < size_; ++r) {
      if (counts[r] == 0) continue;
      nccl_check(ncclBroadcast(in, at(packed, outer * offsets[r], esize), outer * counts[r], type, r, comm_, stream_),
                 kOp, "ncclBroadcast");
    }
    nccl_check(grouped.end(), kOp, "ncclGroupEnd");
  } else {  // equal blocks: Direct (one row) or Packed
    nccl_check(ncclAllGather(in, packed, outer * counts[0], type, comm_, stream_), kOp, "ncclAllGather");
  }
  if (outer != 1) {
    for (int r = 0; r < size_; ++r) {
      copy_rows(at(out, offsets[r], esize), total, at(packed, outer * offsets[r], esize), counts[r], counts[r], outer,
                esize, stream_);
    }
  }
  return end(call, async, temporaries);
}

WorkPtr NcclGroup::reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer,
                                  DType dtype, ReduceOp op, bool async) {
  const char* kOp = "reduce_scatter";
  if (host_buffers(kOp)) return host().reduce_scatter(in, out, counts, outer, dtype, op, async);
  const Call call = begin(kOp);
  const size_t esize = dtype_size(dtype);
  const ncclDataType_t type = nccl_type(dtype);
  const ncclRedOp_t red = nccl_op(dtype, op);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const std::vector<int64_t> offsets = offsets_of(counts);
  const BlockRoute route = block_route(counts, outer);
  std::vector<void*> temporaries;
  // Each rank's columns of every row, contiguous: what NCCL reduces for that rank.
  const void* packed = in;
  if (outer != 1) {
    void* p = temporaries.emplace_back(scratch(total * outer * esize));
    for (int r = 0; r < size_; ++r) {
      copy_rows(at(p, outer * offsets[r], esize), counts[r], at(in, offsets[r], esize), total, counts[r], outer, esize,
                stream_);
    }
    packed = p;
  }
  if (route != BlockRoute::PerRank) {
    nccl_check(ncclReduceScatter(packed, out, outer * counts[0], type, red, comm_, stream_), kOp, "ncclReduceScatter");
  } else {
    NcclGroupScope grouped;
    for (int r = 0; r < size_; ++r) {
      if (counts[r] == 0) continue;
      nccl_check(
          ncclReduce(at(packed, outer * offsets[r], esize), out, outer * counts[r], type, red, r, comm_, stream_), kOp,
          "ncclReduce");
    }
    nccl_check(grouped.end(), kOp, "ncclGroupEnd");
  }
  return end(call, async, temporaries);
}

WorkPtr NcclGroup::all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                              const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits, bool async) {
  const char* kOp = "all_to_all";
  if (host_buffers(kOp)) return host().all_to_all(in, send_counts, out, recv_counts, dtype, equal_splits, async);
  const Call call = begin(kOp);
  const size_t esize = dtype_size(dtype);
  const ncclDataType_t type = nccl_type(dtype);
  const std::vector<int64_t> send_offsets = offsets_of(send_counts), recv_offsets = offsets_of(recv_counts);
  NcclGroupScope grouped;
  for (int r = 0; r < size_; ++r) {
    if (send_counts[r] > 0) {
      nccl_check(ncclSend(at(in, send_offsets[r], esize), send_counts[r], type, r, comm_, stream_), kOp, "ncclSend");
    }
    if (recv_counts[r] > 0) {
      nccl_check(ncclRecv(at(out, recv_offsets[r], esize), recv_counts[r], type, r, comm_, stream_), kOp, "ncclRecv");
    }
  }
  nccl_check(grouped.end(), kOp, "ncclGroupEnd");
  return end(call, async);
}

void NcclGroup::all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                                  DType dtype) {
  const char* kOp = "all_to_all";
  if (host_buffers(kOp)) return host().all_to_all_blocks(in, send, out, recv, dtype);
  const Call call = begin(kOp);
  const size_t esize = dtype_size(dtype);
  const ncclDataType_t type = nccl_type(dtype);
  int64_t send_total = 0, recv_total = 0;
  for (int r = 0; r < size_; ++r) {
    send_total += send.count(r);
    recv_total += recv.count(r);
  }
  std::vector<void*> temporaries;
  void* send_packed = temporaries.emplace_back(scratch(send_total * esize));
  void* recv_packed = temporaries.emplace_back(scratch(recv_total * esize));
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    copy_rows(at(send_packed, offset, esize), send.widths[r], at(in, send.offsets[r], esize), send.stride,
              send.widths[r], send.rows, esize, stream_);
    offset += send.count(r);
  }
  NcclGroupScope grouped;
  int64_t send_offset = 0, recv_offset = 0;
  for (int r = 0; r < size_; ++r) {
    if (send.count(r) > 0) {
      nccl_check(ncclSend(at(send_packed, send_offset, esize), send.count(r), type, r, comm_, stream_), kOp,
                 "ncclSend");
    }
    if (recv.count(r) > 0) {
      nccl_check(ncclRecv(at(recv_packed, recv_offset, esize), recv.count(r), type, r, comm_, stream_), kOp,
                 "ncclRecv");
    }
    send_offset += send.count(r);
    recv_offset += recv.count(r);
  }
  nccl_check(grouped.end(), kOp, "ncclGroupEnd");
  offset = 0;
  for (int r = 0; r < size_; ++r) {
    copy_rows(at(out, recv.offsets[r], esize), recv.stride, at(recv_packed, offset, esize), recv.widths[r],
              recv.widths[r], recv.rows, esize, stream_);
    offset += recv.count(r);
  }
  end(call, false, temporaries);
}

WorkPtr NcclGroup::broadcast(void* data, int64_t count, DType dtype, int root, bool async) {
  const char* kOp = "broadcast";
  if (host_buffers(kOp)) return host().broadcast(data, count, dtype, root, async);
  const Call call = begin(kOp);
  nccl_check(ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_), kOp, "ncclBroadcast");
  return end(call, async);
}

// gather (to the root) and scatter (from it): the root exchanges a piece with every
// other rank, grouped, and copies its own.
WorkPtr NcclGroup::rooted(const char* op, const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                          int root, bool to_root, bool async) {
  const Call call = begin(op);
  const size_t esize = dtype_size(dtype);
  const ncclDataType_t type = nccl_type(dtype);
  const std::vector<int64_t> offsets = offsets_of(counts);
  NcclGroupScope grouped;
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      if (r == root || counts[r] == 0) continue;
      nccl_check(to_root ? ncclRecv(at(out, offsets[r], esize), counts[r], type, r, comm_, stream_)
                         : ncclSend(at(in, offsets[r], esize), counts[r], type, r, comm_, stream_),
                 op, to_root ? "ncclRecv" : "ncclSend");
    }
  } else if (counts[rank_] > 0) {
    nccl_check(to_root ? ncclSend(in, counts[rank_], type, root, comm_, stream_)
                       : ncclRecv(out, counts[rank_], type, root, comm_, stream_),
               op, to_root ? "ncclSend" : "ncclRecv");
  }
  nccl_check(grouped.end(), op, "ncclGroupEnd");
  if (rank_ == root && counts[root] > 0) {
    void* dst = to_root ? at(out, offsets[root], esize) : out;
    const void* src = to_root ? in : at(in, offsets[root], esize);
    backend::cuda::check(cudaMemcpyAsync(dst, src, counts[root] * esize, cudaMemcpyDeviceToDevice, stream_),
                         "cudaMemcpyAsync");
  }
  return end(call, async);
}

WorkPtr NcclGroup::gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                          bool async) {
  if (host_buffers("gather")) return host().gather(in, out, counts, dtype, root, async);
  return rooted("gather", in, out, counts, dtype, root, true, async);
}

WorkPtr NcclGroup::scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                           bool async) {
  if (host_buffers("scatter")) return host().scatter(in, out, counts, dtype, root, async);
  return rooted("scatter", in, out, counts, dtype, root, false, async);
}

WorkPtr NcclGroup::barrier(bool async) {
  const char* kOp = "barrier";
  WorkPtr work;
  {
    const Call call = begin(kOp);
    nccl_check(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_), kOp,
               "ncclAllReduce");
    work = end(call, true);
  }  // the API lock goes: the watchdog may abort while this rank waits below
  if (async) return work;
  // A barrier holds the host until every rank reached it; the watchdog's abort ends
  // the wait of a rank whose peers never come.
  while (!work->is_completed()) {
    throw_if_failed(kOp);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  work->wait();
  return nullptr;
}

WorkPtr NcclGroup::send_recv(const std::vector<P2PBuffer>& ops) {
  const char* kOp = "batch_send_recv";
  const bool any_host = std::any_of(ops.begin(), ops.end(), [](const P2PBuffer& b) { return b.device.is_cpu(); });
  const bool all_host = std::all_of(ops.begin(), ops.end(), [](const P2PBuffer& b) { return b.device.is_cpu(); });
  DT_CHECK_ARG(!any_host || all_host, kOp, "group '", name_,
               "' (nccl): a batch is all CUDA tensors or all CPU tensors, got both");
  if (all_host) return host().send_recv(ops);
  for (const P2PBuffer& b : ops) {
    DT_CHECK_ARG(b.device.index == device_, b.is_send ? "send" : "recv", "group '", name_,
                 "' (nccl) communicates on cuda:", device_, ", the tensor is on ", b.device.to_string());
  }
  // NCCL matches a pair's messages by order, not by tag: within a batch, each peer's
  // sends and receives go in tag order (then posting order), so both sides of a batch
  // pair them by tag whatever order they were listed in.
  std::vector<const P2PBuffer*> ordered;
  for (const P2PBuffer& b : ops) ordered.push_back(&b);
  std::stable_sort(ordered.begin(), ordered.end(), [](const P2PBuffer* a, const P2PBuffer* b) {
    return std::tie(a->peer, a->is_send, a->tag) < std::tie(b->peer, b->is_send, b->tag);
  });
  const Call call = begin(kOp);
  NcclGroupScope grouped;
  for (const P2PBuffer* op : ordered) {
    const P2PBuffer& b = *op;
    const int64_t count = b.bytes / static_cast<int64_t>(dtype_size(b.dtype));
    if (b.is_send) {
      nccl_check(ncclSend(b.data, count, nccl_type(b.dtype), b.peer, comm_, stream_), "send", "ncclSend");
    } else {
      nccl_check(ncclRecv(b.data, count, nccl_type(b.dtype), b.peer, comm_, stream_), "recv", "ncclRecv");
    }
  }
  nccl_check(grouped.end(), kOp, "ncclGroupEnd");
  return end(call, true);
}

}  // namespace dtensor::comm::nccl
