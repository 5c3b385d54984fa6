// What the MPI backend does when ranks fail, stall or disagree (docs/communication.md,
// "What happens when..."):
// - A watchdog thread per process (NCCL/PyTorch style): every MPI call that may
//   block registers with it at the cost of a few stores (blocking MPI calls stay the
//   fast path); past the group's timeout it prints the op, group, call number and
//   what it waits for, and aborts the job (MPI cannot interrupt a blocking call).
// - Requests MPI still owns after a timeout or a dropped Work stay alive, with the
//   buffers and count arrays they use, until MPI is done with them or the job ends.
// - An uncaught exception, or an exit with a non-zero status, aborts the job with
//   the reason instead of leaving the other ranks waiting in a collective (or this
//   one in MPI_Finalize for them).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtensor::comm {

// What the watchdog says about a group: made once per group and never freed (kept
// in a process-wide list), so the watchdog thread may read it whenever it likes.
struct WatchedGroup {
  std::string name;
  int rank = 0, size = 1;
};
const WatchedGroup* watched_group(std::string name, int rank, int size);

// One blocking call of this thread, watched while the object lives. Costs a few
// relaxed stores and one release store each way (no clock read, no lock).
class Watch {
 public:
  Watch(const WatchedGroup* group, const char* op, uint64_t call, std::chrono::milliseconds timeout,
        const char* waiting_for = nullptr);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
};

// Prints `message` to stderr with this process's world rank, then ends the job
// (MPI_Abort; SIGALRM ends this process if the abort itself should hang).
[[noreturn]] void abort_job(const std::string& message, int code);

// Exit status of a job ended by the watchdog, like timeout(1).
inline constexpr int kTimeoutExitCode = 124;

// Takes over requests MPI still owns, and what they read or write, until they
// complete. `cancellable`: point-to-point requests, cancelled at exit (a collective's
// cannot be; at exit it is awaited, watched).
void abandon(std::vector<MPI_Request> requests, std::shared_ptr<void> keep_alive, bool cancellable);
// Frees abandoned requests that completed meanwhile (a relaxed load when there are none).
void reap_abandoned();

// Called once MPI is initialised: the watchdog thread, the terminate handler, and
// (when dtensor initialised MPI) the exit handler that aborts on a non-zero status
// and otherwise cancels or awaits abandoned requests and finalises MPI, watched.
void install_process_handlers(bool finalize_at_exit);

}  // namespace dtensor::comm
