// Pipeline schedules: actions and kinds, and the generators (the checker is in
// pipeline_schedule_check.cpp, the simulator in pipeline_simulate.cpp).
#include "dtensor/parallel/pipeline_schedule.h"

#include <algorithm>
#include <sstream>

#include "dtensor/error.h"
#include "parallel/pipeline_execution.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

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

}  // namespace

std::string describe(const Schedule& s) {
  return detail::concat(s.name, " (p=", s.ranks, ", m=", s.micro_batches, ", v=", s.virtual_stages(), ")");
}

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
               "in groups of p), got ",
               micro_batches, " micro-batches for ", ranks, " ranks; use ",
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

}  // namespace dtensor::parallel
