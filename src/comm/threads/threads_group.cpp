// The threads backend's group: construction, async calls on a worker thread per rank
// and group, split, and the collectives (a call descriptor and its algorithm each).
// The world and a rank's reasons to leave a call are in threads_world.cpp, the
// rendezvous and call matching in threads_calls.cpp.
#include "comm/threads/threads_group.h"

#include <algorithm>

#include "comm/call_context.h"
#include "comm/threads/algorithms.h"
#include "comm/threads/device_collectives.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm::threads {
namespace {

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

// ---- ThreadsGroup -------------------------------------------------------------------

ThreadsGroup::ThreadsGroup(std::shared_ptr<Shared> shared, int rank, std::string name)
    : shared_(std::move(shared)), rank_(rank) {
  name_ = std::move(name);
}

ThreadsGroup::~ThreadsGroup() {
  if (!worker_.joinable()) return;
  queue_->stop.store(true);
  queue_->work.notify();
  // The last task may hold the last reference, so this can run on the worker itself:
  // launch joins it then (a detached thread could outlive launch).
  if (worker_.get_id() == std::this_thread::get_id()) {
    shared_->world->adopt(std::move(worker_));
  } else {
    worker_.join();
  }
}

bool on_async_worker() { return t_on_async_worker; }

// ---- ThreadsGroup: async execution --------------------------------------------------

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
