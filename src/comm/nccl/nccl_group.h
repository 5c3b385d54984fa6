// The NCCL backend's group (internal to src/comm/nccl): one communicator, its own
// CUDA stream, the host group it was bootstrapped over, and what the watchdog needs.
//
// Ordering, per call on CUDA buffers: the communicator's stream waits for an event
// recorded on the caller's current stream (the producers' work), the NCCL call is
// queued on the communicator's stream, and an event `done` is recorded after it. A
// synchronous call makes the caller's stream wait for `done` and returns (stream
// ordered, as CUDA ops are); an async call returns a Work whose wait() does the same,
// so nothing blocks the host and compute on the caller's stream overlaps the
// collective until the consumer waits. Buffers of a dropped Work stay alive until
// `done` has run. Calls on host memory (size exchanges, CPU tensors) go to the host
// group (threads or mpi), as PyTorch pairs gloo with nccl.
//
// Faults: communicators are non-blocking (ncclConfig_t.blocking = 0). A process-wide
// watchdog polls every group every 100 ms (skipping a group whose rank is inside an
// NCCL call: NCCL's calls on one communicator must not overlap, and the rank's own
// deadline covers that call): an asynchronous NCCL error, or a call whose `done`
// has not run within the group's timeout, aborts the communicator
// (ncclCommAbort on a helper thread; the process ends with status 124 should abort
// itself hang for 10 s), dumps the flight records, and every later call, wait or
// completion check on the group throws the reason (op, group, call number).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/call_context.h"
#include "comm/comm_backend.h"

namespace dtensor::comm::nccl {

// A CUDA event shared by a Work and the watchdog's list.
using EventPtr = std::shared_ptr<CUevent_st>;

class NcclGroup final : public GroupImpl, public std::enable_shared_from_this<NcclGroup> {
 public:
  // Takes ownership of `comm` (ready: its creation completed).
  NcclGroup(ncclComm_t comm, int device, std::shared_ptr<GroupImpl> host);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  std::vector<int> world_ranks() const override { return host_->world_ranks(); }
  bool accepts_cuda_buffers() const override { return true; }
  Device device() const override { return Device::cuda(device_); }
  int device_index() const { return device_; }

  std::shared_ptr<GroupImpl> split(int color, int key) override;

  WorkPtr all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, bool async) override;
  WorkPtr all_gather(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer, DType dtype,
                     bool async) override;
  WorkPtr reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer, DType dtype,
                         ReduceOp op, bool async) override;
  WorkPtr all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits, bool async) override;
  void all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                         DType dtype) override;
  WorkPtr broadcast(void* data, int64_t count, DType dtype, int root, bool async) override;
  WorkPtr gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                 bool async) override;
  WorkPtr scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                  bool async) override;
  WorkPtr barrier(bool async) override;
  WorkPtr send_recv(const std::vector<P2PBuffer>& ops) override;
  void injected_stall() override { host_->injected_stall(); }

  // Puts the group under the watchdog (once made; the destructor takes it off).
  void registered();
  // The watchdog's round (nccl_group.cpp): asynchronous errors and overdue calls.
  void watch();
  // Throws the reason the communicator was aborted, naming `op`.
  void throw_if_failed(const char* op) const;
  // Keeps `buffers` alive until `done` has run (a dropped Work).
  void retain_until(EventPtr done, std::shared_ptr<void> buffers);

 private:
  // One call being queued: the caller's stream and the call's number, and the lock
  // that keeps the watchdog's NCCL calls (and abort) off the communicator meanwhile.
  struct Call {
    const char* op;
    cudaStream_t caller;
    uint64_t seq;
    std::unique_lock<std::recursive_mutex> api;
  };
  // Takes the API lock, checks the group's state, and orders the communicator's
  // stream after the caller's current stream.
  Call begin(const char* op);
  // Records `done` after what was queued; sync: the caller's stream waits for it;
  // async: a Work. `scratch` (cudaMallocAsync on the group's stream) is freed after.
  WorkPtr end(const Call& call, bool async, const std::vector<void*>& scratch = {});
  // Waits out ncclInProgress (non-blocking communicator) and throws on an error.
  void nccl_check(ncclResult_t result, const char* op, const char* what);
  void* scratch(size_t bytes);
  WorkPtr rooted(const char* op, const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                 bool to_root, bool async);
  bool host_buffers(const char* op) const;  // this call's buffers are host memory
  GroupImpl& host();                        // with this group's timeout
  // With api_ held (the caller's, or taken here): frees the communicator.
  void abort(const std::string& reason);
  std::string where(uint64_t seq) const;  // "group 'x' (nccl, size n, this is rank r), call #k"

  ncclComm_t comm_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  const std::shared_ptr<GroupImpl> host_;
  int rank_ = 0, size_ = 1;
  uint64_t calls_ = 0;
  void* barrier_word_ = nullptr;  // one device int the barrier reduces

  struct Pending {
    EventPtr done;
    std::chrono::steady_clock::time_point deadline;  // max: retained buffers only
    const char* op;
    uint64_t seq;
    std::shared_ptr<void> keep;
    FlightRef flight;  // the call's flight record, completed when `done` has run
  };
  // Held around every NCCL call on comm_ (NCCL's calls on one communicator must not
  // overlap, ncclCommGetAsyncError included): the rank's calls hold it throughout,
  // the watchdog only tries it, abort() takes it.
  std::recursive_mutex api_;
  mutable std::mutex mutex_;  // pending_, error_
  std::deque<Pending> pending_;
  std::string error_;
  std::atomic<bool> failed_{false};
};

}  // namespace dtensor::comm::nccl
