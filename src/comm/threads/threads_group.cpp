// Rendezvous, call checking, split and async execution of the threads backend.
#include "comm/threads/threads_group.h"

#include <algorithm>
#include <sstream>

#include "comm/call_context.h"
#include "comm/threads/algorithms.h"
#include "comm/threads/device_collectives.h"
#include "comm/threads/p2p.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm::threads {

// ---- World --------------------------------------------------------------------------

World::World(int size)
    : size_(size),
      returned_(std::make_unique<std::atomic<bool>[]>(size)),
      ended_(std::make_unique<std::atomic<bool>[]>(size)),
      helper_threads_(std::make_unique<std::atomic<bool>[]>(size)),
      live_workers_(std::make_unique<std::atomic<int>[]>(size)),
      blocked_(std::make_unique<Blocked[]>(size)) {}

void World::wake_all() {
  std::vector<std::shared_ptr<Signal>> to_wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& weak : signals_) {
      if (auto s = weak.lock()) to_wake.push_back(std::move(s));
    }
  }
  for (auto& s : to_wake) s->notify();
}

void World::abort(int rank, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.load()) {
      reason_ = detail::concat("rank ", rank, " failed: ", message);
      aborted_.store(true, std::memory_order_seq_cst);
    }
  }
  wake_all();
}

void World::rank_returned(int rank) {
  returned_[rank].store(true);
  rank_ended(rank);
}

void World::rank_ended(int rank) {
  ended_[rank].store(true);
  wake_all();
}

std::string World::abort_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

void World::add_signal(const std::shared_ptr<Signal>& signal) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(signals_, [](const std::weak_ptr<Signal>& w) { return w.expired(); });
  signals_.push_back(signal);
}

void World::worker_started(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_workers_[rank].fetch_add(1);
}

void World::worker_finished(int rank) {
  bool now_gone = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    now_gone = live_workers_[rank].fetch_sub(1) == 1 && returned_[rank].load();
    workers_cv_.notify_all();
  }
  if (now_gone) wake_all();
}

void World::wait_for_workers() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Workers start and finish under the mutex, so the per-rank counts are stable here.
  workers_cv_.wait(lock, [&] {
    for (int r = 0; r < size_; ++r) {
      if (live_workers_[r].load() > 0) return false;
    }
    return true;
  });
}

// ---- Shared, CallDesc ---------------------------------------------------------------

Shared::Shared(std::vector<int> world_ranks_, std::shared_ptr<World> world_, std::string name_)
    : size(static_cast<int>(world_ranks_.size())),
      world(std::move(world_)),
      world_ranks(std::move(world_ranks_)),
      name(std::move(name_)),
      slots(std::make_unique<Slot[]>(size)) {
  world->add_signal(signal);
  for (int r = 0; r < size; ++r) {
    mailboxes.push_back(std::make_unique<Mailbox>());
    world->add_signal(mailboxes.back()->signal);
  }
}

Shared::~Shared() = default;

std::shared_ptr<Shared> make_world(std::shared_ptr<World> world, int size) {
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return std::make_shared<Shared>(std::move(ranks), std::move(world), "world");
}

std::string CallDesc::to_string() const {
  std::ostringstream os;
  if (!user_call.empty()) {
    os << user_call << " (its " << (purpose.empty() ? "" : purpose + ": ");
  }
  os << call_kind_name(kind) << "(";
  switch (kind) {
    case CallKind::Barrier: break;
    case CallKind::Split: os << "color " << color << ", key " << key; break;
    case CallKind::AllReduce: os << dtype_name(dtype) << ", " << count << " elements, " << reduce_op_name(op); break;
    case CallKind::Broadcast: os << dtype_name(dtype) << ", " << count << " elements, root " << root; break;
    default: {
      os << dtype_name(dtype) << ", counts " << shape_to_string(counts);
      if (kind == CallKind::AllToAll) {
        os << " -> " << shape_to_string(recv_counts)
           << (send_blocks    ? ", strided blocks"
               : equal_splits ? ", no split sizes"
                              : ", split sizes given");
      }
      if (outer != 1) os << " x " << outer << " rows";
      if (kind == CallKind::ReduceScatter) os << ", " << reduce_op_name(op);
      if (kind == CallKind::Gather || kind == CallKind::Scatter) os << ", root " << root;
    }
  }
  if (device.is_cuda()) os << ", on " << device.to_string();
  os << ")";
  if (!user_call.empty()) os << ")";
  return os.str();
}

namespace {

bool same_call(const CallDesc& a, const CallDesc& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case CallKind::Barrier:
    case CallKind::Split: return true;
    case CallKind::AllReduce: return a.dtype == b.dtype && a.count == b.count && a.op == b.op;
    case CallKind::Broadcast: return a.dtype == b.dtype && a.count == b.count && a.root == b.root;
    case CallKind::AllToAll:  // pairs checked separately
      return a.dtype == b.dtype && a.equal_splits == b.equal_splits &&
             (a.send_blocks != nullptr) == (b.send_blocks != nullptr);
    default:
      return a.dtype == b.dtype && a.counts == b.counts && a.outer == b.outer && a.op == b.op && a.root == b.root;
  }
}

class ThreadsWork final : public WorkImpl {
 public:
  void finish(std::exception_ptr error) {
    error_ = std::move(error);
    done_.store(true, std::memory_order_seq_cst);
    signal_.notify();
  }
  void wait() override {
    signal_.wait([&] { return done_.load(std::memory_order_acquire); }, [] { return false; }, Clock::time_point::max());
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override { return done_.load(std::memory_order_acquire); }
  // The queued task owns this work until it has run, so the buffers live as long.
  void retain(std::shared_ptr<void> buffers) override { buffers_ = std::move(buffers); }

 private:
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  Signal signal_;
  std::shared_ptr<void> buffers_;
};

thread_local bool t_on_async_worker = false;

}  // namespace

// ---- ThreadsGroup: rendezvous --------------------------------------------------------

ThreadsGroup::ThreadsGroup(std::shared_ptr<Shared> shared, int rank, std::string name)
    : shared_(std::move(shared)), rank_(rank) {
  name_ = std::move(name);
}

ThreadsGroup::~ThreadsGroup() {
  if (!worker_.joinable()) return;
  queue_->stop.store(true);
  queue_->work.notify();
  // The last task may hold the last reference, so this can run on the worker itself.
  if (worker_.get_id() == std::this_thread::get_id()) {
    worker_.detach();
  } else {
    worker_.join();
  }
}

void ThreadsGroup::throw_if_aborted(const char* op) const {
  if (!shared_->world->aborted()) return;
  throw std::runtime_error(
      detail::concat("[", op, "] released from group '", name_, "' because ", shared_->world->abort_reason()));
}

std::string ThreadsGroup::launch_ranks(const std::vector<int64_t>& ranks) const {
  if (shared_->world_ranks.size() == static_cast<size_t>(shared_->world->size())) return "";
  std::vector<int64_t> in_launch;
  for (int64_t r : ranks) in_launch.push_back(shared_->world_ranks[r]);
  if (in_launch.size() == 1) return detail::concat(" (launch rank ", in_launch[0], ")");
  return detail::concat(" (launch ranks ", shape_to_string(in_launch), ")");
}

void ThreadsGroup::throw_peer_gone(const char* op, int r) const {
  throw std::runtime_error(detail::concat(
      "[", op, "] rank ", r, launch_ranks({r}), " of group '", name_, "' (threads, size ", size(), ", this is rank ",
      rank_, ") returned from its launch function without making this call: the ranks' calls diverged"));
}

void ThreadsGroup::throw_timeout(const char* op, const std::string& missing) const {
  throw std::runtime_error(detail::concat("[", op, "] timed out after ", timeout_.count() / 1000.0, " s in group '",
                                          name_, "' (threads, size ", size(), ", this is rank ", rank_,
                                          "): ", missing));
}

bool on_async_worker() { return t_on_async_worker; }

uint64_t ThreadsGroup::arrive() {
  const uint64_t target = ++step_;
  shared_->slots[rank_].step.store(target, std::memory_order_release);
  // seq_cst pairs with Signal's sleeper count: a peer going to sleep either sees
  // this arrival or is woken by notify().
  const uint64_t before = shared_->gate.arrivals.fetch_add(1, std::memory_order_seq_cst);
  shared_->signal->notify();
  return before;
}

void ThreadsGroup::sync() {
  arrive();
  const uint64_t need = step_ * static_cast<uint64_t>(size());
  const Gate& gate = shared_->gate;
  // The poison bit may be set by a peer that already left a later call's first
  // barrier; this barrier completes all the same.
  shared_->signal->wait([&] { return (gate.arrivals.load(std::memory_order_acquire) & ~Gate::kPoisoned) >= need; },
                        [] { return false; }, Clock::time_point::max());
}

bool ThreadsGroup::poison(uint64_t target, const std::string& reason) {
  Gate& gate = shared_->gate;
  const uint64_t need = target * static_cast<uint64_t>(size());
  {
    std::lock_guard<std::mutex> lock(shared_->poison_mutex);
    uint64_t v = gate.arrivals.load(std::memory_order_acquire);
    while (true) {
      // Already poisoned: at this barrier (we leave with the others), or at a later
      // one, which means this one completed.
      if (v & Gate::kPoisoned) return gate.poisoned_at.load(std::memory_order_relaxed) == target;
      if (v >= need) return false;  // completed: every peer may be reading our buffers
      gate.poisoned_at.store(target, std::memory_order_relaxed);
      shared_->poison_reason = reason;
      shared_->poisoned_by = rank_;
      // The decision point: a late arrival either completed the barrier before this
      // (the CAS fails and we stay) or finds the bit and touches nothing.
      if (gate.arrivals.compare_exchange_weak(v, v | Gate::kPoisoned, std::memory_order_acq_rel)) break;
    }
  }
  shared_->signal->notify();
  return true;
}

void ThreadsGroup::throw_poisoned(uint64_t target) const {
  std::string reason;
  int by = -1;
  {
    std::lock_guard<std::mutex> lock(shared_->poison_mutex);
    reason = shared_->poison_reason;
    by = shared_->poisoned_by;
  }
  if (shared_->gate.poisoned_at.load(std::memory_order_relaxed) == target) {
    throw std::runtime_error(detail::concat("[", current_op_, "] released from group '", name_, "' because rank ", by,
                                            " left this call: ", reason));
  }
  throw std::runtime_error(detail::concat("[", current_op_, "] group '", name_, "' (threads, size ", size(),
                                          ", this is rank ", rank_, ") can no longer be used: rank ", by,
                                          " left an earlier call: ", reason));
}

std::string ThreadsGroup::timeout_reason(uint64_t target) const {
  std::vector<int64_t> missing;
  for (int r = 0; r < size(); ++r) {
    if (shared_->slots[r].step.load(std::memory_order_acquire) < target) missing.push_back(r);
  }
  return detail::concat("[", current_op_, "] timed out after ", timeout_.count() / 1000.0, " s in group '", name_,
                        "' (threads, size ", size(), ", this is rank ", rank_, "): ranks ", shape_to_string(missing),
                        launch_ranks(missing), " did not arrive");
}

std::string ThreadsGroup::reason_to_leave(uint64_t target, bool walk_graph) {
  const World& world = *shared_->world;
  if (world.aborted()) {
    return detail::concat("[", current_op_, "] released from group '", name_, "' because ", world.abort_reason());
  }
  const Slot* slots = shared_->slots.get();
  // A missing rank that returned from its launch function, with no async call
  // queued or running on this group, will never arrive. In that order, then the
  // step: a call's arrival is stored before it stops being pending.
  for (int r = 0; r < size(); ++r) {
    if (peer_returned(r) && slots[r].pending_async.load(std::memory_order_seq_cst) == 0 &&
        slots[r].step.load(std::memory_order_acquire) < target) {
      return detail::concat("[", current_op_, "] rank ", r, launch_ranks({r}), " of group '", name_,
                            "' (threads, size ", size(), ", this is rank ", rank_,
                            ") returned from its launch function without making this call: the ranks' calls diverged");
    }
  }
  if (walk_graph) {
    std::string cycle = world.find_deadlock(world_rank());
    if (!cycle.empty()) {
      return detail::concat("[", current_op_, "] deadlock in group '", name_, "' (threads, size ", size(),
                            ", this is rank ", rank_, "): ", cycle, ": the ranks' calls diverged");
    }
  }
  return "";
}

void ThreadsGroup::enter_call() {
  const uint64_t before = arrive();
  const uint64_t target = step_;
  const Gate& gate = shared_->gate;
  if (before & Gate::kPoisoned) throw_poisoned(target);
  const uint64_t need = target * static_cast<uint64_t>(size());
  auto broken = [&](uint64_t v) {
    return (v & Gate::kPoisoned) && gate.poisoned_at.load(std::memory_order_relaxed) == target;
  };
  auto ready = [&] {
    const uint64_t v = gate.arrivals.load(std::memory_order_acquire);
    return (v & ~Gate::kPoisoned) >= need && !broken(v);
  };
  const auto deadline = this->deadline();
  std::string reason;
  // Every check of a waiting rank: flags only (ranks time-sharing a core wait past
  // the spinning on most calls, and must not pay for more each time).
  auto stuck = [&] {
    if (broken(gate.arrivals.load(std::memory_order_acquire))) return true;
    reason = reason_to_leave(target, false);
    return !reason.empty();
  };
  // Once the wait sleeps (half a millisecond in), the rank's own thread publishes
  // what it waits for and walks the wait-for graph, once per sleep slice.
  bool published = false;
  auto slow = [&] {
    if (!on_own_thread()) return false;
    if (!published) shared_->world->block(world_rank(), shared_, target, me().to_string());
    published = true;
    reason = reason_to_leave(target, true);
    return !reason.empty();
  };
  const WaitResult result = shared_->signal->wait(ready, stuck, deadline, slow);
  if (published) shared_->world->unblock(world_rank());
  if (result == WaitResult::Ready) return;
  if (result == WaitResult::TimedOut) reason = timeout_reason(target);
  if (reason.empty()) throw_poisoned(target);  // a peer left first
  if (!poison(target, reason)) return;         // every rank arrived meanwhile: go on
  throw std::runtime_error(reason);
}

void ThreadsGroup::check_same_call() {
  const int n = size();
  std::string mismatch;
  // Buffers on the CPU on some ranks and on a GPU on others (several GPUs are fine).
  for (int r = 1; r < n && mismatch.empty(); ++r) {
    if (peer(r).device.type != peer(0).device.type) {
      mismatch = detail::concat("rank 0 passed tensors on ", peer(0).device.to_string(), ", rank ", r, " on ",
                                peer(r).device.to_string(), " (all ranks' tensors must be on the CPU or all on GPUs)");
    }
  }
  for (int r = 1; r < n && mismatch.empty(); ++r) {
    if (!same_call(peer(0), peer(r))) {
      mismatch = detail::concat("rank 0 called ", peer(0).to_string(), ", rank ", r, " called ", peer(r).to_string());
    }
  }
  // all_to_all: what rank s sends to r must be what r expects from s.
  if (mismatch.empty() && peer(0).kind == CallKind::AllToAll) {
    for (int s = 0; s < n && mismatch.empty(); ++s) {
      for (int r = 0; r < n && mismatch.empty(); ++r) {
        if (peer(s).counts[r] != peer(r).recv_counts[s]) {
          mismatch = detail::concat("rank ", s, " sends ", peer(s).counts[r], " elements to rank ", r,
                                    " which expects ", peer(r).recv_counts[s], "; rank ", s, " called ",
                                    peer(s).to_string(), ", rank ", r, " called ", peer(r).to_string());
        }
      }
    }
  }
  if (mismatch.empty()) return;
  sync();  // every rank saw the same descriptors; let all finish reading them (no abort can cut this short)
  throw std::invalid_argument(
      detail::concat("[", current_op_, "] ranks made different calls in group '", name_, "': ", mismatch));
}

void ThreadsGroup::run_now(const CallDesc& desc, const Algorithm& algorithm) {
  current_op_ = call_kind_name(desc.kind);
  ++calls_;
  shared_->slots[rank_].desc = &desc;
  enter_call();
  // From here on every rank reads every descriptor and buffer until the last barrier.
  check_same_call();
  // An algorithm that throws still ends at the last barrier its peers wait at.
  std::exception_ptr failed;
  try {
    algorithm(*this);
  } catch (...) {
    failed = std::current_exception();
  }
  sync();
  if (failed) std::rethrow_exception(failed);
}

void ThreadsGroup::drain_async() {
  if (!queue_) return;
  queue_->idle.wait([&] { return queue_->outstanding.load(std::memory_order_acquire) == 0; }, [] { return false; },
                    Clock::time_point::max());
}

WorkPtr ThreadsGroup::run(std::shared_ptr<CallDesc> desc, bool async, Algorithm algorithm) {
  note_calling_thread();
  if (!async) {
    // A blocking call runs on the caller's thread, after this rank's queued calls.
    drain_async();
    run_now(*desc, algorithm);
    return nullptr;
  }
  if (!worker_.joinable()) {
    queue_ = std::make_shared<AsyncQueue>();
    const int world_rank = shared_->world_ranks[rank_];
    shared_->world->worker_started(world_rank);
    // Undone if the thread cannot be created, or launch would wait for it forever.
    struct Unstarted {
      World* world;
      int rank;
      ~Unstarted() {
        if (world) world->worker_finished(rank);
      }
    } unstarted{shared_->world.get(), world_rank};
    // Woken when the rank's function ends: a handle to the group may outlive it (and
    // launch waits for the workers), but no more calls can come.
    shared_->world->add_signal(std::shared_ptr<Signal>(queue_, &queue_->work));
    worker_ = std::thread([queue = queue_, world = shared_->world, world_rank] {
      t_on_async_worker = true;
      while (true) {
        queue->work.wait([&] { return queue->queued.load(std::memory_order_acquire) > 0 || queue->stop.load(); },
                         [&] { return world->ended(world_rank); }, Clock::time_point::max());
        std::function<void()> task;
        {
          std::lock_guard<std::mutex> lock(queue->mutex);
          if (queue->tasks.empty()) {  // stopped, or the rank ended, with nothing left to run
            queue->closed = true;
            break;
          }
          task = std::move(queue->tasks.front());
          queue->tasks.pop_front();
          queue->queued.fetch_sub(1);
        }
        task();
        task = nullptr;  // may destroy the group
        if (queue->outstanding.fetch_sub(1) == 1) queue->idle.notify();
      }
      world->worker_finished(world_rank);
    });
    unstarted.world = nullptr;
  }
  auto work = std::make_shared<ThreadsWork>();
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    if (queue_->closed) {
      throw std::runtime_error(detail::concat("[", call_kind_name(desc->kind), "] group '", name_, "' (threads, size ",
                                              size(), ", this is rank ", rank_,
                                              ") takes no more calls: this rank's launch function has ended"));
    }
    queue_->tasks.push_back([self = shared_from_this(), desc, algorithm = std::move(algorithm), work] {
      try {
        self->run_now(*desc, algorithm);
        if (desc->device_call) wait_device_call(*desc->device_call);  // done = the result is on the GPU
        work->finish(nullptr);
      } catch (...) {
        work->finish(std::current_exception());
      }
      self->shared_->slots[self->rank_].pending_async.fetch_sub(1, std::memory_order_seq_cst);
    });
    // Counted only once queued (a failed push leaves nothing for drain_async to await).
    shared_->slots[rank_].pending_async.fetch_add(1, std::memory_order_seq_cst);
    queue_->outstanding.fetch_add(1);
    queue_->queued.fetch_add(1);
  }
  queue_->work.notify();
  return work;
}

void ThreadsGroup::injected_stall() {
  const World& world = *shared_->world;
  const int me = shared_->world_ranks[rank_];
  auto others_gone = [&] {
    for (int r = 0; r < world.size(); ++r) {
      if (r != me && !world.gone(r)) return false;
    }
    return true;
  };
  while (!world.aborted() && !others_gone()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  throw std::runtime_error(detail::concat("[fault] launch rank ", me, " stalled (DTENSOR_FAULT) until ",
                                          world.aborted() ? world.abort_reason() : "every other rank returned"));
}

// ---- ThreadsGroup: split -----------------------------------------------------------

std::shared_ptr<GroupImpl> ThreadsGroup::split(int color, int key) {
  auto desc = std::make_shared<CallDesc>();
  desc->kind = CallKind::Split;
  desc->color = color;
  desc->key = key;
  const int index = splits_++;
  std::string child_name = detail::concat(name_, "/c", color);
  if (index > 0) child_name += detail::concat(".", index);
  std::shared_ptr<GroupImpl> result;
  std::exception_ptr failed;  // kept until the last barrier: peers wait at both
  run(desc, false, [&](ThreadsGroup& g) {
    // Members of my color in new-rank order: by key, then by rank in this group.
    std::vector<int> members;
    for (int r = 0; r < g.size(); ++r) {
      if (color >= 0 && g.peer(r).color == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return g.peer(a).key < g.peer(b).key; });
    const bool leader = !members.empty() && *std::min_element(members.begin(), members.end()) == rank_;
    if (leader) {
      std::shared_ptr<Shared> child;
      try {
        std::vector<int> world_ranks;
        for (int m : members) world_ranks.push_back(shared_->world_ranks[m]);
        child = std::make_shared<Shared>(std::move(world_ranks), shared_->world, child_name);
      } catch (...) {
        failed = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(shared_->split_mutex);
      shared_->split_children[color] = std::move(child);  // null: the members fail too
    }
    g.sync();
    if (!members.empty()) {
      std::shared_ptr<Shared> child;
      {
        std::lock_guard<std::mutex> lock(shared_->split_mutex);
        child = shared_->split_children[color];
      }
      try {
        DT_CHECK_SUPPORTED(child != nullptr, "split", "the leader of color ", color, " could not create the group");
        const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
        auto group = std::make_shared<ThreadsGroup>(std::move(child), new_rank, child_name);
        group->set_timeout(timeout_);
        result = std::move(group);
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    g.sync();
    if (leader) {
      std::lock_guard<std::mutex> lock(shared_->split_mutex);
      shared_->split_children.erase(color);
    }
  });
  if (failed) std::rethrow_exception(failed);
  return result;
}

// ---- ThreadsGroup: collectives ---------------------------------------------------------

namespace {
std::shared_ptr<CallDesc> make_desc(CallKind kind, DType dtype, const void* in, void* out) {
  auto d = std::make_shared<CallDesc>();
  d->kind = kind;
  d->dtype = dtype;
  d->in = in;
  d->out = out;
  // Copied: an async call outlives the scope that named it.
  const CallContext& context = CallContext::current();
  if (!context.user_call.empty()) {
    d->user_call = context.user_call;
    d->purpose = context.purpose;
  }
  d->device = context.device;
  // Recorded on the caller's stream now: an async call's buffers are ready then.
  if (d->device.is_cuda() && kind != CallKind::Barrier) d->device_call = begin_device_call(d->device);
  return d;
}

// The host algorithm, or its CUDA twin for buffers on a GPU.
using AlgorithmFn = void (*)(ThreadsGroup&);
AlgorithmFn pick(const CallDesc& d, AlgorithmFn host, AlgorithmFn device) { return d.device.is_cuda() ? device : host; }
}  // namespace

WorkPtr ThreadsGroup::all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, bool async) {
  auto d = make_desc(CallKind::AllReduce, dtype, in, out);
  d->count = count;
  d->op = op;
  return run(d, async, pick(*d, all_reduce_owner, device_all_reduce));
}

WorkPtr ThreadsGroup::all_gather(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer,
                                 DType dtype, bool async) {
  auto d = make_desc(CallKind::AllGather, dtype, in, out);
  d->counts = counts;
  d->outer = outer;
  return run(d, async, pick(*d, all_gather_direct, device_all_gather));
}

WorkPtr ThreadsGroup::reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer,
                                     DType dtype, ReduceOp op, bool async) {
  auto d = make_desc(CallKind::ReduceScatter, dtype, in, out);
  d->counts = counts;
  d->outer = outer;
  d->op = op;
  return run(d, async, pick(*d, reduce_scatter_direct, device_reduce_scatter));
}

WorkPtr ThreadsGroup::all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                 const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits, bool async) {
  auto d = make_desc(CallKind::AllToAll, dtype, in, out);
  d->counts = send_counts;
  d->recv_counts = recv_counts;
  d->equal_splits = equal_splits;
  return run(d, async, pick(*d, all_to_all_direct, device_all_to_all));
}

void ThreadsGroup::all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                                     DType dtype) {
  auto d = make_desc(CallKind::AllToAll, dtype, in, out);
  for (int s = 0; s < size(); ++s) {
    d->counts.push_back(send.count(s));
    d->recv_counts.push_back(recv.count(s));
  }
  d->send_blocks = &send;
  d->recv_blocks = &recv;
  run(d, false, pick(*d, all_to_all_blocks_direct, device_all_to_all_blocks));
}

WorkPtr ThreadsGroup::broadcast(void* data, int64_t count, DType dtype, int root, bool async) {
  auto d = make_desc(CallKind::Broadcast, dtype, data, data);
  d->count = count;
  d->root = root;
  return run(d, async, pick(*d, broadcast_direct, device_broadcast));
}

WorkPtr ThreadsGroup::gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                             bool async) {
  auto d = make_desc(CallKind::Gather, dtype, in, out);
  d->counts = counts;
  d->root = root;
  return run(d, async, pick(*d, gather_direct, device_gather));
}

WorkPtr ThreadsGroup::scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                              bool async) {
  auto d = make_desc(CallKind::Scatter, dtype, in, out);
  d->counts = counts;
  d->root = root;
  return run(d, async, pick(*d, scatter_direct, device_scatter));
}

WorkPtr ThreadsGroup::barrier(bool async) {
  return run(make_desc(CallKind::Barrier, DType::F32, nullptr, nullptr), async, [](ThreadsGroup&) {});
}

}  // namespace dtensor::comm::threads
