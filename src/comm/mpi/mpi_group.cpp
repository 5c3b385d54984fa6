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
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string_view>
#include <thread>

#include "comm/fault_injection.h"
#include "comm/mpi/mpi_backend.h"
#include "comm/mpi/mpi_faults.h"
#include "comm/mpi/mpi_types.h"
#include "comm/reduce.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm {
namespace {

using Clock = std::chrono::steady_clock;

bool debug_collectives() {
  static const bool on = [] {
    const char* env = std::getenv("DTENSOR_DEBUG");
    return env && std::string_view(env).find("collectives") != std::string_view::npos;
  }();
  return on;
}

void check_mpi(int code, const char* op) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(detail::concat("[", op, "] MPI error: ", std::string(text, length)));
}

int to_int(int64_t v, const char* op) {
  DT_CHECK_SUPPORTED(v <= INT_MAX, op, "the mpi backend moves at most ", INT_MAX,
                     " elements per rank and call, got ", v);
  return static_cast<int>(v);
}

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
constexpr int64_t kStridedBlocks = -2;

bool all_equal(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t c) { return c == v[0]; });
}

// What a non-blocking call needs until it completes (MPI reads the count arrays
// of the v-variants during the operation).
struct Scratch {
  std::unique_ptr<CountsAndDispls> a, b;
  std::vector<std::byte> bytes;
};

}  // namespace

class MPIGroup final : public GroupImpl, public std::enable_shared_from_this<MPIGroup> {
 public:
  MPIGroup(MPI_Comm comm, bool owned, std::string name) : comm_(comm), owned_(owned) {
    name_ = std::move(name);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as codes: exceptions for point to point, a job abort naming
    // the call for collectives (instead of MPI's bare abort).
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    if (debug_collectives()) MPI_Comm_dup(comm_, &debug_comm_);
    watched_ = watched_group(name_, rank_, size_);
  }
  ~MPIGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (debug_comm_ != MPI_COMM_NULL) MPI_Comm_free(&debug_comm_);
    if (owned_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::shared_ptr<GroupImpl> split(int color, int key) override {
    begin(CallKind::Split, DType::F32, 0, 0, ReduceOp::Sum);
    MPI_Comm child = MPI_COMM_NULL;
    int code = MPI_SUCCESS;
    {
      Watch watch(watched_, "split", calls_, timeout_);
      code = MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child);
    }
    if (code != MPI_SUCCESS) collective_failed("split", code);
    const int index = splits_++;
    if (child == MPI_COMM_NULL) return nullptr;
    std::string child_name = detail::concat(name_, "/c", color);
    if (index > 0) child_name += detail::concat(".", index);
    auto group = std::make_shared<MPIGroup>(child, true, std::move(child_name));
    group->set_timeout(timeout_);
    return group;
  }

  WorkPtr all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                     bool async) override {
    begin(CallKind::AllReduce, dtype, count, 0, op);
    const int c = to_int(count, "all_reduce");
    const MPI_Datatype type = mpi_datatype(dtype);
    const MPI_Op mop = mpi_op(dtype, op);
    // Async calls always reduce in place (out first gets a copy of in): Open MPI 4.1's
    // MPI_Iallreduce picks its algorithm by whether a call is in place, so ranks that
    // differ in that (legal MPI) exchange mismatched pieces (MPI_ERR_TRUNCATE).
    if (async && in != out && count > 0) std::memcpy(out, in, static_cast<size_t>(count) * dtype_size(dtype));
    const void* send = in == out || async ? MPI_IN_PLACE : in;
    MPI_Comm comm = comm_;
    std::function<void()> after;
    if (op == ReduceOp::Avg) after = [=, n = size_] { divide_by(dtype, out, count, n); };
    return issue("all_reduce", async, nullptr, after,
                 [=] { return MPI_Allreduce(send, out, c, type, mop, comm); },
                 [=](MPI_Request* r) { return MPI_Iallreduce(send, out, c, type, mop, comm, r); });
  }

  WorkPtr all_gather(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer,
                     DType dtype, bool async) override {
    const char* op = "all_gather";
    const size_t esize = dtype_size(dtype);
    const MPI_Datatype type = mpi_datatype(dtype);
    MPI_Comm comm = comm_;
    if (outer == 1 && all_equal(counts)) {
      // The common case needs no count arrays and no scratch.
      begin(CallKind::AllGather, dtype, counts[0] * size_, 0, ReduceOp::Sum);
      const int mine = to_int(counts[0], op);
      const void* send = in == static_cast<const std::byte*>(out) + rank_ * counts[0] * esize ? MPI_IN_PLACE : in;
      return issue(op, async, nullptr, nullptr,
                   [=] { return MPI_Allgather(send, mine, type, out, mine, type, comm); },
                   [=](MPI_Request* r) { return MPI_Iallgather(send, mine, type, out, mine, type, comm, r); });
    }
    auto s = std::make_shared<Scratch>();
    s->a = std::make_unique<CountsAndDispls>(counts, outer, op);
    const int64_t total = s->a->displs.back() + s->a->counts.back();
    begin(CallKind::AllGather, dtype, total, 0, ReduceOp::Sum);
    const CountsAndDispls& cd = *s->a;
    void* recv = out;
    std::function<void()> after;
    if (outer > 1) {
      // MPI gathers rank-major; rows of the concatenated tensor interleave ranks.
      s->bytes.resize(total * esize);
      recv = s->bytes.data();
      after = [=, n = size_] {
        const int64_t row = total / outer;
        int64_t column = 0;
        for (int r = 0; r < n; ++r) {
          const int64_t width = counts[r] * esize;
          for (int64_t o = 0; o < outer; ++o) {
            std::memcpy(static_cast<std::byte*>(out) + (o * row * esize + column),
                        s->bytes.data() + cd.displs[r] * esize + o * width, width);
          }
          column += width;
        }
      };
    }
    const bool in_place =
        outer == 1 && in == static_cast<const std::byte*>(out) + cd.displs[rank_] * esize;
    const void* send = in_place ? MPI_IN_PLACE : in;
    const int mine = cd.counts[rank_];
    if (all_equal(counts)) {  // scaled by `outer`, still equal
      return issue(op, async, s, after,
                   [=] { return MPI_Allgather(send, mine, type, recv, mine, type, comm); },
                   [=](MPI_Request* r) {
                     return MPI_Iallgather(send, mine, type, recv, mine, type, comm, r);
                   });
    }
    return issue(op, async, s, after,
                 [=, &cd] {
                   return MPI_Allgatherv(send, mine, type, recv, cd.counts.data(), cd.displs.data(),
                                         type, comm);
                 },
                 [=, &cd](MPI_Request* r) {
                   return MPI_Iallgatherv(send, mine, type, recv, cd.counts.data(),
                                          cd.displs.data(), type, comm, r);
                 });
  }

  WorkPtr reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts,
                         int64_t outer, DType dtype, ReduceOp op, bool async) override {
    const char* name = "reduce_scatter";
    const MPI_Datatype type = mpi_datatype(dtype);
    const MPI_Op mop = mpi_op(dtype, op);
    MPI_Comm comm = comm_;
    std::function<void()> after;
    if (outer == 1 && all_equal(counts)) {
      begin(CallKind::ReduceScatter, dtype, counts[0] * size_, 0, op);
      const int c = to_int(counts[0], name);
      if (op == ReduceOp::Avg) after = [=, n = size_] { divide_by(dtype, out, c, n); };
      return issue(name, async, nullptr, std::move(after),
                   [=] { return MPI_Reduce_scatter_block(in, out, c, type, mop, comm); },
                   [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(in, out, c, type, mop, comm, r); });
    }
    auto s = std::make_shared<Scratch>();
    s->a = std::make_unique<CountsAndDispls>(counts, outer, name);
    const CountsAndDispls& cd = *s->a;
    const int64_t total = cd.displs.back() + cd.counts.back();
    begin(CallKind::ReduceScatter, dtype, total, 0, op);
    const size_t esize = dtype_size(dtype);
    const void* send = in;
    if (outer > 1) {
      // Rank-major packing: rank r's block of every row, one after the other.
      s->bytes.resize(total * esize);
      const int64_t row = total / outer;
      int64_t column = 0;
      for (int r = 0; r < size_; ++r) {
        const int64_t width = counts[r] * esize;
        for (int64_t o = 0; o < outer; ++o) {
          std::memcpy(s->bytes.data() + cd.displs[r] * esize + o * width,
                      static_cast<const std::byte*>(in) + (o * row * esize + column), width);
        }
        column += width;
      }
      send = s->bytes.data();
    }
    const int64_t mine = cd.counts[rank_];
    if (op == ReduceOp::Avg) after = [=, n = size_] { divide_by(dtype, out, mine, n); };
    if (all_equal(counts)) {  // scaled by `outer`, still equal
      const int c = cd.counts[0];
      return issue(name, async, s, after,
                   [=] { return MPI_Reduce_scatter_block(send, out, c, type, mop, comm); },
                   [=](MPI_Request* r) {
                     return MPI_Ireduce_scatter_block(send, out, c, type, mop, comm, r);
                   });
    }
    return issue(name, async, s, after,
                 [=, &cd] { return MPI_Reduce_scatter(send, out, cd.counts.data(), type, mop, comm); },
                 [=, &cd](MPI_Request* r) {
                   return MPI_Ireduce_scatter(send, out, cd.counts.data(), type, mop, comm, r);
                 });
  }

  WorkPtr all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits,
                     bool async) override {
    const char* op = "all_to_all";
    // The count slot of the fingerprint: the elements each rank sends each peer with
    // equal splits (the same everywhere), -1 when split sizes were given. All ranks
    // must call the same MPI routine.
    begin(CallKind::AllToAll, dtype, equal_splits ? send_counts[0] : -1, 0, ReduceOp::Sum);
    const MPI_Datatype type = mpi_datatype(dtype);
    MPI_Comm comm = comm_;
    if (equal_splits) {
      const int send = to_int(send_counts[0], op), recv = to_int(recv_counts[0], op);
      return issue(op, async, nullptr, nullptr,
                   [=] { return MPI_Alltoall(in, send, type, out, recv, type, comm); },
                   [=](MPI_Request* r) { return MPI_Ialltoall(in, send, type, out, recv, type, comm, r); });
    }
    auto s = std::make_shared<Scratch>();
    s->a = std::make_unique<CountsAndDispls>(send_counts, 1, op);
    s->b = std::make_unique<CountsAndDispls>(recv_counts, 1, op);
    const CountsAndDispls& sd = *s->a;
    const CountsAndDispls& rd = *s->b;
    // Split sizes given: the v-form, even if this rank's happen to be equal (another
    // rank's may not be, and all ranks must call the same MPI routine).
    return issue(op, async, s, nullptr,
                 [=, &sd, &rd] {
                   return MPI_Alltoallv(in, sd.counts.data(), sd.displs.data(), type, out,
                                        rd.counts.data(), rd.displs.data(), type, comm);
                 },
                 [=, &sd, &rd](MPI_Request* r) {
                   return MPI_Ialltoallv(in, sd.counts.data(), sd.displs.data(), type, out,
                                         rd.counts.data(), rd.displs.data(), type, comm, r);
                 });
  }

  // The strided exchange without packing: one derived datatype per peer and side
  // (a vector of `rows` segments) and MPI_Alltoallw, so MPI reads and writes the
  // blocks where they lie.
  void all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                         DType dtype) override {
    const char* op = "all_to_all";
    begin(CallKind::AllToAll, dtype, kStridedBlocks, 0, ReduceOp::Sum);
    const MPI_Datatype base = mpi_datatype(dtype);
    const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
    struct Types {  // freed however the call ends
      std::vector<MPI_Datatype> all;
      ~Types() {
        for (MPI_Datatype& t : all) MPI_Type_free(&t);
      }
    } types;
    std::vector<MPI_Datatype> send_types(size_), recv_types(size_);
    // The piece's byte offset goes into its type (MPI_Aint), not into Alltoallw's int
    // displacements, which would cap buffers at 2 GiB.
    std::vector<int> ones(size_, 1), send_displs(size_, 0), recv_displs(size_, 0);
    auto describe = [&](const BlockLayout& layout, int s, MPI_Datatype* type) {
      const int width = to_int(layout.widths[s], op);
      MPI_Datatype segments = MPI_DATATYPE_NULL;
      if (layout.rows <= 1) {
        check_mpi(MPI_Type_contiguous(layout.rows * width, base, &segments), op);
      } else {
        check_mpi(MPI_Type_vector(to_int(layout.rows, op), width, to_int(layout.stride, op), base, &segments), op);
      }
      types.all.push_back(segments);
      const MPI_Aint offset = static_cast<MPI_Aint>(layout.offsets[s] * esize);
      check_mpi(MPI_Type_create_hindexed_block(1, 1, &offset, segments, type), op);
      types.all.push_back(*type);
      check_mpi(MPI_Type_commit(type), op);
    };
    for (int s = 0; s < size_; ++s) {
      describe(send, s, &send_types[s]);
      describe(recv, s, &recv_types[s]);
    }
    MPI_Comm comm = comm_;
    issue(op, false, nullptr, nullptr,
          [&] {
            return MPI_Alltoallw(in, ones.data(), send_displs.data(), send_types.data(), out, ones.data(),
                                 recv_displs.data(), recv_types.data(), comm);
          },
          [&](MPI_Request* r) {
            return MPI_Ialltoallw(in, ones.data(), send_displs.data(), send_types.data(), out, ones.data(),
                                  recv_displs.data(), recv_types.data(), comm, r);
          });
  }

  WorkPtr broadcast(void* data, int64_t count, DType dtype, int root, bool async) override {
    begin(CallKind::Broadcast, dtype, count, root, ReduceOp::Sum);
    const int c = to_int(count, "broadcast");
    const MPI_Datatype type = mpi_datatype(dtype);
    MPI_Comm comm = comm_;
    return issue("broadcast", async, nullptr, nullptr,
                 [=] { return MPI_Bcast(data, c, type, root, comm); },
                 [=](MPI_Request* r) { return MPI_Ibcast(data, c, type, root, comm, r); });
  }

  WorkPtr gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                 int root, bool async) override {
    auto s = std::make_shared<Scratch>();
    s->a = std::make_unique<CountsAndDispls>(counts, 1, "gather");
    const CountsAndDispls& cd = *s->a;
    begin(CallKind::Gather, dtype, cd.displs.back() + cd.counts.back(), root, ReduceOp::Sum);
    const int mine = cd.counts[rank_];
    const MPI_Datatype type = mpi_datatype(dtype);
    MPI_Comm comm = comm_;
    return issue("gather", async, s, nullptr,
                 [=, &cd] {
                   return MPI_Gatherv(in, mine, type, out, cd.counts.data(), cd.displs.data(), type,
                                      root, comm);
                 },
                 [=, &cd](MPI_Request* r) {
                   return MPI_Igatherv(in, mine, type, out, cd.counts.data(), cd.displs.data(),
                                       type, root, comm, r);
                 });
  }

  WorkPtr scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                  int root, bool async) override {
    auto s = std::make_shared<Scratch>();
    s->a = std::make_unique<CountsAndDispls>(counts, 1, "scatter");
    const CountsAndDispls& cd = *s->a;
    begin(CallKind::Scatter, dtype, cd.displs.back() + cd.counts.back(), root, ReduceOp::Sum);
    const int mine = cd.counts[rank_];
    const MPI_Datatype type = mpi_datatype(dtype);
    MPI_Comm comm = comm_;
    return issue("scatter", async, s, nullptr,
                 [=, &cd] {
                   return MPI_Scatterv(in, cd.counts.data(), cd.displs.data(), type, out, mine,
                                       type, root, comm);
                 },
                 [=, &cd](MPI_Request* r) {
                   return MPI_Iscatterv(in, cd.counts.data(), cd.displs.data(), type, out, mine,
                                        type, root, comm, r);
                 });
  }

  WorkPtr barrier(bool async) override {
    begin(CallKind::Barrier, DType::F32, 0, 0, ReduceOp::Sum);
    MPI_Comm comm = comm_;
    return issue("barrier", async, nullptr, nullptr, [=] { return MPI_Barrier(comm); },
                 [=](MPI_Request* r) { return MPI_Ibarrier(comm, r); });
  }

  WorkPtr send_recv(const std::vector<P2PBuffer>& ops) override;

  // Polls `requests` until all complete or the timeout; `describe(i)` names what
  // request i waits for. Past the timeout a collective ends the job; point-to-point
  // requests are cancelled (those MPI cannot cancel stay in `requests` for the
  // caller to abandon), the group is marked unusable, and the wait throws.
  void wait_all(std::vector<MPI_Request>& requests, const char* op, bool collective,
                const std::function<std::string(size_t)>& describe,
                MPI_Status* statuses = MPI_STATUSES_IGNORE) const;
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
  WorkPtr issue(const char* op, bool async, std::shared_ptr<Scratch> scratch,
                std::function<void()> after, const Blocking& blocking, const Start& start);
  // Starts a collective: refuses an unusable group, frees completed abandoned
  // requests, numbers the call and, in the debug mode, exchanges fingerprints.
  void begin(CallKind kind, DType dtype, int64_t count, int root, ReduceOp op);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm debug_comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0, size_ = 1, splits_ = 0;
  uint64_t calls_ = 0;  // collectives this rank made on the group (the watchdog names the call)
  const WatchedGroup* watched_ = nullptr;
  mutable std::string broken_;
};

namespace {

class MPIWork final : public WorkImpl {
 public:
  MPIWork(std::shared_ptr<const MPIGroup> group, const char* op, std::shared_ptr<Scratch> scratch,
          std::function<void()> after)
      : group_(std::move(group)), op_(op), scratch_(std::move(scratch)), after_(std::move(after)) {}
  // Requests MPI still owns (a dropped Work, a send MPI could not cancel) go to the
  // abandoned list with everything they read or write.
  ~MPIWork() override {
    if (!owned_by_mpi()) return;
    struct Kept {
      std::shared_ptr<Scratch> scratch;
      std::shared_ptr<void> buffers;
    };
    abandon(std::move(requests), std::make_shared<Kept>(Kept{std::move(scratch_), std::move(buffers_)}), !p2p.empty());
  }
  MPIWork(const MPIWork&) = delete;
  MPIWork& operator=(const MPIWork&) = delete;

  std::vector<MPI_Request> requests;
  std::vector<P2PBuffer> p2p;  // the batch, for send_recv works

  void wait() override {
    if (!done_) {
      try {
        std::vector<MPI_Status> statuses(requests.size());
        group_->wait_all(requests, op_, p2p.empty(), [&](size_t i) { return describe(i); }, statuses.data());
        check_received(statuses);
        finish();
      } catch (...) {
        error_ = std::current_exception();
        done_ = true;
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

  void retain(std::shared_ptr<void> buffers) override { buffers_ = std::move(buffers); }

  // False while MPI still owns a request, even after a failed wait: the caller must
  // then hand over the buffers (retain) before dropping the Work.
  bool is_completed() override {
    if (!owned_by_mpi()) return done_ || requests.empty() || finish_if_done();
    int flag = 0;
    std::vector<MPI_Status> statuses(requests.size());
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, statuses.data());
    if (flag == 0) return false;
    // The requests are freed now: a later wait() would see empty statuses, so the
    // received sizes are checked here (wait() rethrows a mismatch).
    if (!done_ && !p2p.empty()) {
      try {
        check_received(statuses);
        finish();
      } catch (...) {
        error_ = std::current_exception();
        done_ = true;
      }
      return true;
    }
    return finish_if_done();
  }

 private:
  bool owned_by_mpi() const {
    return std::any_of(requests.begin(), requests.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  }
  bool finish_if_done() {
    if (!done_ && p2p.empty()) finish();  // results must be final once this says so
    return true;
  }
  void finish() {
    if (after_) after_();
    scratch_.reset();
    done_ = true;
  }
  std::string describe(size_t i) const {
    if (i >= p2p.size()) return "";
    const P2PBuffer& b = p2p[i];
    return detail::concat(b.is_send ? "rank " : "no send from rank ", b.peer,
                          b.is_send ? " did not receive " : " for ", b.bytes, " bytes with tag ",
                          b.tag, "; ");
  }
  // A receive may get fewer bytes than posted; that is a mismatch like any other.
  void check_received(const std::vector<MPI_Status>& statuses) const {
    for (size_t i = 0; i < p2p.size(); ++i) {
      if (p2p[i].is_send) continue;
      int count = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &count);
      DT_CHECK_ARG(count == p2p[i].bytes, "recv", "rank ", p2p[i].peer, " sent ", count,
                   " bytes with tag ", p2p[i].tag, ", this rank posted a recv of ", p2p[i].bytes);
    }
  }

  std::shared_ptr<const MPIGroup> group_;
  const char* op_;
  std::shared_ptr<Scratch> scratch_;
  std::function<void()> after_;
  bool done_ = false;
  std::exception_ptr error_;
  std::shared_ptr<void> buffers_;
};

std::string describe_fingerprint(const int64_t* f) {
  if (static_cast<CallKind>(f[0]) == CallKind::AllToAll) {
    if (f[2] == kStridedBlocks) return detail::concat("all_to_all(", dtype_name(static_cast<DType>(f[1])), ", strided blocks)");
    if (f[2] < 0) return detail::concat("all_to_all(", dtype_name(static_cast<DType>(f[1])), ", split sizes given)");
    return detail::concat("all_to_all(", dtype_name(static_cast<DType>(f[1])), ", no split sizes, ", f[2],
                          " elements to each rank)");
  }
  return detail::concat(call_kind_name(static_cast<CallKind>(f[0])), "(",
                        dtype_name(static_cast<DType>(f[1])), ", ", f[2], " elements, root ", f[3],
                        ", ", reduce_op_name(static_cast<ReduceOp>(f[4])), ")");
}

}  // namespace

void MPIGroup::collective_failed(const char* op, int code) const {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  abort_job(detail::concat("[", op, "] MPI error in group '", name_, "' (mpi, size ", size_, ", this is rank ", rank_,
                           "), call ", calls_, ": ", std::string(text, length),
                           ". The ranks' calls disagree (sizes, dtypes or ops; DTENSOR_DEBUG=collectives names "
                           "both calls) or a rank is gone, so other ranks may hold wrong results; aborting the job"),
            1);
}

void MPIGroup::wait_all(std::vector<MPI_Request>& requests, const char* op, bool collective,
                        const std::function<std::string(size_t)>& describe, MPI_Status* statuses) const {
  const auto deadline = this->deadline();
  for (int polls = 0;; ++polls) {
    int flag = 0;
    const int code = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, statuses);
    if (code != MPI_SUCCESS && collective) collective_failed(op, code);
    if (code == MPI_ERR_IN_STATUS && statuses != MPI_STATUSES_IGNORE) {
      for (size_t i = 0; i < requests.size(); ++i) {
        DT_CHECK_ARG(statuses[i].MPI_ERROR != MPI_ERR_TRUNCATE, op, "message truncated: ",
                     describe(i), "the send is larger than the posted recv");
        check_mpi(statuses[i].MPI_ERROR, op);
      }
    }
    check_mpi(code, op);
    if (flag) return;
    if (Clock::now() > deadline) {
      std::string missing;
      for (size_t i = 0; i < requests.size(); ++i) {
        if (requests[i] != MPI_REQUEST_NULL) missing += describe(i);
      }
      const std::string what =
          detail::concat("[", op, "] timed out after ", timeout_.count() / 1000.0, " s in group '", name_, "' (mpi, size ",
                         size_, ", this is rank ", rank_, "), call ", calls_, ": ",
                         missing.empty() ? std::string("some rank of the group has not made this call "
                                                       "(DTENSOR_DEBUG=collectives names which)")
                                         : missing);
      if (collective) abort_job(what + "; aborting the job", kTimeoutExitCode);
      // Point to point: cancel what is still posted. A request MPI cannot cancel (a
      // send already on its way) stays in `requests` for the caller to abandon.
      for (MPI_Request& r : requests) {
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      }
      const auto grace = Clock::now() + std::chrono::milliseconds(50);
      int settled = 0;
      while (!settled && Clock::now() < grace) {
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &settled, MPI_STATUSES_IGNORE);
      }
      broken_ = what;
      throw std::runtime_error(what);
    }
    // Oversubscribed ranks (more processes than cores) need the core back.
    if (polls > 1000) std::this_thread::yield();
  }
}

template <class Blocking, class Start>
WorkPtr MPIGroup::issue(const char* op, bool async, std::shared_ptr<Scratch> scratch,
                        std::function<void()> after, const Blocking& blocking, const Start& start) {
  if (!async) {
    int code = MPI_SUCCESS;
    {
      Watch watch(watched_, op, calls_, timeout_);
      code = blocking();
    }
    if (code != MPI_SUCCESS) collective_failed(op, code);
    if (after) after();
    return nullptr;
  }
  auto work = std::make_shared<MPIWork>(shared_from_this(), op, std::move(scratch), std::move(after));
  work->requests.resize(1);
  if (const int code = start(&work->requests[0]); code != MPI_SUCCESS) collective_failed(op, code);
  return work;
}

void MPIGroup::begin(CallKind kind, DType dtype, int64_t count, int root, ReduceOp op) {
  const char* name = call_kind_name(kind);
  check_usable(name);
  reap_abandoned();
  ++calls_;
  if (debug_comm_ == MPI_COMM_NULL || size_ == 1) return;
  // Heap-held: if a peer never comes, the requests may outlive this call (abandoned).
  struct Fingerprints {
    int64_t mine[5];
    std::vector<int64_t> theirs;
  };
  auto f = std::make_shared<Fingerprints>(Fingerprints{{static_cast<int64_t>(kind), static_cast<int64_t>(dtype),
                                                        count, root, static_cast<int64_t>(op)},
                                                       std::vector<int64_t>(5 * static_cast<size_t>(size_))});
  std::vector<MPI_Request> requests;
  std::vector<int> peers;  // >= 0: a receive from that rank; -1: a send
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    requests.emplace_back();
    MPI_Irecv(&f->theirs[5 * p], 5, MPI_INT64_T, p, 0, debug_comm_, &requests.back());
    peers.push_back(p);
    requests.emplace_back();
    MPI_Isend(f->mine, 5, MPI_INT64_T, p, 0, debug_comm_, &requests.back());
    peers.push_back(-1);
  }
  try {
    wait_all(requests, name, false, [&](size_t i) {
      return peers[i] >= 0 ? detail::concat("rank ", peers[i], " did not arrive; ") : std::string();
    });
  } catch (...) {
    abandon(std::move(requests), f, true);
    throw;
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || std::equal(f->mine, f->mine + 5, &f->theirs[5 * p])) continue;
    throw std::invalid_argument(detail::concat(
        "[", name, "] ranks made different calls in group '", name_, "': rank ", rank_, " called ",
        describe_fingerprint(f->mine), ", rank ", p, " called ", describe_fingerprint(&f->theirs[5 * p])));
  }
}

WorkPtr MPIGroup::send_recv(const std::vector<P2PBuffer>& ops) {
  const char* name = ops.size() != 1 ? "batch_send_recv" : (ops[0].is_send ? "send" : "recv");
  check_usable(name);
  reap_abandoned();
  auto work = std::make_shared<MPIWork>(shared_from_this(), name, nullptr, nullptr);
  work->p2p = ops;
  work->requests.resize(ops.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2PBuffer& b = ops[i];
    const char* op = b.is_send ? "send" : "recv";
    DT_CHECK_ARG(b.tag >= 0, op, "tags must be >= 0, got ", b.tag);
    const int count = to_int(b.bytes / static_cast<int64_t>(dtype_size(b.dtype)), op);
    const MPI_Datatype type = mpi_datatype(b.dtype);
    check_mpi(b.is_send ? MPI_Isend(b.data, count, type, b.peer, b.tag, comm_, &work->requests[i])
                        : MPI_Irecv(b.data, count, type, b.peer, b.tag, comm_, &work->requests[i]),
              op);
  }
  return work;
}

// ---- entry points ------------------------------------------------------------------------

bool mpi_compiled() { return true; }

bool started_by_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(var)) return true;
  }
  return false;
}

std::shared_ptr<GroupImpl> mpi_world() {
  static const std::shared_ptr<MPIGroup> world = [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
    }
    // The exit handler is registered before `world` is constructed, so it runs after
    // world's destructor; it finalises MPI only when dtensor initialised it.
    install_process_handlers(!initialized);
    auto group = std::make_shared<MPIGroup>(MPI_COMM_WORLD, false, "world");
    arm_process_faults(fault_spec_from_env(), group->rank());
    return group;
  }();
  return world;
}

}  // namespace dtensor::comm
