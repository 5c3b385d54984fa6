// Group and Work handles, launch (the threads backend's entry) and init.
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/cuda_runtime.h"
#include "comm/collective_args.h"
#include "comm/comm_backend.h"
#include "comm/fault_injection.h"
#include "comm/flight_recorder.h"
#include "comm/mpi/mpi_backend.h"
#include "comm/nccl/nccl_backend.h"
#include "comm/threads/threads_group.h"
#include "dtensor/comm_debug.h"
#include "dtensor/error.h"
#include "dtensor/group.h"
#include "dtensor/trace.h"
#include "util/check.h"

namespace dtensor {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

namespace comm {

const char* call_kind_name(CallKind kind) {
  static const char* const names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                      "broadcast",  "gather",     "scatter",        "barrier",
                                      "send",       "recv",       "split"};
  return names[static_cast<int>(kind)];
}

std::chrono::milliseconds parse_timeout_seconds(const char* text) {
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  const int64_t max_seconds = std::chrono::duration_cast<std::chrono::seconds>(kMaxTimeout).count();
  // NaN fails every comparison, so it is rejected with the infinities.
  DT_CHECK_ARG(end != text && *end == '\0' && std::isfinite(seconds) && seconds >= 0.001 &&
                   seconds <= static_cast<double>(max_seconds),
               "DTENSOR_TIMEOUT_S", "expected a number of seconds from 0.001 to ", max_seconds,
               " (1 ms to one year), got '", text, "'");
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

std::chrono::milliseconds default_timeout() {
  static const std::chrono::milliseconds timeout = [] {
    const char* env = std::getenv("DTENSOR_TIMEOUT_S");
    return env && *env ? parse_timeout_seconds(env) : std::chrono::milliseconds(10 * 60 * 1000);
  }();
  return timeout;
}

void GroupImpl::injected_stall() {
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace comm

// ---- Work, Group ---------------------------------------------------------------------

void Work::wait() {
  if (!impl_) return;
  TraceSpan span("wait", "comm");
  impl_->wait();
}

bool Work::is_completed() const { return !impl_ || impl_->is_completed(); }

namespace {
const comm::GroupImpl& checked(const std::shared_ptr<comm::GroupImpl>& impl, const char* op) {
  DT_CHECK_ARG(impl != nullptr, op, "expected a defined group, got an undefined one "
               "(split with a negative color returns one)");
  return *impl;
}
}  // namespace

int Group::rank() const { return checked(impl_, "rank").rank(); }
int Group::size() const { return checked(impl_, "size").size(); }
std::string Group::backend() const { return checked(impl_, "backend").backend(); }
std::string Group::name() const { return checked(impl_, "name").name(); }
Device Group::device() const { return checked(impl_, "device").device(); }
std::chrono::milliseconds Group::timeout() const { return checked(impl_, "timeout").timeout(); }

void Group::set_timeout(std::chrono::milliseconds timeout) {
  checked(impl_, "set_timeout");
  DT_CHECK_ARG(timeout.count() > 0 && timeout <= comm::kMaxTimeout, "set_timeout",
               "expected a timeout from 1 ms to one year (", comm::kMaxTimeout.count(), " ms), got ",
               timeout.count(), " ms");
  impl_->set_timeout(timeout);
}

Group Group::split(int color, int key) const {
  checked(impl_, "split");
  const comm::FlightToken record = comm::begin_call("split", *this, 0, {.dtype = DType::I32});
  Group child(impl_->split(color, key));
  // The children record into this rank's recorder.
  if (child.defined()) child.impl()->set_flight_recorder(impl_->flight_recorder());
  return child;
}

// ---- launch ----------------------------------------------------------------------------

namespace {
// The world of the rank thread running inside launch (so init() finds it).
thread_local Group launched_world;

struct LaunchedWorldScope {
  explicit LaunchedWorldScope(Group g) { launched_world = std::move(g); }
  ~LaunchedWorldScope() { launched_world = Group(); }
};
}  // namespace

void launch(int n, const std::function<void(Group world)>& fn) {
  DT_CHECK_ARG(n >= 1, "launch", "expected at least 1 rank, got ", n);
  backend::cpu::configure_blas_threads(n);
  auto world = std::make_shared<comm::threads::World>(n);
  auto shared = comm::threads::make_world(world, n);
  const std::optional<comm::FaultSpec> faults = comm::fault_spec_from_env();
  std::vector<std::shared_ptr<comm::FlightRecorder>> recorders;
  for (int r = 0; r < n; ++r) recorders.push_back(comm::FlightRecorder::make(r, n, "threads"));
  std::mutex mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> ranks;
  ranks.reserve(n);
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      ScopedMemoryCounters counters(std::make_shared<RankMemoryCounters>());
      std::string message;
      std::exception_ptr error;
      try {
        const comm::threads::RankThreadScope own_thread(world.get(), r);
        comm::LaunchRankFaults armed(faults, r);
        Group group(std::make_shared<comm::threads::ThreadsGroup>(shared, r, "world"));
        group.impl()->set_flight_recorder(recorders[r]);
        LaunchedWorldScope scope(group);
        try {
          fn(std::move(group));
        } catch (const comm::RankExit&) {
          // DTENSOR_FAULT kind exit: the rank ends here as if its function returned.
        }
        world->rank_returned(r);
        return;
      } catch (const std::exception& e) {
        message = e.what();
        error = std::current_exception();
      } catch (...) {
        message = "an exception not derived from std::exception";
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = error;
      }
      // Releases peers blocked in a collective with this rank and message.
      world->abort(r, message);
      world->rank_ended(r);
    });
  }
  for (auto& t : ranks) t.join();
  world->wait_for_workers();
  backend::cpu::configure_blas_threads(1);
  if (first_error) {
    // Every rank's flight record, now that all have ended (DTENSOR_FLIGHT_RECORDER).
    for (const auto& recorder : recorders) {
      if (recorder) recorder->dump_on_failure(world->abort_reason());
    }
    std::rethrow_exception(first_error);
  }
}

// ---- init ------------------------------------------------------------------------------

namespace {
const char* const kBackends = "threads, mpi, nccl, any";

Group single_threads_group() {
  // Outside launch the threads backend has one rank; one world per process.
  static const Group group(std::make_shared<comm::threads::ThreadsGroup>(
      comm::threads::make_world(std::make_shared<comm::threads::World>(1), 1), 0, "world"));
  return group;
}
}  // namespace

Group self_group() {
  return Group(std::make_shared<comm::threads::ThreadsGroup>(
      comm::threads::make_world(std::make_shared<comm::threads::World>(1), 1), 0, "self"));
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"threads"};
  if (comm::mpi_compiled()) names.push_back("mpi");
  if (is_available("nccl")) names.push_back("nccl");
  return names;
}

bool is_available(std::string_view backend) {
  if (backend == "threads" || backend == "any") return true;
  if (backend == "mpi") return comm::mpi_compiled();
  // Built, and a GPU to run on.
  if (backend == "nccl") return comm::nccl_compiled() && backend::cuda::device_count() > 0;
  return false;
}

Group init(std::string_view backend) {
  std::string name(backend);
  if (name.empty()) {
    const char* env = std::getenv("DTENSOR_BACKEND");
    name = env && *env ? env : "any";
  }
  if (name == "threads") {
    return launched_world.defined() ? launched_world : single_threads_group();
  }
  if (name == "mpi") return Group(comm::mpi_world());
  if (name == "nccl") {
    // Bootstrapped over the launch's threads world, or MPI's when mpirun started us.
    Group host = launched_world.defined()                                  ? launched_world
                 : comm::mpi_compiled() && comm::started_by_mpi_launcher() ? Group(comm::mpi_world())
                                                                           : single_threads_group();
    return Group(comm::nccl_world(host.impl()));
  }
  if (name == "any") {
    // Documented order: the launch we are in, then MPI when mpirun started us, then
    // a single-rank threads group.
    if (launched_world.defined()) return launched_world;
    if (comm::mpi_compiled() && comm::started_by_mpi_launcher()) return Group(comm::mpi_world());
    return single_threads_group();
  }
  throw std::invalid_argument(detail::concat("[init] unknown backend '", name,
                                             "'; valid backends: ", kBackends));
}

}  // namespace dtensor
