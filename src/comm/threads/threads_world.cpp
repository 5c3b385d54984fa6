// The threads backend's world and why a rank leaves a call: one launch's failure,
// returned ranks and async workers, the state a group's ranks share, and a group's
// errors for an abort, a peer that returned, a deadlock, a timeout or a stall.
#include <chrono>
#include <thread>

#include "comm/threads/p2p.h"
#include "comm/threads/threads_group.h"
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
  std::vector<std::thread> adopted;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // Workers start and finish under the mutex, so the per-rank counts are stable here.
    workers_cv_.wait(lock, [&] {
      for (int r = 0; r < size_; ++r) {
        if (live_workers_[r].load() > 0) return false;
      }
      return true;
    });
    adopted.swap(adopted_);
  }
  // Each has finished its last task; joined, none is left running once launch returns.
  for (std::thread& t : adopted) t.join();
}

World::~World() {
  for (std::thread& t : adopted_) {
    if (t.joinable()) t.detach();
  }
}

void World::adopt(std::thread worker) {
  std::lock_guard<std::mutex> lock(mutex_);
  adopted_.push_back(std::move(worker));
}

// ---- Shared -------------------------------------------------------------------------

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

// ---- ThreadsGroup: leaving a call ---------------------------------------------------

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

}  // namespace dtensor::comm::threads
