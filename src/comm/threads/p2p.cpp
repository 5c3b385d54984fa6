// send/recv and batches of them on the threads backend (see p2p.h).
#include "comm/threads/p2p.h"

#include <algorithm>
#include <cstring>

#include "comm/call_context.h"
#include "comm/threads/device_collectives.h"
#include "comm/threads/threads_group.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm::threads {
namespace {

// "16 bytes of f32" (", on cuda:0" for a GPU buffer).
std::string describe_buffer(const P2PBuffer& b) {
  return detail::concat(b.bytes, " bytes of ", dtype_name(b.dtype),
                        b.device.is_cuda() ? ", on " + b.device.to_string() : std::string());
}

// Copies the matched pair and releases both posters.
void complete(P2PRequest& send, P2PRequest& recv) {
  const P2PBuffer &from = send.buffer, &to = recv.buffer;
  std::string error;
  bool device_failure = false;
  if (from.bytes != to.bytes || from.dtype != to.dtype || from.device.is_cuda() != to.device.is_cuda()) {
    error = detail::concat("rank ", send.owner, " sent ", describe_buffer(from), " with tag ", from.tag, " to rank ",
                           recv.owner, ", which posted a recv of ", describe_buffer(to),
                           from.device.is_cuda() != to.device.is_cuda()
                               ? " (send/recv does not copy between the CPU and a GPU: move one with to(Device))"
                               : "");
  } else if (from.device.is_cuda()) {
    // Queued, never thrown: the partner waits for `done` whatever happens here.
    try {
      device_p2p_copy(*send.device_call, *recv.device_call, to.data, from.data, static_cast<size_t>(from.bytes));
    } catch (const std::exception& e) {
      error = e.what();
      device_failure = true;
    }
  } else if (from.bytes > 0) {
    std::memcpy(to.data, from.data, static_cast<size_t>(from.bytes));
  }
  for (P2PRequest* r : {&send, &recv}) {
    r->error = error;
    r->device_failure = device_failure;
  }
  send.done.store(true, std::memory_order_seq_cst);
  recv.done.store(true, std::memory_order_seq_cst);
  send.signal->notify();
  recv.signal->notify();
}

// Finds (and removes) the oldest request in `queue` between `sender` and
// `receiver` with `tag`: the FIFO order of MPI's matching rule.
std::shared_ptr<P2PRequest> take_match(std::deque<std::shared_ptr<P2PRequest>>& queue, int sender, int receiver,
                                       int tag) {
  for (auto it = queue.begin(); it != queue.end(); ++it) {
    const P2PRequest& r = **it;
    const int from = r.buffer.is_send ? r.owner : r.buffer.peer;
    const int to = r.buffer.is_send ? r.buffer.peer : r.owner;
    if (from == sender && to == receiver && r.buffer.tag == tag) {
      auto found = *it;
      queue.erase(it);
      return found;
    }
  }
  return nullptr;
}

class P2PWork final : public WorkImpl {
 public:
  P2PWork(std::shared_ptr<ThreadsGroup> group) : group_(std::move(group)) {}
  std::vector<std::shared_ptr<P2PRequest>> requests;

  // Matched, and (CUDA) the copy has run on the GPU.
  bool is_completed() override {
    for (auto& r : requests) {
      if (!r->done.load(std::memory_order_acquire)) return false;
      if (r->device_call && r->error.empty() && !device_call_finished(*r->device_call)) return false;
    }
    return true;
  }

  void wait() override {
    const auto deadline = group_->deadline();
    World& world = *group_->shared().world;
    for (auto& r : requests) {
      const char* op = r->buffer.is_send ? "send" : "recv";
      auto matched = [&] { return r->done.load(std::memory_order_acquire); };
      // A partner that returned from its launch function never posts; another request
      // of the batch that met a mismatched partner fails the batch now.
      auto stuck = [&] {
        return world.aborted() || failed() != nullptr || (group_->peer_returned(r->buffer.peer) && !matched());
      };
      // Once the wait sleeps, the rank's own thread publishes it and walks the
      // wait-for graph, once per sleep slice.
      std::string deadlock;
      bool published = false;
      auto slow = [&] {
        if (!group_->on_own_thread()) return false;
        if (!published) world.block_p2p(group_->world_rank(), group_->shared_ptr(), r, describe(*r));
        published = true;
        deadlock = world.find_deadlock(group_->world_rank());
        return !deadlock.empty();
      };
      const WaitResult result = r->signal->wait(matched, stuck, deadline, slow);
      if (published) world.unblock(group_->world_rank());
      if (result != WaitResult::Ready || !r->error.empty()) {
        const bool withdrew = withdraw_unmatched();
        if (const P2PRequest* bad = failed()) {
          const char* bad_op = bad->buffer.is_send ? "send" : "recv";
          if (bad->device_failure) throw std::runtime_error(detail::concat("[", bad_op, "] ", bad->error));
          DT_CHECK_ARG(false, bad_op, bad->error);
        }
        if (withdrew) {
          group_->throw_if_aborted(op);
          if (!deadlock.empty()) {
            throw std::runtime_error(detail::concat("[", op, "] deadlock in group '", group_->name(),
                                                    "' (threads, size ", group_->size(), ", this is rank ",
                                                    group_->rank(), "): ", deadlock, ": the ranks' calls diverged"));
          }
          if (result == WaitResult::Aborted) group_->throw_peer_gone(op, r->buffer.peer);
          group_->throw_timeout(op, detail::concat(r->buffer.is_send ? "rank " : "no send from rank ", r->buffer.peer,
                                                   group_->launch_ranks({r->buffer.peer}),
                                                   r->buffer.is_send ? " did not receive " : " for ", r->buffer.bytes,
                                                   " bytes with tag ", r->buffer.tag));
        }
      }
    }
  }

  void retain(std::shared_ptr<void> buffers) override {
    for (auto& r : requests) r->buffers = buffers;
  }

 private:
  // Takes every request of the batch that no partner has matched out of its
  // mailbox and waits for the matched ones to finish copying. True if any was
  // taken back (the batch failed); false if all turned out to be matched.
  bool withdraw_unmatched() {
    bool withdrew = false;
    for (auto& r : requests) {
      if (r->done.load(std::memory_order_acquire)) continue;
      const int receiver = r->buffer.is_send ? r->buffer.peer : r->owner;
      Mailbox& box = *group_->shared().mailboxes[receiver];
      bool taken = false;
      {
        std::lock_guard<std::mutex> lock(box.mutex);
        auto& queue = r->buffer.is_send ? box.sends : box.recvs;
        auto it = std::find(queue.begin(), queue.end(), r);
        if (it != queue.end()) {
          queue.erase(it);
          taken = true;
        }
      }
      if (taken) {
        withdrew = true;
        continue;
      }
      // Matched: the partner is copying and sets `done` right after.
      r->signal->wait([&] { return r->done.load(std::memory_order_acquire); }, [] { return false; },
                      Clock::time_point::max());
    }
    return withdrew;
  }

  // The first request of the batch whose partner disagreed about its size or dtype.
  const P2PRequest* failed() const {
    for (const auto& r : requests) {
      if (r->done.load(std::memory_order_acquire) && !r->error.empty()) return r.get();
    }
    return nullptr;
  }

  // "recv(16 bytes of f32 from rank 1, tag 5)", after the user-level call it serves.
  static std::string describe(const P2PRequest& r) {
    std::string call =
        detail::concat(r.buffer.is_send ? "send(" : "recv(", describe_buffer(r.buffer),
                       r.buffer.is_send ? " to rank " : " from rank ", r.buffer.peer, ", tag ", r.buffer.tag, ")");
    return r.user_call.empty() ? call : detail::concat(r.user_call, " (its ", call, ")");
  }

  std::shared_ptr<ThreadsGroup> group_;
};

}  // namespace

WorkPtr ThreadsGroup::send_recv(const std::vector<P2PBuffer>& ops) {
  note_calling_thread();
  auto work = std::make_shared<P2PWork>(shared_from_this());
  const std::string_view user_call = CallContext::current().user_call;
  // Every request is made (a CUDA one records `ready` on this rank's stream, which
  // may throw) before any is posted: a batch is posted whole or not at all.
  for (const P2PBuffer& op : ops) {
    auto request = std::make_shared<P2PRequest>();
    request->buffer = op;
    request->owner = rank_;
    request->signal = shared_->mailboxes[rank_]->signal;
    if (!user_call.empty()) request->user_call = user_call;
    if (op.device.is_cuda()) request->device_call = begin_device_call(op.device);
    work->requests.push_back(request);
  }
  for (const std::shared_ptr<P2PRequest>& request : work->requests) {
    const P2PBuffer& op = request->buffer;
    // Both queues of a pair live in the receiver's mailbox, under its lock.
    const int receiver = op.is_send ? op.peer : rank_;
    Mailbox& box = *shared_->mailboxes[receiver];
    std::shared_ptr<P2PRequest> partner;
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      if (op.is_send) {
        partner = take_match(box.recvs, rank_, op.peer, op.tag);
        if (!partner) box.sends.push_back(request);
      } else {
        partner = take_match(box.sends, op.peer, rank_, op.tag);
        if (!partner) box.recvs.push_back(request);
      }
    }
    // The copy happens outside the lock so other pairs keep matching meanwhile.
    if (partner) {
      op.is_send ? complete(*request, *partner) : complete(*partner, *request);
    }
  }
  return work;
}

}  // namespace dtensor::comm::threads
