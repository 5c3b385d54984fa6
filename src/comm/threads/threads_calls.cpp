// Matching collective calls across the ranks' threads: the call descriptors, the
// rendezvous at a call's barriers (poisoned by a rank that leaves the first one) and
// the check that every rank made the same call.
#include <sstream>

#include "comm/threads/threads_group.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm::threads {
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

}  // namespace

// ---- CallDesc -----------------------------------------------------------------------

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

// ---- ThreadsGroup: rendezvous --------------------------------------------------------

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

}  // namespace dtensor::comm::threads
