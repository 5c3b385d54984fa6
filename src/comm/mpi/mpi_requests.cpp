// Requests in flight on the MPI backend: MPIWork, waiting for requests under the
// group's timeout (a collective that fails or times out ends the job), and the
// point-to-point batches of send_recv.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/mpi/mpi_group.h"
#include "comm/mpi/mpi_types.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// ---- MPIWork -----------------------------------------------------------------------------

MPIWork::~MPIWork() {
  if (!owned_by_mpi()) return;
  struct Kept {
    std::shared_ptr<Scratch> scratch;
    std::shared_ptr<void> buffers;
  };
  abandon(std::move(requests), std::make_shared<Kept>(Kept{std::move(scratch_), std::move(buffers_)}), !p2p.empty());
}

void MPIWork::wait() {
  if (!done_) {
    try {
      std::vector<MPI_Status> statuses(requests.size());
      group_->wait_all(
          requests, op_, p2p.empty(), [&](size_t i) { return describe(i); }, statuses.data());
      check_received(statuses);
      finish();
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }
  if (error_) std::rethrow_exception(error_);
}

bool MPIWork::is_completed() {
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

bool MPIWork::owned_by_mpi() const {
  return std::any_of(requests.begin(), requests.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
}

bool MPIWork::finish_if_done() {
  if (!done_ && p2p.empty()) finish();  // results must be final once this says so
  return true;
}

void MPIWork::finish() {
  if (after_) after_();
  scratch_.reset();
  done_ = true;
}

std::string MPIWork::describe(size_t i) const {
  if (i >= p2p.size()) return "";
  const P2PBuffer& b = p2p[i];
  return detail::concat(b.is_send ? "rank " : "no send from rank ", b.peer, b.is_send ? " did not receive " : " for ",
                        b.bytes, " bytes with tag ", b.tag, "; ");
}

void MPIWork::check_received(const std::vector<MPI_Status>& statuses) const {
  for (size_t i = 0; i < p2p.size(); ++i) {
    if (p2p[i].is_send) continue;
    int count = 0;
    MPI_Get_count(&statuses[i], MPI_BYTE, &count);
    DT_CHECK_ARG(count == p2p[i].bytes, "recv", "rank ", p2p[i].peer, " sent ", count, " bytes with tag ", p2p[i].tag,
                 ", this rank posted a recv of ", p2p[i].bytes);
  }
}

// ---- MPIGroup: waits and failures --------------------------------------------------------

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
        DT_CHECK_ARG(statuses[i].MPI_ERROR != MPI_ERR_TRUNCATE, op, "message truncated: ", describe(i),
                     "the send is larger than the posted recv");
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
          detail::concat("[", op, "] timed out after ", timeout_.count() / 1000.0, " s in group '", name_,
                         "' (mpi, size ", size_, ", this is rank ", rank_, "), call ", calls_, ": ",
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

// ---- MPIGroup: point to point ------------------------------------------------------------

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

}  // namespace dtensor::comm
