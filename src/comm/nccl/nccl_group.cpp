// The NCCL backend: bootstrap, split, the call's stream ordering, its Work, and the
// watchdog (nccl_group.h). The collectives themselves are in nccl_collectives.cpp.
#include "comm/nccl/nccl_group.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

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
  while (true) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress || Clock::now() > deadline) return state;
    std::this_thread::yield();
  }
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
  backend::cuda::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  return EventPtr(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
}

// ---- the watchdog ---------------------------------------------------------------------

class Watchdog {
 public:
  static Watchdog& instance() {
    static auto* dog = new Watchdog;  // never destroyed: groups may die during static destruction
    return *dog;
  }
  void add(const std::shared_ptr<NcclGroup>& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.push_back(group);
    std::call_once(started_, [this] { std::thread([this] { run(); }).detach(); });
  }

 private:
  static constexpr auto kTick = std::chrono::milliseconds(100);
  void run() {
    while (true) {
      std::this_thread::sleep_for(kTick);
      std::vector<std::shared_ptr<NcclGroup>> live;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        std::erase_if(groups_, [](const std::weak_ptr<NcclGroup>& g) { return g.expired(); });
        for (const auto& g : groups_) {
          if (auto group = g.lock()) live.push_back(std::move(group));
        }
      }
      for (const auto& group : live) group->watch();
    }
  }
  std::mutex mutex_;
  std::vector<std::weak_ptr<NcclGroup>> groups_;
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
    cudaStream_t stream = static_cast<cudaStream_t>(backend::cuda::current_stream(group_->device()));
    backend::cuda::check(cudaStreamWaitEvent(stream, done_.get(), 0), "cudaStreamWaitEvent");
  }
  bool is_completed() override {
    group_->throw_if_failed(op_);
    return cudaEventQuery(done_.get()) == cudaSuccess;
  }
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
  backend::cuda::check(cudaSetDevice(device_), "cudaSetDevice");
  backend::cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  backend::cuda::check(cudaMalloc(&barrier_word_, sizeof(int32_t)), "cudaMalloc");
  backend::cuda::check(cudaMemset(barrier_word_, 0, sizeof(int32_t)), "cudaMemset");
  ncclCommCount(comm_, &size_);
  ncclCommUserRank(comm_, &rank_);
}

NcclGroup::~NcclGroup() {
  cudaSetDevice(device_);
  if (!failed_.load()) {
    // Flush what is queued, then free; a communicator that cannot finish in time is
    // aborted instead of holding this thread.
    const auto deadline = deadline_after(timeout_);
    ncclResult_t state = ncclCommFinalize(comm_);
    if (state == ncclInProgress) state = settle(comm_, deadline);
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (stream_) cudaStreamDestroy(stream_);
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
  throw_if_failed(op);
  cudaStream_t caller = static_cast<cudaStream_t>(backend::cuda::current_stream(device_));
  // The producers' work on the caller's stream comes first.
  const EventPtr ready = make_event();
  backend::cuda::check(cudaEventRecord(ready.get(), caller), "cudaEventRecord");
  backend::cuda::check(cudaStreamWaitEvent(stream_, ready.get(), 0), "cudaStreamWaitEvent");
  return Call{op, caller, calls_++};
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
  backend::cuda::check(cudaMallocAsync(&p, std::max<size_t>(bytes, 1), stream_), "cudaMallocAsync");
  return p;
}

WorkPtr NcclGroup::end(const Call& call, bool async, const std::vector<void*>& scratch) {
  for (void* p : scratch) backend::cuda::check(cudaFreeAsync(p, stream_), "cudaFreeAsync");
  EventPtr done = make_event();
  backend::cuda::check(cudaEventRecord(done.get(), stream_), "cudaEventRecord");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back({done, deadline_after(timeout_), call.op, call.seq, nullptr});
  }
  if (!async) {
    backend::cuda::check(cudaStreamWaitEvent(call.caller, done.get(), 0), "cudaStreamWaitEvent");
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
  cudaSetDevice(device_);
  ncclResult_t async_error = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &async_error) == ncclSuccess && async_error != ncclSuccess &&
      async_error != ncclInProgress) {
    abort(detail::concat("NCCL reported an asynchronous error in group '", name_, "' (nccl, size ", size_,
                         ", this is rank ", rank_, "): ", ncclGetErrorString(async_error), ": ",
                         ncclGetLastError(comm_)));
    return;
  }
  std::string overdue;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = Clock::now();
    std::erase_if(pending_, [&](const Pending& p) {
      if (cudaEventQuery(p.done.get()) == cudaSuccess) return true;
      if (overdue.empty() && p.deadline != Clock::time_point::max() && now > p.deadline) {
        overdue = detail::concat("[", p.op, "] timed out after ", timeout_.count() / 1000.0, " s in ", where(p.seq),
                                 ": it did not complete on the GPU (a rank of the group did not make this call, or "
                                 "stopped; DTENSOR_TIMEOUT_S or group.set_timeout); the communicator was aborted");
      }
      return false;
    });
  }
  if (!overdue.empty()) abort(overdue);
}

void NcclGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.load()) return;
    error_ = reason;
    failed_.store(true, std::memory_order_release);
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
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!finished->load() && Clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!finished->load()) {
    std::fprintf(stderr, "[dtensor] ncclCommAbort did not return within 10 s; ending the process\n");
    std::_Exit(124);
  }
}

std::shared_ptr<GroupImpl> NcclGroup::split(int color, int key) {
  const char* kOp = "split";
  throw_if_failed(kOp);
  cudaSetDevice(device_);
  // The host group splits the same way (it carries this group's host-memory calls).
  std::shared_ptr<GroupImpl> host_child = host().split(color, key);
  ncclConfig_t config = nonblocking_config();
  ncclComm_t child = nullptr;
  const uint64_t seq = calls_++;
  ncclResult_t result = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  const auto deadline = deadline_after(timeout_);
  if (result == ncclInProgress) result = settle(comm_, deadline);
  if (result == ncclSuccess && child) result = settle(child, deadline);
  if (result != ncclSuccess) {
    if (child) ncclCommAbort(child);
    abort(detail::concat("[split] ncclCommSplit ", result == ncclInProgress ? "did not complete" : "failed", " in ",
                         where(seq), ": ", ncclGetErrorString(result)));
    throw_if_failed(kOp);
  }
  if (color < 0) return nullptr;
  DT_CHECK_SUPPORTED(child != nullptr && host_child != nullptr, kOp, "NCCL and the host group disagree on color ",
                     color);
  auto group = std::make_shared<NcclGroup>(child, device_, host_child);
  Watchdog::instance().add(group);
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
  const int device = nccl_device_for(local.rank, local.size, backend::cuda::device_count());
  backend::cuda::check(cudaSetDevice(device), "cudaSetDevice");
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
        result == ncclInProgress ? detail::concat("not ready after ", host->timeout().count() / 1000.0,
                                                  " s: a rank did not call init(\"nccl\"), or cannot reach the others")
                                 : detail::concat("could not be made: ", ncclGetErrorString(result))));
  }
  auto world = std::make_shared<nccl::NcclGroup>(comm, device, host);
  nccl::Watchdog::instance().add(world);
  std::lock_guard<std::mutex> lock(mutex);
  worlds[host.get()] = {host, world};
  return world;
}

}  // namespace dtensor::comm
