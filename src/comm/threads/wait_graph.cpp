// The wait-for graph of a launch: which rank's own thread waits, at which group's
// barrier for which ranks, or for which rank to post the send or receive that
// matches one of its own. A rank waiting for a peer that is itself blocked,
// waiting (perhaps through others) for the first, waits forever; World::find_deadlock
// finds such a cycle so the ranks fail at once with every call named, instead of
// at the timeout.
//
// A rank b cannot arrive at group G's barrier while its own thread is blocked and
// it has no async call queued or running on G (only its own thread queues them),
// and cannot post a send or receive while its own thread is blocked (only that
// thread posts: a rank that communicates from threads of its own is left out of
// the graph once seen doing so). The search follows, from the waiting rank, every
// peer in that state (missing at the barrier, or the partner of a request still
// unmatched) to where it waits, and reports a cycle only after re-reading that no
// rank on it changed its blocked record meanwhile: every record was then
// unchanged over a common instant, when all of them were blocked at once.
#include <functional>

#include "comm/threads/p2p.h"
#include "comm/threads/threads_group.h"
#include "dtensor/error.h"

namespace dtensor::comm::threads {

void World::publish(int rank, const std::shared_ptr<Shared>& group, uint64_t target,
                    const std::shared_ptr<P2PRequest>& request, std::string call) {
  Blocked& b = blocked_[rank];
  std::lock_guard<std::mutex> lock(b.mutex);
  b.group = group;
  b.target = target;
  b.request = request;
  b.call = std::move(call);
  b.version.fetch_add(1, std::memory_order_seq_cst);  // now odd
}

void World::block(int rank, const std::shared_ptr<Shared>& group, uint64_t target, std::string call) {
  publish(rank, group, target, nullptr, std::move(call));
}

void World::block_p2p(int rank, const std::shared_ptr<Shared>& group, const std::shared_ptr<P2PRequest>& request,
                      std::string call) {
  publish(rank, group, 0, request, std::move(call));
}

void World::unblock(int rank) {
  Blocked& b = blocked_[rank];
  std::lock_guard<std::mutex> lock(b.mutex);
  b.version.fetch_add(1, std::memory_order_seq_cst);  // now even
  b.group.reset();
  b.request.reset();
}

namespace {
thread_local const World* t_rank_world = nullptr;
thread_local int t_rank = -1;
}  // namespace

RankThreadScope::RankThreadScope(const World* world, int rank) {
  t_rank_world = world;
  t_rank = rank;
}

RankThreadScope::~RankThreadScope() {
  t_rank_world = nullptr;
  t_rank = -1;
}

bool ThreadsGroup::on_own_thread() const { return t_rank_world == shared_->world.get() && t_rank == world_rank(); }

void ThreadsGroup::note_calling_thread() const {
  if (!on_own_thread() && !on_async_worker()) shared_->world->communicates_from_other_threads(world_rank());
}

std::string World::find_deadlock(int rank) const {
  // One node per rank on the path: where it waits and the record version relied on.
  struct Node {
    int rank = -1;
    std::shared_ptr<Shared> group;  // keeps the group alive while we read it
    std::shared_ptr<P2PRequest> request;
    uint64_t target = 0, version = 0;
    std::string call;
    int waits_for = -1;  // the next rank on the path
  };
  // The record of a blocked rank, or false if it is running (it may still arrive or post).
  auto read = [&](int r, Node& node) {
    if (helper_threads_[r].load(std::memory_order_relaxed)) return false;
    const Blocked& b = blocked_[r];
    std::lock_guard<std::mutex> lock(b.mutex);
    node.rank = r;
    node.version = b.version.load(std::memory_order_acquire);
    if (node.version % 2 == 0) return false;
    node.group = b.group.lock();
    node.request = b.request.lock();
    node.target = b.target;
    node.call = b.call;
    return node.group != nullptr;
  };
  std::vector<Node> path(1);
  if (!read(rank, path[0])) return "";  // not published yet
  // Depth-first: returns the index on `path` where a cycle closes, or -1.
  std::function<int()> search = [&]() -> int {
    if (static_cast<int>(path.size()) > size_) return -1;
    const Node node = path.back();
    const Shared& g = *node.group;
    // The edge to `next` (read before what made it an edge), then on from there.
    auto follow = [&](Node next) -> int {
      path.back().waits_for = next.rank;
      for (size_t k = 0; k < path.size(); ++k) {
        if (path[k].rank == next.rank) return path[k].version == next.version ? static_cast<int>(k) : -1;
      }
      path.push_back(std::move(next));
      if (const int closed = search(); closed >= 0) return closed;
      path.pop_back();
      return -1;
    };
    if (node.request) {
      // Waiting for the partner to post the request's match: an edge while the
      // request is unmatched, read after the partner's record (a match it posted
      // before it blocked shows here).
      Node next;
      if (!read(g.world_ranks[node.request->buffer.peer], next)) return -1;
      if (node.request->done.load(std::memory_order_acquire)) return -1;
      return follow(std::move(next));
    }
    for (int i = 0; i < g.size; ++i) {
      const int peer = g.world_ranks[i];
      if (peer == node.rank) continue;
      Node next;
      if (!read(peer, next)) continue;
      // Blocked at a barrier of this group: it arrived here (at this or a later barrier).
      if (!next.request && next.group.get() == &g) continue;
      // Read after the record: blocked elsewhere before this read, not arrived here.
      if (g.slots[i].step.load(std::memory_order_acquire) >= node.target) continue;
      if (g.slots[i].pending_async.load(std::memory_order_seq_cst) > 0) continue;  // its worker may come
      if (const int closed = follow(std::move(next)); closed >= 0) return closed;
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
                           "waits in group '", n.group->name, "' in ", n.call, " for launch rank ", n.waits_for);
  }
  if (closed > 0) text += detail::concat(" (a cycle from launch rank ", path[closed].rank, " on)");
  return text;
}

}  // namespace dtensor::comm::threads
