// The MPI backend: one process per rank. Each method is the matching MPI call:
// blocking for sync calls (so it costs what raw MPI costs; the watchdog of
// mpi_faults.h bounds it), the non-blocking MPI_I* form for async ones. With
// DTENSOR_DEBUG=collectives every collective is preceded by a fingerprint exchange
// that names mismatched calls and missing ranks on every rank.
//
// Failures: a collective cannot be cancelled, so one that times out or fails in MPI
// (the ranks disagree: MPI_ERR_TRUNCATE on one rank, a wrong "success" on another)
// ends the job with the reason. Point-to-point waits and the fingerprint exchange
// can: past the timeout their requests are cancelled (or, where MPI cannot cancel
// them, kept alive with their buffers), the call throws, and the group refuses
// further calls, naming what failed.
//
// Internal to src/comm/mpi: MPIGroup (its construction, split and call fingerprints in
// mpi_group.cpp, its collectives in mpi_collectives.cpp, its waits, failures and
// point-to-point in mpi_requests.cpp), MPIWork and the helpers they share.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_backend.h"
#include "comm/mpi/mpi_faults.h"
#include "dtensor/error.h"

namespace dtensor::comm {

void check_mpi(int code, const char* op);
int to_int(int64_t v, const char* op);

// Counts (times `scale`) as MPI ints, and their displacements.
struct CountsAndDispls {
  std::vector<int> counts, displs;
  CountsAndDispls(const std::vector<int64_t>& v, int64_t scale, const char* op) {
    int64_t offset = 0;
    for (int64_t c : v) {
      counts.push_back(to_int(c * scale, op));
      displs.push_back(to_int(offset, op));
      offset += c * scale;
    }
  }
};

// The count slot of an all_to_all fingerprint for the strided exchange (the plain
// forms put the equal piece size there, or -1 when split sizes were given).
inline constexpr int64_t kStridedBlocks = -2;

// What a non-blocking call needs until it completes (MPI reads the count arrays
// of the v-variants during the operation).
struct Scratch {
  std::unique_ptr<CountsAndDispls> a, b;
  std::vector<std::byte> bytes;
};

class MPIGroup final : public GroupImpl, public std::enable_shared_from_this<MPIGroup> {
 public:
  MPIGroup(MPI_Comm comm, bool owned, std::string name);
  ~MPIGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  std::vector<int> world_ranks() const override { return world_ranks_; }

  std::shared_ptr<GroupImpl> split(int color, int key) override;

  WorkPtr all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, bool async) override;
  WorkPtr all_gather(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer, DType dtype,
                     bool async) override;
  WorkPtr reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer, DType dtype,
                         ReduceOp op, bool async) override;
  WorkPtr all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits, bool async) override;
  // The strided exchange without packing: one derived datatype per peer and side
  // (a vector of `rows` segments) and MPI_Alltoallw, so MPI reads and writes the
  // blocks where they lie.
  void all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                         DType dtype) override;
  WorkPtr broadcast(void* data, int64_t count, DType dtype, int root, bool async) override;
  WorkPtr gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                 bool async) override;
  WorkPtr scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                  bool async) override;
  WorkPtr barrier(bool async) override;
  WorkPtr send_recv(const std::vector<P2PBuffer>& ops) override;

  // Polls `requests` until all complete or the timeout; `describe(i)` names what
  // request i waits for. Past the timeout a collective ends the job; point-to-point
  // requests are cancelled (those MPI cannot cancel stay in `requests` for the
  // caller to abandon), the group is marked unusable, and the wait throws.
  void wait_all(std::vector<MPI_Request>& requests, const char* op, bool collective,
                const std::function<std::string(size_t)>& describe, MPI_Status* statuses = MPI_STATUSES_IGNORE) const;
  // Throws, naming what made it so, once a timed-out wait left the group unusable.
  void check_usable(const char* op) const {
    if (!broken_.empty()) {
      throw std::runtime_error(detail::concat("[", op, "] group '", name_, "' (mpi, size ", size_, ", this is rank ",
                                              rank_, ") can no longer be used: ", broken_));
    }
  }
  // An MPI error in a collective: the ranks disagree about the call (or one of them
  // is gone) and cannot all go on; ends the job with the reason.
  [[noreturn]] void collective_failed(const char* op, int code) const;

 private:
  // Runs `blocking()` (sync) or `start(&request)` (async, or sync with a timeout to
  // enforce); `after` runs once the call completed. Templates, not std::function:
  // a sync call must cost what the raw MPI call costs.
  template <class Blocking, class Start>
  WorkPtr issue(const char* op, bool async, std::shared_ptr<Scratch> scratch, std::function<void()> after,
                const Blocking& blocking, const Start& start);
  // Starts a collective: refuses an unusable group, frees completed abandoned
  // requests, numbers the call and, in the debug mode, exchanges fingerprints.
  void begin(CallKind kind, DType dtype, int64_t count, int root, ReduceOp op);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm debug_comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0, size_ = 1, splits_ = 0;
  std::vector<int> world_ranks_;  // MPI_COMM_WORLD rank of each member
  uint64_t calls_ = 0;            // collectives this rank made on the group (the watchdog names the call)
  const WatchedGroup* watched_ = nullptr;
  mutable std::string broken_;
};

// The requests of an async collective, or of a point-to-point batch, until they complete.
class MPIWork final : public WorkImpl {
 public:
  MPIWork(std::shared_ptr<const MPIGroup> group, const char* op, std::shared_ptr<Scratch> scratch,
          std::function<void()> after)
      : group_(std::move(group)), op_(op), scratch_(std::move(scratch)), after_(std::move(after)) {}
  // Requests MPI still owns (a dropped Work, a send MPI could not cancel) go to the
  // abandoned list with everything they read or write.
  ~MPIWork() override;
  MPIWork(const MPIWork&) = delete;
  MPIWork& operator=(const MPIWork&) = delete;

  std::vector<MPI_Request> requests;
  std::vector<P2PBuffer> p2p;  // the batch, for send_recv works

  void wait() override;

  void retain(std::shared_ptr<void> buffers) override { buffers_ = std::move(buffers); }

  // False while MPI still owns a request, even after a failed wait: the caller must
  // then hand over the buffers (retain) before dropping the Work.
  bool is_completed() override;

 private:
  bool owned_by_mpi() const;
  bool finish_if_done();
  void finish();
  std::string describe(size_t i) const;
  // A receive may get fewer bytes than posted; that is a mismatch like any other.
  void check_received(const std::vector<MPI_Status>& statuses) const;

  std::shared_ptr<const MPIGroup> group_;
  const char* op_;
  std::shared_ptr<Scratch> scratch_;
  std::function<void()> after_;
  bool done_ = false;
  std::exception_ptr error_;
  std::shared_ptr<void> buffers_;
};

}  // namespace dtensor::comm
