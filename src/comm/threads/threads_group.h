// The threads backend: ranks are threads of one process and collectives read and
// write each other's buffers directly (no serialisation, no staging copies).
//
// Every collective is a rendezvous: each rank publishes a CallDesc (what it called,
// where its buffers are) in its slot and arrives at a barrier; after it every rank
// checks that all ranks made the same call, then runs the same algorithm (one file
// per algorithm in this folder) on the peers' descriptors, with barriers between
// phases and one at the end so no rank reuses a buffer a peer still reads.
//
// Faults: a rank may leave only the first barrier of a call (abort, timeout, a peer
// that returned, a deadlock), before any peer touched its buffers, and only by
// poisoning the group in the same atomic word that counts arrivals; a late peer then
// sees the poison and touches nothing. Once the first barrier is passed every rank
// finishes the call, so no buffer or descriptor is freed while a peer uses it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_backend.h"
#include "comm/threads/signal.h"
#include "dtensor/device.h"

namespace dtensor::comm::threads {

struct Shared;
struct P2PRequest;
struct DeviceCall;  // device_collectives.h

// One `launch`: the first failure, the ranks that are done, what each rank's own
// thread waits for, and everything to wake when one of them changes.
class World {
 public:
  explicit World(int size);
  // A worker adopted after launch's last wait (none should be) is let go, not joined.
  ~World();
  void abort(int rank, const std::string& message);  // keeps the first failure
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }
  std::string abort_reason() const;  // "rank 2 failed: <message>"
  void add_signal(const std::shared_ptr<Signal>& signal);
  int size() const { return size_; }

  // A rank whose function returned normally (a failed ASSERT_* returns too). Its
  // thread posts no more sends or receives and starts no more calls; only its async
  // calls already queued can still arrive (each group's pending_async counts them),
  // and its workers end once their queues are empty. Peers waiting for it fail at
  // once instead of at the timeout (ranks whose control flow diverged).
  void rank_returned(int rank);
  bool returned(int rank) const { return returned_[rank].load(); }
  // A rank whose function ended, returning or throwing (after abort()): its async
  // workers end once their queues are empty, though handles to its groups may
  // outlive it (launch waits for the workers).
  void rank_ended(int rank);
  bool ended(int rank) const { return ended_[rank].load(); }
  bool gone(int rank) const {
    return returned_[rank].load() && live_workers_[rank].load() == 0;
  }

  // Async workers of every rank; launch waits for them before returning.
  void worker_started(int rank);
  void worker_finished(int rank);
  // Waits until every worker finished, then joins the adopted ones.
  void wait_for_workers();
  // A worker whose group was destroyed on the worker itself (its last task held the
  // last reference), so it cannot join itself: wait_for_workers joins it.
  void adopt(std::thread worker);

  // ---- the wait-for graph (wait_graph.cpp) ----------------------------------------
  // A rank's own thread (the one launch started) waiting at the first barrier of a
  // call, or for a send or receive of its own to be matched, publishes that here
  // while it waits (after its first half millisecond: fast waits publish nothing).
  void block(int rank, const std::shared_ptr<Shared>& group, uint64_t target, std::string call);
  void block_p2p(int rank, const std::shared_ptr<Shared>& group, const std::shared_ptr<P2PRequest>& request,
                 std::string call);
  void unblock(int rank);
  // When `rank`, blocked as it published, is part of a cycle of ranks each waiting
  // for the next (at a barrier the next has not reached, or for a send or receive
  // the next has not posted), the cycle ("launch rank 0 waits in group 'world' in
  // all_reduce(...) for launch rank 1, which waits in ..."), else "". Never a false
  // alarm: every rank on the cycle is re-checked to have been blocked throughout.
  std::string find_deadlock(int rank) const;
  // A thread other than a rank's own and its async workers communicated for it: the
  // graph no longer trusts that the rank's own thread, blocked, cannot arrive.
  void communicates_from_other_threads(int rank) { helper_threads_[rank].store(true, std::memory_order_relaxed); }

 private:
  void wake_all();
  struct Blocked {
    mutable std::mutex mutex;
    std::atomic<uint64_t> version{0};  // odd while blocked
    std::weak_ptr<Shared> group;
    uint64_t target = 0;                  // a barrier of `group`, or
    std::weak_ptr<P2PRequest> request;    // a send or receive posted in it
    std::string call;
  };
  void publish(int rank, const std::shared_ptr<Shared>& group, uint64_t target,
               const std::shared_ptr<P2PRequest>& request, std::string call);
  const int size_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<std::atomic<bool>[]> returned_, ended_;
  std::unique_ptr<std::atomic<bool>[]> helper_threads_;
  std::unique_ptr<std::atomic<int>[]> live_workers_;
  std::unique_ptr<Blocked[]> blocked_;
  mutable std::mutex mutex_;
  std::string reason_;
  std::vector<std::weak_ptr<Signal>> signals_;
  std::vector<std::thread> adopted_;
  std::condition_variable workers_cv_;
};

// What one rank called, published to its peers for the duration of the call.
struct CallDesc {
  CallKind kind = CallKind::Barrier;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  int64_t count = 0;  // elements of `in` (all_reduce, broadcast) or this rank's share
  int64_t outer = 1;
  const void* in = nullptr;
  void* out = nullptr;
  // Owned (not pointers to the caller's arguments) so async calls can outlive them.
  std::vector<int64_t> counts;       // per rank (send counts for all_to_all)
  std::vector<int64_t> recv_counts;  // all_to_all
  bool equal_splits = false;         // all_to_all: called without split sizes
  // all_to_all_blocks: where the pieces lie (the caller's, alive during the call).
  const BlockLayout* send_blocks = nullptr;
  const BlockLayout* recv_blocks = nullptr;
  int color = 0, key = 0;                             // split
  // Where the buffers lie (CPU, or a GPU: then device_call holds the rank's stream
  // and events for the call, device_collectives.h).
  Device device = Device::cpu();
  std::shared_ptr<DeviceCall> device_call;
  // The user-level call this one serves, when it is not the call itself
  // ("redistribute S(0)->R"), and its part in it ("size exchange"); call_context.h.
  std::string user_call, purpose;
  // "all_reduce(f32, 1024 elements, sum)", or with a user-level call:
  // "all_gather (its size exchange: all_gather(i64, counts [1, 1]))".
  std::string to_string() const;
};

struct alignas(64) Slot {
  std::atomic<uint64_t> step{0};  // the last barrier this rank arrived at
  const CallDesc* desc = nullptr;
  // Async calls of this rank queued or running on this group (the wait-for graph:
  // a rank with none, blocked elsewhere, cannot arrive here).
  std::atomic<int> pending_async{0};
};

// Arrivals at a group's barriers, all calls together: barrier k (every rank's k-th)
// is complete once `arrivals` counts k * size. The top bit poisons the group.
struct alignas(64) Gate {
  static constexpr uint64_t kPoisoned = uint64_t{1} << 63;
  std::atomic<uint64_t> arrivals{0};
  std::atomic<uint64_t> poisoned_at{0};  // the barrier a leaver left (written before the bit)
};

class Mailbox;      // point-to-point matching, p2p.h
struct P2PRequest;

// State shared by the ranks of one group.
struct Shared {
  Shared(std::vector<int> world_ranks, std::shared_ptr<World> world, std::string name);
  ~Shared();
  const int size;
  const std::shared_ptr<World> world;
  const std::vector<int> world_ranks;  // of each rank of this group, in the launch
  const std::string name;
  std::unique_ptr<Slot[]> slots;
  Gate gate;
  std::mutex poison_mutex;
  std::string poison_reason;  // the leaver's error, under poison_mutex
  int poisoned_by = -1;
  std::shared_ptr<Signal> signal = std::make_shared<Signal>();
  std::vector<std::unique_ptr<Mailbox>> mailboxes;  // one per receiving rank
  std::mutex split_mutex;
  std::map<int, std::shared_ptr<Shared>> split_children;  // color -> group being made
};

// Runs async collectives of one rank and group in order, on a thread of its own.
// The worker and drain_async wait through Signals (spin, yield, then sleep; see
// signal.h): a collective issued soon after the previous one starts within
// microseconds instead of after a sleeping thread's wake-up (36 -> 9 us for a
// tiny async all-reduce and its wait).
struct AsyncQueue {
  std::mutex mutex;  // guards tasks
  std::deque<std::function<void()>> tasks;
  std::atomic<int> queued{0};       // tasks in the deque
  std::atomic<int> outstanding{0};  // queued or running
  std::atomic<bool> stop{false};
  bool closed = false;  // under mutex: the worker ended (its rank returned), no more tasks
  Signal work;  // the worker waits here for tasks (or stop, or its rank returning)
  Signal idle;  // drain_async waits here for outstanding == 0
};

class ThreadsGroup final : public GroupImpl, public std::enable_shared_from_this<ThreadsGroup> {
 public:
  ThreadsGroup(std::shared_ptr<Shared> shared, int rank, std::string name);
  ~ThreadsGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  std::string backend() const override { return "threads"; }
  std::vector<int> world_ranks() const override { return shared_->world_ranks; }
  std::string failure() const override {
    return shared_->world->aborted() ? shared_->world->abort_reason() : std::string();
  }
  bool accepts_cuda_buffers() const override { return true; }
  std::shared_ptr<GroupImpl> split(int color, int key) override;

  WorkPtr all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                     bool async) override;
  WorkPtr all_gather(const void* in, void* out, const std::vector<int64_t>& counts,
                     int64_t outer, DType dtype, bool async) override;
  WorkPtr reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts,
                         int64_t outer, DType dtype, ReduceOp op, bool async) override;
  WorkPtr all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                     const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits,
                     bool async) override;
  void all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                         DType dtype) override;
  WorkPtr broadcast(void* data, int64_t count, DType dtype, int root, bool async) override;
  WorkPtr gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                 int root, bool async) override;
  WorkPtr scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype,
                  int root, bool async) override;
  WorkPtr barrier(bool async) override;
  WorkPtr send_recv(const std::vector<P2PBuffer>& ops) override;

  // ---- what the algorithms see during a call --------------------------------------
  const CallDesc& me() const { return *shared_->slots[rank_].desc; }
  const CallDesc& peer(int r) const { return *shared_->slots[r].desc; }
  // A barrier inside a call: every rank that passed the call's first barrier reaches
  // it, so it waits without timeout (algorithms must not throw between barriers).
  void sync();
  Shared& shared() { return *shared_; }
  const std::shared_ptr<Shared>& shared_ptr() const { return shared_; }
  // Throws the launch's failure if there is one (p2p waits use it too).
  void throw_if_aborted(const char* op) const;
  // Whether rank r of this group returned from its launch function (it posts no
  // more sends or receives).
  bool peer_returned(int r) const { return shared_->world->returned(shared_->world_ranks[r]); }
  // Its launch rank, and whether the calling thread is that rank's own (launch's).
  int world_rank() const { return shared_->world_ranks[rank_]; }
  bool on_own_thread() const;
  // Marks the rank when a thread of its own communicates (wait_graph.cpp).
  void note_calling_thread() const;
  [[noreturn]] void throw_peer_gone(const char* op, int r) const;
  // " (launch ranks [3, 5])" for these ranks of a sub-group, "" in the launch's world.
  std::string launch_ranks(const std::vector<int64_t>& ranks) const;
  [[noreturn]] void throw_timeout(const char* op, const std::string& missing) const;
  // The fault-injection stall (fault_injection.h): until the launch fails or every
  // other rank has returned.
  void injected_stall() override;

 private:
  using Algorithm = std::function<void(ThreadsGroup&)>;
  // Publishes desc, checks every rank made the same call, runs the algorithm.
  WorkPtr run(std::shared_ptr<CallDesc> desc, bool async, Algorithm algorithm);
  void run_now(const CallDesc& desc, const Algorithm& algorithm);
  // Counts this rank in at the next barrier; returns the arrivals before it.
  uint64_t arrive();
  // The first barrier of a call: the only one a rank may leave early (throwing),
  // by poisoning the group. Returns once every rank arrived.
  void enter_call();
  // Why this rank cannot wait any longer at `target` (an abort, a peer that returned,
  // with `walk_graph` a deadlock through the wait-for graph), "" if it can.
  std::string reason_to_leave(uint64_t target, bool walk_graph);
  std::string timeout_reason(uint64_t target) const;
  // Poisons the group at `target` with `reason`; false if the barrier completed first
  // (the call then goes on).
  bool poison(uint64_t target, const std::string& reason);
  [[noreturn]] void throw_poisoned(uint64_t target) const;
  void check_same_call();
  void drain_async();

  std::shared_ptr<Shared> shared_;
  const int rank_;
  uint64_t step_ = 0;
  uint64_t calls_ = 0;  // collectives this rank made on the group (for messages)
  int splits_ = 0;
  const char* current_op_ = "";
  std::shared_ptr<AsyncQueue> queue_;
  std::thread worker_;
};

// Whether this thread is an async worker.
bool on_async_worker();
// Marks the calling thread as rank `rank` of `world`'s own thread (launch does, for
// the wait-for graph) for the scope's lifetime.
class RankThreadScope {
 public:
  RankThreadScope(const World* world, int rank);
  ~RankThreadScope();
  RankThreadScope(const RankThreadScope&) = delete;
  RankThreadScope& operator=(const RankThreadScope&) = delete;
};

// Makes the group of all ranks of a new launch.
std::shared_ptr<Shared> make_world(std::shared_ptr<World> world, int size);

}  // namespace dtensor::comm::threads
