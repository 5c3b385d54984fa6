// The discrete-event simulator of pipeline schedules: the abstract execution of the
// ranks' lists (also the checker's proof), per-action costs and the textbook bubbles.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "dtensor/error.h"
#include "dtensor/parallel/pipeline_schedule.h"
#include "parallel/pipeline_execution.h"
#include "util/check.h"

namespace dtensor::parallel {

// ---- abstract execution (the checker's proof and the simulator) --------------------------

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

// ---- the simulator -------------------------------------------------------------------------

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
  for (const std::vector<double>* v :
       {&costs.forward, &costs.backward, &costs.backward_input, &costs.backward_weight}) {
    DT_CHECK_ARG(v->size() == 1 || static_cast<int>(v->size()) == schedule.stages, "simulate",
                 "per-stage costs need one value or one per stage (", schedule.stages, "), got ", v->size());
  }
  Execution ex = execute(schedule, costs);
  if (!ex.finished) {
    throw std::invalid_argument(detail::concat(
        "[simulate] ", describe(schedule), ": no rank can go on, a cycle of waits: ", describe_cycle(schedule, ex)));
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
  throw std::invalid_argument(
      detail::concat("[theoretical_bubble] no textbook formula for ", schedule_kind_name(kind)));
}

}  // namespace dtensor::parallel
