// The MPI backend's watchdog, abandoned requests, job abort and exit handling
// (see mpi_faults.h).
#include "comm/mpi/mpi_faults.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/comm_backend.h"
#include "comm/flight_recorder.h"
#include "dtensor/error.h"

namespace dtensor::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> world_rank{-1}, world_size{0};  // for messages; set once MPI is initialised
// How long an aborting process waits for the other processes' flight records (their
// watchdogs look for the request every 200 ms).
constexpr auto kDumpPatience = std::chrono::seconds(3);

// One per thread that ever made a watched call. The thread writes, the watchdog
// reads: `seq` is odd while a call is in progress and guards the other fields
// (a seqlock: the watchdog re-reads it after them).
struct WatchSlot {
  std::atomic<uint64_t> seq{0};
  std::atomic<const WatchedGroup*> group{nullptr};
  std::atomic<const char*> op{nullptr};
  std::atomic<const char*> waiting_for{nullptr};
  std::atomic<uint64_t> call{0};
  std::atomic<int64_t> timeout_ms{0};
  // The watchdog thread's own: the call it last saw in progress, and since when.
  uint64_t seen_seq = 0;
  Clock::time_point seen_since;
};

class Watchdog {
 public:
  // Never destroyed: threads may end (and calls be watched) during static destruction.
  static Watchdog& instance() {
    static Watchdog* watchdog = new Watchdog;
    return *watchdog;
  }

  WatchSlot* new_slot() {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_.push_back(new WatchSlot);  // never freed either: the watchdog may be reading it
    return slots_.back();
  }

  void start() {
    std::call_once(started_, [this] { std::thread([this] { run(); }).detach(); });
  }

 private:
  // A call is timed from when the watchdog first sees it (ticks of 10 ms), so
  // watching costs the calling thread no clock read.
  static constexpr auto kTick = std::chrono::milliseconds(10);
  static constexpr uint64_t kDumpRequestTicks = 20;

  void run() {
    for (uint64_t tick = 1;; ++tick) {
      std::this_thread::sleep_for(kTick);
      // Another process of the job failed and asks every rank for its flight record.
      if (tick % kDumpRequestTicks == 0) FlightRecorder::poll_dump_request();
      std::vector<WatchSlot*> slots;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slots = slots_;
      }
      const auto now = Clock::now();
      for (WatchSlot* s : slots) {
        const uint64_t seq = s->seq.load(std::memory_order_acquire);
        if (seq % 2 == 0) continue;
        if (seq != s->seen_seq) {
          s->seen_seq = seq;
          s->seen_since = now;
          continue;
        }
        const auto timeout = std::chrono::milliseconds(s->timeout_ms.load(std::memory_order_relaxed));
        if (now - s->seen_since < timeout) continue;
        const WatchedGroup* group = s->group.load(std::memory_order_relaxed);
        const char* op = s->op.load(std::memory_order_relaxed);
        const char* waiting_for = s->waiting_for.load(std::memory_order_relaxed);
        const uint64_t call = s->call.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (s->seq.load(std::memory_order_relaxed) != seq) continue;  // it just completed
        abort_job(detail::concat(
                      "[watchdog] ", op, " in group '", group->name, "' (mpi, size ", group->size,
                      ", this is rank ", group->rank, ")",
                      call > 0 ? detail::concat(", call ", call, " on this group,") : std::string(),
                      " did not complete within ", timeout.count() / 1000.0,
                      " s (DTENSOR_TIMEOUT_S or group.set_timeout): ",
                      waiting_for ? waiting_for
                                  : "some rank of the group has not made this call (DTENSOR_DEBUG=collectives "
                                    "names which); aborting the job"),
                  kTimeoutExitCode);
      }
    }
  }

  std::mutex mutex_;
  std::vector<WatchSlot*> slots_;
  std::once_flag started_;
};

thread_local WatchSlot* this_thread_slot = nullptr;

WatchSlot& my_slot() {
  if (!this_thread_slot) this_thread_slot = Watchdog::instance().new_slot();
  return *this_thread_slot;
}

// ---- abandoned requests ----------------------------------------------------------------

struct Abandoned {
  std::vector<MPI_Request> requests;
  std::shared_ptr<void> keep_alive;
  bool cancellable = false;
};

std::mutex abandoned_mutex;
std::vector<Abandoned>& abandoned_list() {
  static auto* list = new std::vector<Abandoned>;  // read at exit, after static destructors
  return *list;
}
std::atomic<size_t> abandoned_count{0};

// Waits for every abandoned request, watched: receives MPI can cancel are
// cancelled first; what never completes ends the job at the timeout.
void settle_abandoned() {
  std::lock_guard<std::mutex> lock(abandoned_mutex);
  WatchedGroup process{"world", world_rank.load(), world_size.load()};
  for (Abandoned& a : abandoned_list()) {
    for (MPI_Request& r : a.requests) {
      if (a.cancellable && r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    }
    Watch watch(&process, "waiting at exit for an abandoned operation", 0, default_timeout(),
                "an operation whose Work was dropped or whose wait timed out never completed; aborting the job");
    MPI_Waitall(static_cast<int>(a.requests.size()), a.requests.data(), MPI_STATUSES_IGNORE);
  }
  abandoned_list().clear();
  abandoned_count.store(0);
}

void on_process_exit(int status, void*) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (status != 0) {
    // The job cannot succeed without this rank, and its peers may be waiting for it
    // in a collective (while MPI_Finalize would wait for them): end it now.
    abort_job(detail::concat("exiting with status ", status, " before the other ranks; aborting the job"), status);
  }
  settle_abandoned();
  WatchedGroup world{"world", world_rank.load(), world_size.load()};
  Watch watch(&world, "MPI_Finalize", 0, default_timeout(),
              "another rank has not finished (it may be waiting in a collective this rank never made); aborting "
              "the job");
  MPI_Finalize();
}

[[noreturn]] void on_terminate() {
  std::string what = "std::terminate was called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = detail::concat("uncaught exception: ", x.what());
    } catch (...) {
      what = "uncaught exception not derived from std::exception";
    }
  }
  abort_job(what + "; aborting the job", 1);
}

}  // namespace

Watch::Watch(const WatchedGroup* group, const char* op, uint64_t call, std::chrono::milliseconds timeout,
             const char* waiting_for) {
  WatchSlot& s = my_slot();
  s.group.store(group, std::memory_order_relaxed);
  s.op.store(op, std::memory_order_relaxed);
  s.waiting_for.store(waiting_for, std::memory_order_relaxed);
  s.call.store(call, std::memory_order_relaxed);
  s.timeout_ms.store(timeout.count(), std::memory_order_relaxed);
  s.seq.store(s.seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

Watch::~Watch() {
  WatchSlot& s = *this_thread_slot;
  s.seq.store(s.seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

const WatchedGroup* watched_group(std::string name, int rank, int size) {
  static std::mutex mutex;
  static auto* groups = new std::vector<std::unique_ptr<WatchedGroup>>;
  std::lock_guard<std::mutex> lock(mutex);
  groups->push_back(std::make_unique<WatchedGroup>(WatchedGroup{std::move(name), rank, size}));
  return groups->back().get();
}

void abort_job(const std::string& message, int code) {
  std::fprintf(stderr, "[dtensor] rank %d of MPI_COMM_WORLD: %s\n", world_rank.load(), message.c_str());
  std::fflush(stderr);
  // The flight records (DTENSOR_FLIGHT_RECORDER): this process's, and the others'
  // through their watchdogs, before MPI_Abort ends them all.
  if (const std::string dir = FlightRecorder::dump_dir(); !dir.empty()) {
    FlightRecorder::dump_all_on_failure(message);
    FlightRecorder::request_dumps(dir, world_rank.load());
    FlightRecorder::wait_for_dumps(dir, world_size.load(), kDumpPatience);
  }
  alarm(10);  // should MPI_Abort itself hang, SIGALRM ends this process
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void abandon(std::vector<MPI_Request> requests, std::shared_ptr<void> keep_alive, bool cancellable) {
  std::lock_guard<std::mutex> lock(abandoned_mutex);
  abandoned_list().push_back({std::move(requests), std::move(keep_alive), cancellable});
  abandoned_count.store(abandoned_list().size(), std::memory_order_relaxed);
}

void reap_abandoned() {
  if (abandoned_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(abandoned_mutex);
  auto& list = abandoned_list();
  std::erase_if(list, [](Abandoned& a) {
    int done = 0;
    MPI_Testall(static_cast<int>(a.requests.size()), a.requests.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  });
  abandoned_count.store(list.size(), std::memory_order_relaxed);
}

void install_process_handlers(bool finalize_at_exit) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  world_rank.store(rank);
  world_size.store(size);
  Watchdog::instance().start();
  std::set_terminate(on_terminate);
  if (finalize_at_exit) on_exit(on_process_exit, nullptr);
}

}  // namespace dtensor::comm
