// The NCCL backend: bootstrap, split, the call's stream ordering, its Work, and the
// watchdog (nccl_group.h). The collectives themselves are in nccl_collectives.cpp.
#include "comm/nccl/nccl_group.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "comm/call_context.h"
#include "comm/flight_recorder.h"
#include "comm/nccl/nccl_backend.h"
#include "comm/nccl_support.h"
#include "util/check.h"

namespace dtensor::comm {

bool nccl_compiled() { return true; }

namespace nccl {

namespace {

using Clock = std::chrono::steady_clock;
using backend::cuda::check;

// Polls a non-blocking communicator until its pending operation (creation, split,
// an enqueue, finalize) is no longer in progress; the result, or ncclInProgress at
// the deadline.
ncclResult_t settle(ncclComm_t comm, Clock::time_point deadline) {
  ncclResult_t state = ncclInProgress;
  for (int spins = 0;; ++spins) {
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return r;
    if (state != ncclInProgress || Clock::now() > deadline) return state;
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// Makes `device` current for the scope and restores the previous one (the CUDA
// runtime wrappers cache the current device per thread).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = previous_;
    cudaGetDevice(&now);
    if (now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Whether `event` has run; a not-ready answer leaves no error behind for the thread's
// next cudaGetLastError.
bool event_done(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaErrorNotReady) cudaGetLastError();
  return status == cudaSuccess;
}

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - Clock::now());
  return timeout >= room ? Clock::time_point::max() : Clock::now() + timeout;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

EventPtr make_event() {
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  return EventPtr(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
}

// ---- the watchdog ---------------------------------------------------------------------

class Watchdog {
 public:
  static Watchdog& instance() {
    static auto* dog = new Watchdog;  // never destroyed: groups may die during static destruction
    return *dog;
  }
  void add(NcclGroup* group) {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.push_back(group);
    std::call_once(started_, [this] { std::thread([this] { run(); }).detach(); });
  }
  // From ~NcclGroup: waits for a round in progress, so the watchdog never touches a
  // group being destroyed, and never destroys one itself.
  void remove(NcclGroup* group) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase(groups_, group);
  }

 private:
  static constexpr auto kTick = std::chrono::milliseconds(100);
  void run() {
    while (true) {
      std::this_thread::sleep_for(kTick);
      std::lock_guard<std::mutex> lock(mutex_);
      for (NcclGroup* group : groups_) group->watch();
    }
  }
  std::mutex mutex_;
  std::vector<NcclGroup*> groups_;
  std::once_flag started_;
};

// ---- Work --------------------------------------------------------------------------------

class NcclWork final : public WorkImpl {
 public:
  NcclWork(std::shared_ptr<NcclGroup> group, const char* op, EventPtr done)
      : group_(std::move(group)), op_(op), done_(std::move(done)) {}
  // Orders the waiting thread's current stream after the call: no host block.
  void wait() override {
    group_->throw_if_failed(op_);
    cudaStream_t stream = static_cast<cudaStream_t>(backend::cuda::current_stream(group_->device_index()));
    check(cudaStreamWaitEvent(stream, done_.get(), 0), "cudaStreamWaitEvent");
  }
  // Never throws (a dropped Work asks from its destructor): an aborted call's kernels
  // have ended, so its event completes; wait() reports the abort.
  bool is_completed() override { return event_done(done_.get()); }
  void retain(std::shared_ptr<void> buffers) override { group_->retain_until(done_, std::move(buffers)); }

 private:
  std::shared_ptr<NcclGroup> group_;
  const char* op_;
  EventPtr done_;
};

}  // namespace

// ---- NcclGroup ------------------------------------------------------------------------------

NcclGroup::NcclGroup(ncclComm_t comm, int device, std::shared_ptr<GroupImpl> host)
    : comm_(comm), device_(device), host_(std::move(host)) {
  name_ = host_->name();
  timeout_ = host_->timeout();
  set_flight_recorder(host_->flight_recorder());
  const DeviceGuard guard(device_);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMalloc(&barrier_word_, sizeof(int32_t)), "cudaMalloc");
  check(cudaMemset(barrier_word_, 0, sizeof(int32_t)), "cudaMemset");
  // Scratch for packing comes from the device's stream-ordered pool; keep what it
  // grew to instead of returning it to the driver at every synchronisation.
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  ncclCommCount(comm_, &size_);
  ncclCommUserRank(comm_, &rank_);
}

void NcclGroup::registered() { Watchdog::instance().add(this); }

NcclGroup::~NcclGroup() {
  Watchdog::instance().remove(this);
  const DeviceGuard guard(device_);
  if (!failed_.load()) {
    // Flush what is queued, then free; a communicator that cannot finish in time is
    // aborted instead of holding this thread.
    const auto deadline = deadline_after(timeout_);
    ncclResult_t state = ncclCommFinalize(comm_);
    if (state == ncclSuccess || state == ncclInProgress) state = settle(comm_, deadline);
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (stream_) {
    cudaStreamSynchronize(stream_);  // the buffers retained for it may go now
    cudaStreamDestroy(stream_);
  }
  pending_.clear();
  if (barrier_word_) cudaFree(barrier_word_);
}

std::string NcclGroup::where(uint64_t seq) const {
  return detail::concat("group '", name_, "' (nccl, size ", size_, ", this is rank ", rank_, ", cuda:", device_,
                        "), call #", seq);
}

void NcclGroup::throw_if_failed(const char* op) const {
  if (!failed_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  throw std::runtime_error(detail::concat("[", op, "] group '", name_, "' (nccl) was aborted: ", error_));
}

GroupImpl& NcclGroup::host() {
  host_->set_timeout(timeout_);
  return *host_;
}

bool NcclGroup::host_buffers(const char* op) const {
  const Device device = CallContext::current().device;
  if (device.is_cpu()) return true;
  DT_CHECK_ARG(device.index == device_, op, "group '", name_, "' (nccl, this is rank ", rank_,
               ") communicates on cuda:", device_, ", the tensors are on ", device.to_string());
  return false;
}

NcclGroup::Call NcclGroup::begin(const char* op) {
  std::unique_lock<std::recursive_mutex> api(api_);
  throw_if_failed(op);  // after the lock: an abort in between is seen
  cudaStream_t caller = static_cast<cudaStream_t>(backend::cuda::current_stream(device_));
  // The producers' work on the caller's stream comes first.
  const EventPtr ready = make_event();
  check(cudaEventRecord(ready.get(), caller), "cudaEventRecord");
  check(cudaStreamWaitEvent(stream_, ready.get(), 0), "cudaStreamWaitEvent");
  return Call{op, caller, calls_++, std::move(api)};
}

void NcclGroup::nccl_check(ncclResult_t result, const char* op, const char* what) {
  if (result == ncclInProgress) result = settle(comm_, deadline_after(timeout_));
  if (result == ncclSuccess) return;
  const std::string detail_text = ncclGetLastError(comm_);
  if (result == ncclInProgress) {
    abort(detail::concat("[", op, "] ", what, " still in progress after ", timeout_.count() / 1000.0, " s in ",
                         where(calls_ - 1)));
    throw_if_failed(op);
  }
  throw std::runtime_error(detail::concat("[", op, "] ", what, " failed in ", where(calls_ - 1), ": ",
                                          ncclGetErrorString(result), detail_text.empty() ? "" : ": " + detail_text));
}

void* NcclGroup::scratch(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocAsync(&p, std::max<size_t>(bytes, 1), stream_), "cudaMallocAsync");
  return p;
}

WorkPtr NcclGroup::end(const Call& call, bool async, const std::vector<void*>& scratch) {
  for (void* p : scratch) check(cudaFreeAsync(p, stream_), "cudaFreeAsync");
  EventPtr done = make_event();
  check(cudaEventRecord(done.get(), stream_), "cudaEventRecord");
  // The flight record completes when the GPU has run the call, not when it returns.
  FlightRef flight = std::exchange(CallContext::current().flight, {});
  if (flight.recorder && flight.recorder == flight_recorder().get()) {
    flight.recorder->defer(flight.group, flight.id);
  } else {
    flight = {};
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back({done, deadline_after(timeout_), call.op, call.seq, nullptr, flight});
  }
  if (!async) {
    check(cudaStreamWaitEvent(call.caller, done.get(), 0), "cudaStreamWaitEvent");
    return nullptr;
  }
  return std::make_shared<NcclWork>(shared_from_this(), call.op, std::move(done));
}

void NcclGroup::retain_until(EventPtr done, std::shared_ptr<void> buffers) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({std::move(done), Clock::time_point::max(), "", 0, std::move(buffers)});
}

void NcclGroup::watch() {
  if (failed_.load()) return;
  // The rank is inside an NCCL call on this communicator: its own deadline covers it.
  std::unique_lock<std::recursive_mutex> api(api_, std::try_to_lock);
  if (!api.owns_lock() || failed_.load()) return;
  const DeviceGuard guard(device_);
  // A rank failed where the host group can see it (threads: a launch rank threw): the
  // peers' kernels would wait for it until the timeout.
  if (const std::string failed = host_->failure(); !failed.empty()) {
    abort(detail::concat("released from group '", name_, "' (nccl, size ", size_, ", this is rank ", rank_,
                         ") because ", failed));
    return;
  }
  ncclResult_t async_error = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &async_error) == ncclSuccess && async_error != ncclSuccess &&
      async_error != ncclInProgress) {
    abort(detail::concat("NCCL reported an asynchronous error in group '", name_, "' (nccl, size ", size_,
                         ", this is rank ", rank_, "): ", ncclGetErrorString(async_error), ": ",
                         ncclGetLastError(comm_)));
    return;
  }
  std::string overdue;
  std::vector<Pending> finished;  // destroyed outside the lock (their buffers go back to the allocator)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (event_done(it->done.get())) {
        if (it->flight.recorder) it->flight.recorder->complete(it->flight.group, it->flight.id, FlightState::Completed);
        finished.push_back(std::move(*it));
        it = pending_.erase(it);
        continue;
      }
      if (overdue.empty() && it->deadline != Clock::time_point::max() && now > it->deadline) {
        overdue = detail::concat("[", it->op, "] timed out after ", timeout_.count() / 1000.0, " s in ", where(it->seq),
                                 ": it did not complete on the GPU (a rank of the group did not make this call, or "
                                 "stopped; DTENSOR_TIMEOUT_S or group.set_timeout); the communicator was aborted");
      }
      ++it;
    }
  }
  if (!overdue.empty()) abort(overdue);
}

void NcclGroup::abort(const std::string& reason) {
  const std::lock_guard<std::recursive_mutex> api(api_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.load()) return;
    error_ = reason;
    failed_.store(true, std::memory_order_release);
    for (const Pending& p : pending_) {
      if (p.flight.recorder) p.flight.recorder->complete(p.flight.group, p.flight.id, FlightState::Failed);
    }
  }
  std::fprintf(stderr, "[dtensor] %s\n", reason.c_str());
  std::fflush(stderr);
  FlightRecorder::dump_all_on_failure(reason);
  // ncclCommAbort frees the communicator and ends its kernels, so the streams waiting
  // for them move on. Should it hang itself, the process ends (the peers' watchdogs
  // end theirs).
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread([comm = comm_, device = device_, finished] {
    cudaSetDevice(device);
    ncclCommAbort(comm);
    finished->store(true);
  }).detach();
  comm_ = nullptr;
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!finished->load() && Clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!finished->load()) {
    std::fprintf(stderr, "[dtensor] ncclCommAbort did not return within 10 s; ending the process\n");
    std::_Exit(124);
  }
}

std::shared_ptr<GroupImpl> NcclGroup::split(int color, int key) {
  const char* kOp = "split";
  // The host group splits the same way (it carries this group's host-memory calls).
  std::shared_ptr<GroupImpl> host_child = host().split(color, key);
  const Call call = begin(kOp);
  const DeviceGuard guard(device_);
  ncclConfig_t config = nonblocking_config();
  ncclComm_t child = nullptr;
  ncclResult_t result = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  // On a non-blocking parent the split finishes in the background (and only then
  // writes `child`): the parent is polled whatever the call returned.
  const auto deadline = deadline_after(timeout_);
  if (result == ncclSuccess || result == ncclInProgress) result = settle(comm_, deadline);
  ncclComm_t made = __atomic_load_n(&child, __ATOMIC_ACQUIRE);
  if (result == ncclSuccess && made) result = settle(made, deadline);
  if (result != ncclSuccess) {
    const std::string reason =
        detail::concat("[split] ncclCommSplit ", result == ncclInProgress ? "did not complete" : "failed", " in ",
                       where(call.seq), ": ", ncclGetErrorString(result));
    abort(reason);  // joins the split's job: `child` is final after it
    if (ncclComm_t late = __atomic_load_n(&child, __ATOMIC_ACQUIRE)) ncclCommAbort(late);
    throw_if_failed(kOp);
  }
  if (color < 0) return nullptr;
  DT_CHECK_SUPPORTED(made != nullptr && host_child != nullptr, kOp, "NCCL and the host group disagree on color ",
                     color);
  auto group = std::make_shared<NcclGroup>(made, device_, host_child);
  DT_CHECK_SUPPORTED(group->rank() == host_child->rank(), kOp, "NCCL ranks this rank ", group->rank(), " of color ",
                     color, ", the host group ", host_child->rank());
  group->registered();
  return group;
}

}  // namespace nccl

// ---- the world ------------------------------------------------------------------------------

std::shared_ptr<GroupImpl> nccl_world(const std::shared_ptr<GroupImpl>& host) {
  // One NCCL world per host world while any handle to it lives.
  static std::mutex mutex;
  static std::map<const GroupImpl*, std::pair<std::weak_ptr<GroupImpl>, std::weak_ptr<GroupImpl>>> worlds;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = worlds.find(host.get());
    if (it != worlds.end() && !it->second.first.expired()) {
      if (auto world = it->second.second.lock()) return world;
    }
  }
  // Threads: every rank is a thread of this process; mpi: the launcher says which
  // processes share this host (one host when it says nothing).
  LocalRank local{host->rank(), host->size()};
  if (host->backend() == "mpi") {
    if (auto from_env = local_rank_from_env()) local = *from_env;
  }
  // Threads share the process's GPUs; processes may each see only their own.
  const bool one_process = host->backend() != "mpi";
  const int device = nccl_device_for(local.rank, local.size, backend::cuda::device_count(), one_process);
  backend::cuda::check(cudaSetDevice(device), "cudaSetDevice");
  // A host group of its own: its timeout follows this group's, and the user's world
  // keeps its own.
  std::shared_ptr<GroupImpl> own_host = host->split(0, host->rank());
  own_host->set_name(host->name());
  own_host->set_flight_recorder(host->flight_recorder());
  ncclUniqueId id{};
  if (host->rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      throw std::runtime_error(detail::concat("[init] ncclGetUniqueId failed: ", ncclGetErrorString(r)));
    }
  }
  static_assert(sizeof(id) % sizeof(int64_t) == 0);
  {
    InternalCallScope scope("init", "the NCCL unique id");
    host->broadcast(&id, sizeof(id) / sizeof(int64_t), DType::I64, 0, false);
  }
  ncclConfig_t config = nccl::nonblocking_config();
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, host->size(), id, host->rank(), &config);
  if (result == ncclInProgress) result = nccl::settle(comm, nccl::deadline_after(host->timeout()));
  if (result != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    throw std::runtime_error(detail::concat(
        "[init] NCCL communicator of ", host->size(), " ranks (this is rank ", host->rank(), " on cuda:", device, ") ",
        result == ncclInProgress
            ? detail::concat("not ready after ", host->timeout().count() / 1000.0,
                             " s: a rank did not call init(\"nccl\"), or cannot reach the others")
            : detail::concat("could not be made: ", ncclGetErrorString(result),
                             result == ncclInvalidUsage ? " (two ranks on one GPU? NCCL does not allow it)" : "")));
  }
  auto world = std::make_shared<nccl::NcclGroup>(comm, device, own_host);
  world->registered();
  std::lock_guard<std::mutex> lock(mutex);
  worlds[host.get()] = {host, world};
  return world;
}

}  // namespace dtensor::comm
