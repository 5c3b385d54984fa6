// The wait-for graph of a launch: which rank's own thread waits, at which group's
// barrier, for which ranks. A rank waiting for a peer that is itself blocked at
// another group's barrier, waiting (perhaps through others) for the first, waits
// forever; World::find_deadlock finds such a cycle so the ranks fail at once with
// both calls named, instead of at the timeout.
//
// A rank b cannot arrive at group G's barrier while its own thread is blocked at
// another barrier and it has no async call queued or running on G (only its own
// thread queues them). The search follows, from the waiting rank, every missing
// peer in that state to the barrier it waits at, and reports a cycle only after
// re-reading that no rank on it changed its blocked record meanwhile: every record
// was then unchanged over a common instant, when all of them were blocked at once.
#include <functional>

#include "comm/threads/threads_group.h"
#include "dtensor/error.h"

namespace dtensor::comm::threads {

void World::block(int rank, const std::shared_ptr<Shared>& group, uint64_t target, std::string call) {
  Blocked& b = blocked_[rank];
  std::lock_guard<std::mutex> lock(b.mutex);
  b.group = group;
  b.target = target;
  b.call = std::move(call);
  b.version.fetch_add(1, std::memory_order_seq_cst);  // now odd
}

void World::unblock(int rank) {
  Blocked& b = blocked_[rank];
  std::lock_guard<std::mutex> lock(b.mutex);
  b.version.fetch_add(1, std::memory_order_seq_cst);  // now even
  b.group.reset();
}

std::string World::find_deadlock(int rank, const Shared& group, uint64_t target) const {
  // One node per rank on the path: where it waits and the record version relied on.
  struct Node {
    int rank;
    std::shared_ptr<Shared> group;  // keeps the peer's group alive while we read it
    const Shared* where;
    uint64_t target, version;
    std::string call;
    int waits_for = -1;  // the next rank on the path
  };
  std::vector<Node> path;
  {
    const Blocked& me = blocked_[rank];
    std::lock_guard<std::mutex> lock(me.mutex);
    const uint64_t version = me.version.load(std::memory_order_acquire);
    if (version % 2 == 0) return "";  // not published yet
    path.push_back({rank, nullptr, &group, target, version, me.call});
  }
  // Depth-first: returns the index on `path` where a cycle closes, or -1.
  std::function<int()> search = [&]() -> int {
    if (static_cast<int>(path.size()) > size_) return -1;
    const Node node = path.back();
    const Shared& g = *node.where;
    for (int i = 0; i < g.size; ++i) {
      const int peer = g.world_ranks[i];
      if (peer == node.rank) continue;
      Node next{peer, nullptr, nullptr, 0, 0, "", -1};
      {
        const Blocked& b = blocked_[peer];
        std::lock_guard<std::mutex> lock(b.mutex);
        next.version = b.version.load(std::memory_order_acquire);
        if (next.version % 2 == 0) continue;  // running: it may still arrive
        next.group = b.group.lock();
        next.target = b.target;
        next.call = b.call;
      }
      if (!next.group || next.group.get() == &g) continue;
      next.where = next.group.get();
      // Read after the record: blocked elsewhere before this read, not arrived here.
      if (g.slots[i].step.load(std::memory_order_acquire) >= node.target) continue;
      if (g.slots[i].pending_async.load(std::memory_order_seq_cst) > 0) continue;  // its worker may come
      path.back().waits_for = peer;
      for (size_t k = 0; k < path.size(); ++k) {
        if (path[k].rank == peer) return static_cast<int>(k);
      }
      path.push_back(std::move(next));
      if (const int closed = search(); closed >= 0) return closed;
      path.pop_back();
    }
    return -1;
  };
  const int closed = search();
  if (closed < 0) return "";
  for (const Node& n : path) {
    if (blocked_[n.rank].version.load(std::memory_order_seq_cst) != n.version) return "";
  }
  std::string text;
  for (size_t k = 0; k < path.size(); ++k) {
    const Node& n = path[k];
    text += detail::concat(k == 0 ? "" : ", which ", k == 0 ? "launch rank " : "", k == 0 ? std::to_string(n.rank) + " " : "",
                           "waits in group '", n.where->name, "' in ", n.call, " for launch rank ", n.waits_for);
  }
  if (closed > 0) text += detail::concat(" (a cycle from launch rank ", path[closed].rank, " on)");
  return text;
}

}  // namespace dtensor::comm::threads
