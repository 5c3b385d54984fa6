// The interface a communication backend implements (threads, mpi, later nccl).
// Users never include this header: group.h is the API. The public functions in
// src/comm/collectives.cpp check tensors, make them contiguous, allocate outputs,
// count calls (comm_debug.h) and then call one method below on raw buffers.
//
// Buffer conventions of every method:
// - Buffers are contiguous host memory, or device memory of a backend that
//   accepts_cuda_buffers() (the collectives learn it from the BufferDeviceScope,
//   send_recv from P2PBuffer::device); counts are in elements of `dtype`.
// - "Row blocks" (all_gather, reduce_scatter): a tensor concatenated along dim d is
//   seen as `outer` rows (the product of the dims before d); rank r owns
//   counts[r] consecutive elements of every row, at column offset
//   counts[0] + ... + counts[r-1] of a row of sum(counts) elements.
// - A method with async == false completes before returning and returns nullptr;
//   with async == true it may return a WorkImpl still running. Inputs and outputs
//   must stay alive until then (the caller keeps the tensors in its Work).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/device.h"
#include "dtensor/dtype.h"
#include "dtensor/group.h"

namespace dtensor::comm {

class FlightRecorder;

class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual void wait() = 0;  // rethrows the operation's error
  virtual bool is_completed() = 0;
  // The user dropped the Work before it completed: the operation still runs (peers
  // expect it), and `buffers` (its tensors) must stay alive until it has.
  virtual void retain(std::shared_ptr<void> buffers) = 0;
};
using WorkPtr = std::shared_ptr<WorkImpl>;

// One send or receive of a batch on raw memory.
struct P2PBuffer {
  bool is_send = true;
  void* data = nullptr;
  int64_t bytes = 0;
  DType dtype = DType::F32;
  int peer = 0;
  int tag = 0;
  Device device = Device::cpu();  // where `data` lies
};

// Where one rank's all_to_all pieces lie in its buffer: the piece for (or from)
// peer s is `rows` segments of widths[s] elements, segment i starting at element
// offsets[s] + i * stride. On the wire a piece is its segments in order, so the
// sender's and the receiver's layouts may cut the same element stream differently
// (a column block of a [rows, stride] matrix on one side, consecutive rows on the
// other).
struct BlockLayout {
  int64_t rows = 1;
  int64_t stride = 0;
  std::vector<int64_t> offsets, widths;
  int64_t count(int s) const { return rows * widths[s]; }
};

// 10 minutes unless DTENSOR_TIMEOUT_S says otherwise (read once per process).
std::chrono::milliseconds default_timeout();
// Timeouts are 1 ms to one year: far beyond any real wait and far from the clock's
// range, so no deadline computation can overflow.
inline constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 365);
// DTENSOR_TIMEOUT_S's text as a timeout; std::invalid_argument for anything but a
// number of seconds in [0.001, 31536000] ("inf", "nan", "0", "-1", "1e300", "5s").
std::chrono::milliseconds parse_timeout_seconds(const char* text);

class GroupImpl {
 public:
  virtual ~GroupImpl() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  const std::string& name() const { return name_; }
  // A DeviceMesh names its dim groups after the dims ("dp", "tp"), which error messages
  // and CommDebugMode then show.
  void set_name(std::string name) { name_ = std::move(name); }
  // The launch (threads) or MPI_COMM_WORLD rank of each member, in group order; empty
  // where the backend cannot say. The flight recorder's dumps name groups by them.
  virtual std::vector<int> world_ranks() const { return {}; }
  // Why the ranks of this group can no longer all communicate ("rank 2 failed: ..."),
  // or "": a backend that learns of failures out of band says so (threads: a launch
  // rank failed). The nccl backend's watchdog asks its host group.
  virtual std::string failure() const { return {}; }
  // The recorder of the rank this group belongs to (flight_recorder.h); null: none.
  const std::shared_ptr<FlightRecorder>& flight_recorder() const { return flight_recorder_; }
  void set_flight_recorder(std::shared_ptr<FlightRecorder> recorder) {
    flight_recorder_ = std::move(recorder);
    flight_group_ = -1;  // registered anew in this recorder at the next call
  }
  // Whether the collectives take buffers in CUDA device memory (the public calls
  // then name the device in a BufferDeviceScope, src/comm/call_context.h).
  virtual bool accepts_cuda_buffers() const { return false; }
  // The device this rank communicates on (Group::device): the CPU, but for nccl.
  virtual Device device() const { return Device::cpu(); }

  // Collective; nullptr for a negative color.
  virtual std::shared_ptr<GroupImpl> split(int color, int key) = 0;

  virtual WorkPtr all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, bool async) = 0;
  virtual WorkPtr all_gather(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer, DType dtype,
                             bool async) = 0;
  virtual WorkPtr reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer,
                                 DType dtype, ReduceOp op, bool async) = 0;
  // send_counts[s] elements go to rank s, recv_counts[s] come from it, packed in
  // rank order in `in` and `out`. `equal_splits`: every rank of the call has all
  // counts equal and says so (the same on all ranks), so a backend may use its
  // equal-split routine (MPI_Alltoall instead of MPI_Alltoallv).
  virtual WorkPtr all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                             const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits, bool async) = 0;
  // all_to_all between strided pieces, synchronous. This default packs the pieces
  // into contiguous buffers around all_to_all(); a backend that can address its
  // peers' memory overrides it to copy between the blocks in place.
  virtual void all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                                 DType dtype);
  virtual WorkPtr broadcast(void* data, int64_t count, DType dtype, int root, bool async) = 0;
  // counts[r] elements from rank r, packed in rank order in root's `out`.
  virtual WorkPtr gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                         bool async) = 0;
  virtual WorkPtr scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                          bool async) = 0;
  virtual WorkPtr barrier(bool async) = 0;
  // Always non-blocking; the returned work covers every buffer of the batch.
  virtual WorkPtr send_recv(const std::vector<P2PBuffer>& ops) = 0;

  // Fault injection (DTENSOR_FAULT kind:stall): blocks this rank the way a hung one
  // would, for as long as the backend needs to release it. This default sleeps until
  // the process ends (under mpirun the peers' watchdog aborts the job).
  virtual void injected_stall();

  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Now plus the timeout (saturating at the clock's end).
  std::chrono::steady_clock::time_point deadline() const {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point now = Clock::now();
    const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
    return timeout_ >= room ? Clock::time_point::max() : now + timeout_;
  }

 protected:
  std::string name_ = "world";
  std::chrono::milliseconds timeout_ = default_timeout();

 private:
  friend class FlightRecorder;
  std::shared_ptr<FlightRecorder> flight_recorder_;
  int flight_group_ = -1;  // this group's index in the recorder, once it recorded a call
};

// The names of one collective's kinds, used by error messages and comm counters.
enum class CallKind : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Gather,
  Scatter,
  Barrier,
  Send,
  Recv,
  Split
};
const char* call_kind_name(CallKind kind);  // "all_reduce", ...

}  // namespace dtensor::comm
