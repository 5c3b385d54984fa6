// The schedule checker: the static checks of a schedule's lists, then the proof by
// abstract execution (pipeline_simulate.cpp) that every rank runs to the end.
#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "dtensor/error.h"
#include "dtensor/parallel/pipeline_schedule.h"
#include "parallel/pipeline_execution.h"
#include "util/check.h"

namespace dtensor::parallel {

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
      if (s.rank_of(a.stage) != r)
        fail(a.to_string(), " is on rank ", r, ", its stage runs on rank ", s.rank_of(a.stage));
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
        case ActionKind::BackwardWeight: require_before({ActionKind::BackwardInput, a.stage, a.micro}, at, a); break;
        case ActionKind::SendActivation: require_before({ActionKind::Forward, a.stage, a.micro}, at, a); break;
        case ActionKind::SendGradient: require_before({backward, a.stage, a.micro}, at, a); break;
        case ActionKind::RecvGradient:
          // The buffer takes the shape of the forward's output.
          require_before({ActionKind::Forward, a.stage, a.micro}, at, a);
          break;
        case ActionKind::RecvActivation: break;
      }
      if (a.is_send() || a.is_recv()) {
        const Action peer = matching_transfer(a);
        if (!index_of(peer)) {
          fail(a.to_string(), " on rank ", r, " has no matching ", peer.to_string(), " on rank ",
               s.rank_of(peer.stage));
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

ScheduleReport check_schedule(const Schedule& schedule) {
  check_static(schedule);
  ActionCosts unit;
  unit.forward = unit.backward = unit.backward_input = unit.backward_weight = {1.0};
  const Execution ex = execute(schedule, unit);
  if (!ex.finished) {
    throw std::invalid_argument(
        detail::concat("[check_schedule] ", describe(schedule),
                       ": no rank can go on, a cycle of waits: ", describe_cycle(schedule, ex)));
  }
  ScheduleReport report;
  report.peak_in_flight = ex.peak_in_flight;
  for (const auto& list : schedule.actions) {
    for (const Action& a : list) report.messages += a.is_send() ? 1 : 0;
  }
  return report;
}

}  // namespace dtensor::parallel
