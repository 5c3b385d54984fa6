// Pipeline schedules: the generators, the checker and the discrete-event simulator.
#include "dtensor/parallel/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <tuple>

#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

const char* kind_code(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "B";
    case ActionKind::BackwardInput: return "I";
    case ActionKind::BackwardWeight: return "W";
    case ActionKind::SendActivation: return "SEND_F";
    case ActionKind::RecvActivation: return "RECV_F";
    case ActionKind::SendGradient: return "SEND_B";
    case ActionKind::RecvGradient: return "RECV_B";
  }
  return "?";
}

std::string describe(const Schedule& s) {
  return detail::concat(s.name, " (p=", s.ranks, ", m=", s.micro_batches, ", v=", s.virtual_stages(), ")");
}

void check_shape(const char* op, int ranks, int micro_batches, int virtual_stages) {
  DT_CHECK_ARG(ranks >= 1, op, "expected at least 1 pipeline rank, got ", ranks);
  DT_CHECK_ARG(micro_batches >= 1, op, "expected at least 1 micro-batch, got ", micro_batches);
  DT_CHECK_ARG(virtual_stages >= 1, op, "expected at least 1 virtual stage per rank, got ", virtual_stages);
}

Schedule empty_schedule(std::string name, ScheduleKind kind, int ranks, int micro_batches, int virtual_stages) {
  Schedule s;
  s.name = std::move(name);
  s.kind = kind;
  s.ranks = ranks;
  s.stages = ranks * virtual_stages;
  s.micro_batches = micro_batches;
  s.actions.resize(static_cast<size_t>(ranks));
  return s;
}

// Rewrites each rank's compute order with the transfers beside the computes: the
// receive a compute consumes right before it, the send of what it produced right
// after it. Stages on one rank hand over without messages.
void insert_transfers(Schedule& s) {
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<Action> out;
    for (const Action& a : s.actions[static_cast<size_t>(r)]) {
      const bool prev_remote = a.stage > 0 && s.rank_of(a.stage - 1) != r;
      const bool next_remote = a.stage + 1 < s.stages && s.rank_of(a.stage + 1) != r;
      if (a.kind == ActionKind::Forward) {
        if (prev_remote) out.push_back({ActionKind::RecvActivation, a.stage, a.micro});
        out.push_back(a);
        if (next_remote) out.push_back({ActionKind::SendActivation, a.stage, a.micro});
      } else if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) {
        if (next_remote) out.push_back({ActionKind::RecvGradient, a.stage, a.micro});
        out.push_back(a);
        if (prev_remote) out.push_back({ActionKind::SendGradient, a.stage, a.micro});
      } else {
        out.push_back(a);
      }
    }
    s.actions[static_cast<size_t>(r)] = std::move(out);
  }
}

// ---- abstract execution (the checker's proof and the simulator) --------------------------

struct Position {
  int rank = -1;
  size_t index = 0;
};

using ActionKey = std::tuple<int, int, int>;  // kind, stage, micro
ActionKey key_of(const Action& a) { return {static_cast<int>(a.kind), a.stage, a.micro}; }

struct Execution {
  bool finished = false;
  // When stuck: per rank, the index of the action it is blocked at (actions.size() when done).
  std::vector<size_t> stuck_at;
  Timeline timeline;
  std::vector<int> peak_in_flight;
};

// Runs every rank's list in order under the runtime's rules (transfers are posted
// and never block; a compute waits for the sends matching the receives it
// consumes). Assumes the static checks passed (every receive has its send).
Execution execute(const Schedule& s, const ActionCosts& costs) {
  std::map<ActionKey, Position> where;
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) where[key_of(list[i])] = {r, i};
  }
  // Arrival time of each executed send at its receiver.
  std::map<ActionKey, double> arrival;
  Execution ex;
  ex.timeline.ranks = s.ranks;
  ex.timeline.entries.resize(static_cast<size_t>(s.ranks));
  ex.peak_in_flight.assign(static_cast<size_t>(s.ranks), 0);
  std::vector<int> in_flight(static_cast<size_t>(s.ranks), 0);
  std::vector<size_t> pc(static_cast<size_t>(s.ranks), 0);
  std::vector<double> clock(static_cast<size_t>(s.ranks), 0.0);
  // The receive a compute consumes, if it is remote.
  auto consumed = [&](const Action& a) -> std::optional<Action> {
    if (a.kind == ActionKind::Forward && a.stage > 0 && s.rank_of(a.stage - 1) != s.rank_of(a.stage)) {
      return Action{ActionKind::RecvActivation, a.stage, a.micro};
    }
    if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) && a.stage + 1 < s.stages &&
        s.rank_of(a.stage + 1) != s.rank_of(a.stage)) {
      return Action{ActionKind::RecvGradient, a.stage, a.micro};
    }
    return std::nullopt;
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      const auto& list = s.actions[static_cast<size_t>(r)];
      size_t& i = pc[static_cast<size_t>(r)];
      double& t = clock[static_cast<size_t>(r)];
      while (i < list.size()) {
        const Action& a = list[i];
        double start = t;
        if (a.is_compute()) {
          if (const std::optional<Action> recv = consumed(a)) {
            const auto it = arrival.find(key_of(matching_transfer(*recv)));
            if (it == arrival.end()) break;  // blocked: the send is not posted yet
            start = std::max(start, it->second);
          }
        }
        const double end = start + (a.is_compute() ? costs.of(a) : costs.post);
        if (a.is_send()) arrival[key_of(a)] = end + costs.transfer;
        ex.timeline.entries[static_cast<size_t>(r)].push_back({a, start, end});
        int& held = in_flight[static_cast<size_t>(r)];
        if (a.kind == ActionKind::Forward) {
          ++held;
          ex.peak_in_flight[static_cast<size_t>(r)] = std::max(ex.peak_in_flight[static_cast<size_t>(r)], held);
          if (!s.has_backward()) --held;
        } else if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) {
          --held;
        }
        t = end;
        ++i;
        progress = true;
      }
    }
  }
  ex.finished = true;
  for (int r = 0; r < s.ranks; ++r) {
    if (pc[static_cast<size_t>(r)] < s.actions[static_cast<size_t>(r)].size()) ex.finished = false;
  }
  ex.stuck_at = pc;
  return ex;
}

// "rank 0 at 0F2 waits for 1SEND_B1 on rank 1; rank 1 at 1B1 waits for ..." around a
// cycle of the wait-for graph of a stuck execution.
std::string describe_cycle(const Schedule& s, const Execution& ex) {
  auto waits_for = [&](int r) -> std::pair<Action, int> {
    const Action& a = s.actions[static_cast<size_t>(r)][ex.stuck_at[static_cast<size_t>(r)]];
    Action recv = a.kind == ActionKind::Forward ? Action{ActionKind::RecvActivation, a.stage, a.micro}
                                                : Action{ActionKind::RecvGradient, a.stage, a.micro};
    const Action send = matching_transfer(recv);
    return {send, s.rank_of(send.stage)};
  };
  int start = 0;
  while (ex.stuck_at[static_cast<size_t>(start)] >= s.actions[static_cast<size_t>(start)].size()) ++start;
  // Walk until a rank repeats; the cycle starts there.
  std::vector<int> seen_order;
  std::set<int> seen;
  int r = start;
  while (!seen.count(r)) {
    seen.insert(r);
    seen_order.push_back(r);
    r = waits_for(r).second;
  }
  std::ostringstream os;
  const auto first = std::find(seen_order.begin(), seen_order.end(), r);
  for (auto it = first; it != seen_order.end(); ++it) {
    const auto [send, peer] = waits_for(*it);
    os << (it == first ? "" : "; ") << "rank " << *it << " at "
       << s.actions[static_cast<size_t>(*it)][ex.stuck_at[static_cast<size_t>(*it)]].to_string() << " waits for "
       << send.to_string() << " on rank " << peer;
  }
  return os.str();
}

// Everything check_schedule proves before executing.
void check_static(const Schedule& s) {
  const std::string what = describe(s);
  auto fail = [&](const auto&... parts) {
    throw std::invalid_argument(detail::concat("[check_schedule] ", what, ": ", parts...));
  };
  if (s.ranks < 1 || s.micro_batches < 1 || s.stages < s.ranks || s.stages % s.ranks != 0) {
    fail("expected ranks >= 1, micro-batches >= 1 and stages a multiple of the ranks, got ", s.ranks, " ranks, ",
         s.micro_batches, " micro-batches, ", s.stages, " stages");
  }
  if (static_cast<int>(s.actions.size()) != s.ranks) fail("expected one action list per rank, got ", s.actions.size());
  std::map<ActionKey, Position> where;
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (a.stage < 0 || a.stage >= s.stages || a.micro < 0 || a.micro >= s.micro_batches) {
        fail("rank ", r, " has ", a.to_string(), ", outside ", s.stages, " stages and ", s.micro_batches,
             " micro-batches");
      }
      if (s.rank_of(a.stage) != r) fail(a.to_string(), " is on rank ", r, ", its stage runs on rank ", s.rank_of(a.stage));
      if (!where.emplace(key_of(a), Position{r, i}).second) fail(a.to_string(), " appears twice (rank ", r, ")");
      if (a.is_send() || a.is_recv()) {
        const Action peer = matching_transfer(a);
        if (peer.stage < 0 || peer.stage >= s.stages) fail(a.to_string(), " on rank ", r, " has no stage to talk to");
        if (s.rank_of(peer.stage) == r) {
          fail(a.to_string(), ": rank ", r, " would send to itself (stages ", a.stage, " and ", peer.stage,
               " share the rank and hand over without messages)");
        }
      }
    }
  }
  auto index_of = [&](const Action& a) -> std::optional<Position> {
    const auto it = where.find(key_of(a));
    if (it == where.end()) return std::nullopt;
    return it->second;
  };
  // `need` on the same rank before position `at`.
  auto require_before = [&](const Action& need, const Position& at, const Action& user) {
    const std::optional<Position> p = index_of(need);
    if (!p) fail(user.to_string(), " needs ", need.to_string(), ", which no rank runs");
    if (p->rank != at.rank || p->index >= at.index) {
      fail(user.to_string(), " on rank ", at.rank, " comes before ", need.to_string(), ", which it needs");
    }
  };
  const bool split = s.splits_backward();
  for (int st = 0; st < s.stages; ++st) {
    for (int m = 0; m < s.micro_batches; ++m) {
      std::vector<ActionKind> kinds{ActionKind::Forward};
      if (s.has_backward()) {
        if (split) {
          kinds.push_back(ActionKind::BackwardInput);
          kinds.push_back(ActionKind::BackwardWeight);
        } else {
          kinds.push_back(ActionKind::Backward);
        }
      }
      for (ActionKind k : kinds) {
        if (!index_of({k, st, m})) fail("no rank runs ", Action{k, st, m}.to_string());
      }
      for (ActionKind k : {ActionKind::Backward, ActionKind::BackwardInput, ActionKind::BackwardWeight}) {
        if (std::find(kinds.begin(), kinds.end(), k) == kinds.end() && index_of({k, st, m})) {
          fail(Action{k, st, m}.to_string(), " does not belong in this schedule");
        }
      }
    }
  }
  // Dependencies and transfers, rank by rank.
  for (int r = 0; r < s.ranks; ++r) {
    const auto& list = s.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const Position at{r, i};
      const bool prev_local = a.stage > 0 && s.rank_of(a.stage - 1) == r;
      const bool next_local = a.stage + 1 < s.stages && s.rank_of(a.stage + 1) == r;
      const ActionKind backward = split ? ActionKind::BackwardInput : ActionKind::Backward;
      switch (a.kind) {
        case ActionKind::Forward:
          if (a.stage > 0) {
            require_before(prev_local ? Action{ActionKind::Forward, a.stage - 1, a.micro}
                                      : Action{ActionKind::RecvActivation, a.stage, a.micro},
                           at, a);
          }
          break;
        case ActionKind::Backward:
        case ActionKind::BackwardInput:
          require_before({ActionKind::Forward, a.stage, a.micro}, at, a);
          if (a.stage + 1 < s.stages) {
            require_before(next_local ? Action{backward, a.stage + 1, a.micro}
                                      : Action{ActionKind::RecvGradient, a.stage, a.micro},
                           at, a);
          }
          break;
        case ActionKind::BackwardWeight:
          require_before({ActionKind::BackwardInput, a.stage, a.micro}, at, a);
          break;
        case ActionKind::SendActivation:
          require_before({ActionKind::Forward, a.stage, a.micro}, at, a);
          break;
        case ActionKind::SendGradient:
          require_before({backward, a.stage, a.micro}, at, a);
          break;
        case ActionKind::RecvGradient:
          // The buffer takes the shape of the forward's output.
          require_before({ActionKind::Forward, a.stage, a.micro}, at, a);
          break;
        case ActionKind::RecvActivation:
          break;
      }
      if (a.is_send() || a.is_recv()) {
        const Action peer = matching_transfer(a);
        if (!index_of(peer)) {
          fail(a.to_string(), " on rank ", r, " has no matching ", peer.to_string(), " on rank ", s.rank_of(peer.stage));
        }
      }
    }
  }
  // Every transfer a compute needs across ranks is there (a forward or backward whose
  // neighbour stage is remote receives; what it produces for a remote stage is sent).
  for (int st = 0; st < s.stages && s.has_backward(); ++st) {
    for (int m = 0; m < s.micro_batches; ++m) {
      if (st > 0 && s.rank_of(st - 1) != s.rank_of(st) && !index_of({ActionKind::SendGradient, st, m})) {
        fail("stage ", st, " never sends the input gradient of micro-batch ", m, " to stage ", st - 1, " (",
             Action{ActionKind::SendGradient, st, m}.to_string(), ")");
      }
    }
  }
  for (int st = 0; st + 1 < s.stages; ++st) {
    for (int m = 0; m < s.micro_batches; ++m) {
      if (s.rank_of(st + 1) != s.rank_of(st) && !index_of({ActionKind::SendActivation, st, m})) {
        fail("stage ", st, " never sends the output of micro-batch ", m, " to stage ", st + 1, " (",
             Action{ActionKind::SendActivation, st, m}.to_string(), ")");
      }
    }
  }
  // Receives of one channel (sender, receiver, tag) in the order of its sends: the
  // backends match messages of a channel first posted, first matched.
  using Channel = std::tuple<int, int, int>;
  std::map<Channel, std::vector<Action>> sends, recvs;
  for (int r = 0; r < s.ranks; ++r) {
    for (const Action& a : s.actions[static_cast<size_t>(r)]) {
      if (a.is_send()) sends[{r, s.rank_of(matching_transfer(a).stage), message_tag(a)}].push_back(a);
      if (a.is_recv()) recvs[{s.rank_of(matching_transfer(a).stage), r, message_tag(a)}].push_back(a);
    }
  }
  for (const auto& [channel, sent] : sends) {
    const std::vector<Action>& got = recvs[channel];
    for (size_t k = 0; k < sent.size() && k < got.size(); ++k) {
      if (matching_transfer(sent[k]) != got[k]) {
        fail("rank ", std::get<0>(channel), " sends ", sent[k].to_string(), " as message ", k, " with tag ",
             std::get<2>(channel), " to rank ", std::get<1>(channel), ", which takes that message as ",
             got[k].to_string(), " (receives of a channel must come in the order of its sends)");
      }
    }
  }
}

}  // namespace

// ---- actions and kinds ---------------------------------------------------------------------

std::string Action::to_string() const { return detail::concat(stage, kind_code(kind), micro); }

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved";
    case ScheduleKind::ZeroBubble: return "zero-bubble";
    case ScheduleKind::ForwardOnly: return "forward-only";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                         ScheduleKind::ZeroBubble, ScheduleKind::ForwardOnly}) {
    if (name == schedule_kind_name(k)) return k;
  }
  throw std::invalid_argument(detail::concat("[schedule] unknown schedule '", name,
                                             "': expected gpipe, 1f1b, interleaved, zero-bubble or forward-only"));
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = rank; s < stages; s += ranks) out.push_back(s);
  return out;
}

std::string Schedule::to_string() const {
  std::ostringstream os;
  os << describe(*this) << "\n";
  for (int r = 0; r < ranks; ++r) {
    os << "rank " << r << ":";
    for (const Action& a : actions[static_cast<size_t>(r)]) os << " " << a.to_string();
    os << "\n";
  }
  return os.str();
}

int message_tag(const Action& t) {
  switch (t.kind) {
    case ActionKind::SendActivation: return 2 * t.stage;
    case ActionKind::RecvActivation: return 2 * (t.stage - 1);
    case ActionKind::SendGradient: return 2 * (t.stage - 1) + 1;
    case ActionKind::RecvGradient: return 2 * t.stage + 1;
    default: break;
  }
  throw std::invalid_argument(detail::concat("[message_tag] ", t.to_string(), " is not a transfer"));
}

Action matching_transfer(const Action& t) {
  switch (t.kind) {
    case ActionKind::SendActivation: return {ActionKind::RecvActivation, t.stage + 1, t.micro};
    case ActionKind::RecvActivation: return {ActionKind::SendActivation, t.stage - 1, t.micro};
    case ActionKind::SendGradient: return {ActionKind::RecvGradient, t.stage - 1, t.micro};
    case ActionKind::RecvGradient: return {ActionKind::SendGradient, t.stage + 1, t.micro};
    default: break;
  }
  throw std::invalid_argument(detail::concat("[matching_transfer] ", t.to_string(), " is not a transfer"));
}

// ---- generators ----------------------------------------------------------------------------

Schedule gpipe(int ranks, int micro_batches) {
  check_shape("gpipe", ranks, micro_batches, 1);
  Schedule s = empty_schedule("GPipe", ScheduleKind::GPipe, ranks, micro_batches, 1);
  for (int r = 0; r < ranks; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    for (int m = 0; m < micro_batches; ++m) list.push_back({ActionKind::Forward, r, m});
    for (int m = 0; m < micro_batches; ++m) list.push_back({ActionKind::Backward, r, m});
  }
  insert_transfers(s);
  return s;
}

Schedule one_f_one_b(int ranks, int micro_batches) {
  check_shape("one_f_one_b", ranks, micro_batches, 1);
  Schedule s = empty_schedule("1F1B", ScheduleKind::OneFOneB, ranks, micro_batches, 1);
  for (int r = 0; r < ranks; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    const int warmup = std::min(ranks - r - 1, micro_batches);
    int forward = 0, backward = 0;
    while (forward < warmup) list.push_back({ActionKind::Forward, r, forward++});
    while (forward < micro_batches) {
      list.push_back({ActionKind::Forward, r, forward++});
      list.push_back({ActionKind::Backward, r, backward++});
    }
    while (backward < micro_batches) list.push_back({ActionKind::Backward, r, backward++});
  }
  insert_transfers(s);
  return s;
}

Schedule interleaved_1f1b(int ranks, int micro_batches, int virtual_stages) {
  check_shape("interleaved_1f1b", ranks, micro_batches, virtual_stages);
  DT_CHECK_ARG(micro_batches % ranks == 0, "interleaved_1f1b",
               "the micro-batch count must be a multiple of the pipeline ranks (micro-batches go round the ranks "
               "in groups of p), got ", micro_batches, " micro-batches for ", ranks, " ranks; use ",
               std::max(ranks, micro_batches / ranks * ranks), " or ", (micro_batches / ranks + 1) * ranks);
  Schedule s = empty_schedule("Interleaved1F1B", ScheduleKind::Interleaved1F1B, ranks, micro_batches, virtual_stages);
  const int p = ranks, v = virtual_stages, total = micro_batches * virtual_stages;
  // Megatron-LM's order: item k of a rank is micro-batch (k / pv) * p + k % p of chunk
  // (k % pv) / p; backward visits the chunks in reverse.
  auto item = [&](int r, int k, bool forward) {
    int chunk = (k % (p * v)) / p;
    if (!forward) chunk = v - 1 - chunk;
    const int micro = (k / (p * v)) * p + k % p;
    return Action{forward ? ActionKind::Forward : ActionKind::Backward, chunk * p + r, micro};
  };
  for (int r = 0; r < ranks; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    const int warmup = v == 1 ? std::min(p - r - 1, total) : std::min((p - r - 1) * 2 + (v - 1) * p, total);
    int forward = 0, backward = 0;
    while (forward < warmup) list.push_back(item(r, forward++, true));
    while (forward < total) {
      list.push_back(item(r, forward++, true));
      list.push_back(item(r, backward++, false));
    }
    while (backward < total) list.push_back(item(r, backward++, false));
  }
  insert_transfers(s);
  return s;
}

Schedule zero_bubble(int ranks, int micro_batches) {
  check_shape("zero_bubble", ranks, micro_batches, 1);
  Schedule s = empty_schedule("ZeroBubble", ScheduleKind::ZeroBubble, ranks, micro_batches, 1);
  const int p = ranks, m = micro_batches;
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<size_t>(r)];
    int forward = 0, input = 0, weight = 0;
    auto f = [&] { list.push_back({ActionKind::Forward, r, forward++}); };
    auto i = [&] { list.push_back({ActionKind::BackwardInput, r, input++}); };
    auto w = [&] { list.push_back({ActionKind::BackwardWeight, r, weight++}); };
    // Warm-up: p - r forwards (one more than 1F1B's, as the first W waits).
    while (forward < std::min(p - r, m)) f();
    // Rank r defers its first r weight gradients: I F rounds.
    for (int k = std::min(r, m - forward); k > 0; --k) {
      i();
      f();
    }
    // Steady state: one I, one W, one F; then drain.
    while (forward < m) {
      i();
      w();
      f();
    }
    while (input < m) {
      i();
      w();
    }
    while (weight < m) w();
  }
  insert_transfers(s);
  return s;
}

Schedule forward_only(int ranks, int micro_batches) {
  check_shape("forward_only", ranks, micro_batches, 1);
  Schedule s = empty_schedule("ForwardOnly", ScheduleKind::ForwardOnly, ranks, micro_batches, 1);
  for (int r = 0; r < ranks; ++r) {
    for (int m = 0; m < micro_batches; ++m) s.actions[static_cast<size_t>(r)].push_back({ActionKind::Forward, r, m});
  }
  insert_transfers(s);
  return s;
}

Schedule make_schedule(ScheduleKind kind, int ranks, int micro_batches, int virtual_stages) {
  DT_CHECK_ARG(virtual_stages == 1 || kind == ScheduleKind::Interleaved1F1B, "schedule",
               "virtual stages are for the interleaved schedule; ", schedule_kind_name(kind),
               " runs one stage per rank, got ", virtual_stages);
  switch (kind) {
    case ScheduleKind::GPipe: return gpipe(ranks, micro_batches);
    case ScheduleKind::OneFOneB: return one_f_one_b(ranks, micro_batches);
    case ScheduleKind::Interleaved1F1B: return interleaved_1f1b(ranks, micro_batches, virtual_stages);
    case ScheduleKind::ZeroBubble: return zero_bubble(ranks, micro_batches);
    case ScheduleKind::ForwardOnly: return forward_only(ranks, micro_batches);
  }
  throw std::invalid_argument("[schedule] unknown schedule kind");
}

// ---- checker and simulator -----------------------------------------------------------------

ScheduleReport check_schedule(const Schedule& schedule) {
  check_static(schedule);
  ActionCosts unit;
  unit.forward = unit.backward = unit.backward_input = unit.backward_weight = {1.0};
  const Execution ex = execute(schedule, unit);
  if (!ex.finished) {
    throw std::invalid_argument(detail::concat("[check_schedule] ", describe(schedule),
                                               ": no rank can go on, a cycle of waits: ", describe_cycle(schedule, ex)));
  }
  ScheduleReport report;
  report.peak_in_flight = ex.peak_in_flight;
  for (const auto& list : schedule.actions) {
    for (const Action& a : list) report.messages += a.is_send() ? 1 : 0;
  }
  return report;
}

ActionCosts ActionCosts::uniform(double forward, double backward) {
  ActionCosts c;
  c.forward = {forward};
  c.backward = {backward};
  c.backward_input = {backward / 2};
  c.backward_weight = {backward / 2};
  return c;
}

double ActionCosts::of(const Action& a) const {
  auto pick = [&](const std::vector<double>& per_stage, const char* name) {
    DT_CHECK_ARG(!per_stage.empty(), "simulate", "no ", name, " cost given");
    return per_stage.size() == 1 ? per_stage[0] : per_stage.at(static_cast<size_t>(a.stage));
  };
  switch (a.kind) {
    case ActionKind::Forward: return pick(forward, "forward");
    case ActionKind::Backward: return pick(backward, "backward");
    case ActionKind::BackwardInput: return pick(backward_input, "backward_input");
    case ActionKind::BackwardWeight: return pick(backward_weight, "backward_weight");
    default: return post;
  }
}

Timeline simulate(const Schedule& schedule, const ActionCosts& costs) {
  check_static(schedule);
  for (const std::vector<double>* v : {&costs.forward, &costs.backward, &costs.backward_input, &costs.backward_weight}) {
    DT_CHECK_ARG(v->size() == 1 || static_cast<int>(v->size()) == schedule.stages, "simulate",
                 "per-stage costs need one value or one per stage (", schedule.stages, "), got ", v->size());
  }
  Execution ex = execute(schedule, costs);
  if (!ex.finished) {
    throw std::invalid_argument(detail::concat("[simulate] ", describe(schedule),
                                               ": no rank can go on, a cycle of waits: ", describe_cycle(schedule, ex)));
  }
  ex.timeline.title = detail::concat(describe(schedule), ", simulated");
  return ex.timeline;
}

double theoretical_bubble(ScheduleKind kind, int ranks, int micro_batches, int virtual_stages) {
  const double p = ranks, m = micro_batches, v = virtual_stages;
  switch (kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB: return (p - 1) / (m + p - 1);
    case ScheduleKind::Interleaved1F1B: return (p - 1) / (v * m + p - 1);
    case ScheduleKind::ZeroBubble: return (p - 1) / (3 * m + p - 1);
    default: break;
  }
  throw std::invalid_argument(detail::concat("[theoretical_bubble] no textbook formula for ", schedule_kind_name(kind)));
}

}  // namespace dtensor::parallel
