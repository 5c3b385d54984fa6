// Pipeline schedules as explicit per-rank lists of actions, the checker that proves a
// schedule runs to the end, and the discrete-event simulator that replays one with
// per-action costs. Pure functions: nothing here touches tensors or communicates.
//
//   Schedule s = one_f_one_b(/*ranks*/ 4, /*micro_batches*/ 8);
//   ScheduleReport r = check_schedule(s);       // throws naming the first problem
//   r.peak_in_flight;                           // {4, 3, 2, 1}: 1F1B holds <= p micro-batches
//   Timeline t = simulate(s, ActionCosts::uniform(/*forward*/ 1, /*backward*/ 2));
//   t.bubble_fraction();                        // (p-1)/(m+p-1) = 3/11
//
// Stages and ranks: a schedule has `stages` = ranks x virtual stages, and stage s runs
// on rank s % ranks (Megatron's interleaving: rank r holds stages r, r + p, r + 2p,
// ...). Every stage sees the micro-batches 0..m-1 in increasing order, in forward and
// in backward, so the messages of one channel match in the order they were posted.
//
// Actions, printed in PyTorch's notation ("1F3": stage 1, forward, micro-batch 3):
//   F       forward (the last stage also computes the loss)
//   B       backward: input and weight gradients
//   I       backward for the input gradient only (zero-bubble's B, on the critical path)
//   W       backward for the weight gradients (zero-bubble's W, scheduled into bubbles)
//   SEND_F  the stage's output to the next stage's rank; RECV_F its input from the
//           previous stage's rank (on the receiving stage)
//   SEND_B  the stage's input gradient to the previous stage's rank; RECV_B its output
//           gradient from the next stage's rank
// Two stages on one rank (interleaving with one rank) hand over without messages.
//
// How the runtime executes a list (pipeline.h), and what the checker proves about it:
// sends and receives are posted where they stand and never block; a compute action
// waits for the receives it consumes; a rank waits for its own sends only after its
// last action. So a rank can only ever wait for another rank's send, and a schedule
// runs to the end exactly when the graph of "comes before on this rank" and "send
// before its receive" has no cycle. check_schedule proves that by executing the lists
// abstractly, after checking that every compute action appears exactly once on the
// rank of its stage, after what it depends on, that every send has its receive (and
// the receives of one channel come in the order of its sends), and that no rank sends
// to itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor::parallel {

enum class ActionKind : uint8_t {
  Forward,
  Backward,
  BackwardInput,
  BackwardWeight,
  SendActivation,
  RecvActivation,
  SendGradient,
  RecvGradient,
};

struct Action {
  ActionKind kind = ActionKind::Forward;
  int stage = 0;  // the stage on the rank that runs the action
  int micro = 0;  // the micro-batch
  bool operator==(const Action&) const = default;
  bool is_compute() const { return kind <= ActionKind::BackwardWeight; }
  bool is_send() const { return kind == ActionKind::SendActivation || kind == ActionKind::SendGradient; }
  bool is_recv() const { return kind == ActionKind::RecvActivation || kind == ActionKind::RecvGradient; }
  // "1F3", "0SEND_F3", "2I0".
  std::string to_string() const;
};

enum class ScheduleKind : uint8_t { GPipe, OneFOneB, Interleaved1F1B, ZeroBubble, ForwardOnly };

// "gpipe", "1f1b", "interleaved", "zero-bubble", "forward-only"; parse_schedule_kind
// lists the valid names for any other.
std::string_view schedule_kind_name(ScheduleKind kind);
ScheduleKind parse_schedule_kind(std::string_view name);

struct Schedule {
  std::string name;  // "1F1B"
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int ranks = 1;
  int stages = 1;         // ranks x virtual stages
  int micro_batches = 1;
  std::vector<std::vector<Action>> actions;  // per rank, in order

  int virtual_stages() const { return stages / ranks; }
  int rank_of(int stage) const { return stage % ranks; }
  std::vector<int> stages_of(int rank) const;  // increasing
  bool splits_backward() const { return kind == ScheduleKind::ZeroBubble; }
  bool has_backward() const { return kind != ScheduleKind::ForwardOnly; }
  // One line per rank: "rank 0: 0F0 0SEND_F0 0F1 ..."
  std::string to_string() const;
};

// The generators. Each returns compute actions in its order with the transfers
// inserted beside them (a send right after the compute that produces it, a receive
// right before the compute that consumes it), so the receive a stage needs next and
// the send it just produced are posted together.
//
// GPipe: every forward, then every backward; holds m micro-batches of activations.
Schedule gpipe(int ranks, int micro_batches);
// 1F1B (PipeDream-Flush): rank r runs p - r - 1 warm-up forwards, then alternates one
// forward and one backward, then drains the backwards; holds at most p - r.
Schedule one_f_one_b(int ranks, int micro_batches);
// Megatron's interleaved 1F1B with v virtual stages per rank (stage s on rank s % p).
// Needs the micro-batch count to be a multiple of the ranks (micro-batches go round
// in groups of p); v = 1 is 1F1B.
Schedule interleaved_1f1b(int ranks, int micro_batches, int virtual_stages);
// Zero bubble, ZB-H1 (Qi et al., 2023): backward split into I and W, 1F1B's memory
// (at most p micro-batches await their W on any rank). Rank r runs p - r warm-up
// forwards, then r rounds of I F (its first r weight gradients wait), then I W F until
// the forwards are done, then I W, then the W left. With F = I = W the bubble is
// (p-1)/(3m+p-1) for m >= p, against 1F1B's (p-1)/(m+p-1) with B = I + W.
Schedule zero_bubble(int ranks, int micro_batches);
// Forwards only (inference): GPipe's first half.
Schedule forward_only(int ranks, int micro_batches);
// By kind; virtual_stages only for Interleaved1F1B (else it must be 1).
Schedule make_schedule(ScheduleKind kind, int ranks, int micro_batches, int virtual_stages = 1);

// The tag of a transfer on the pp group: one channel per (stage boundary, direction).
// A send and its receive get the same tag.
int message_tag(const Action& transfer);
// The action on the other rank that matches a send or a receive.
Action matching_transfer(const Action& transfer);

struct ScheduleReport {
  // Per rank, the most micro-batches whose activations are held at once (a forward
  // done, its backward, or W when split, not yet): stage-micro-batch pairs, so an
  // interleaved rank counts each of its v chunks.
  std::vector<int> peak_in_flight;
  int64_t messages = 0;  // sends (= receives)
};

// Throws std::invalid_argument "[check_schedule] <name> (p=.., m=.., v=..): ..." naming
// the first problem: a missing, repeated or misplaced action, an action before one it
// depends on, a send without its receive (or the other way round), receives of one
// channel in another order than its sends, a transfer to the rank itself, or a cycle
// of waits (each rank's blocked action and what it waits for).
ScheduleReport check_schedule(const Schedule& schedule);

// ---- the discrete-event simulator ------------------------------------------------------

// Seconds per action. Per-stage vectors hold one value per stage, or one value for
// every stage. backward_input and backward_weight are used by split schedules.
struct ActionCosts {
  std::vector<double> forward{1.0}, backward{2.0}, backward_input{1.0}, backward_weight{1.0};
  double transfer = 0;  // from posting a send to its data being at the receiver
  double post = 0;      // a rank's own time to post a send or a receive
  // F = forward, B = backward, I = W = backward / 2, no transfer cost.
  static ActionCosts uniform(double forward, double backward);
  double of(const Action& action) const;
};

struct TimelineEntry {
  Action action;
  double start = 0, end = 0;  // seconds from the start of the step
};

// What each rank did and when: a simulated step, or a measured one (the runtime
// records the same entries, Pipeline::last_timeline()).
struct Timeline {
  std::string title;
  int ranks = 1;
  std::vector<std::vector<TimelineEntry>> entries;  // per rank, in order

  double makespan() const;         // latest end over every rank
  double busy(int rank) const;     // compute time of the rank
  // Idle share of ranks x makespan: what the pipeline wastes. GPipe and 1F1B with
  // uniform stages give (p-1)/(m+p-1).
  double bubble_fraction() const;
  // One row per rank, compute coloured by kind (F, B, I, W), transfers as ticks, idle
  // time blank; with a time axis, the bubble fraction and a legend.
  std::string to_svg() const;
  // Chrome trace JSON (Perfetto): a track per rank, a span per action.
  std::string to_chrome_trace() const;
  // Writes to_svg() / to_chrome_trace() to a file; throws naming a path that cannot be written.
  void write_svg(const std::string& path) const;
  void write_chrome_trace(const std::string& path) const;
};

// Replays the schedule as the runtime executes it (see the header comment): each rank
// runs its actions in order, a compute action starts when the rank is free and the
// data it receives is there. Throws as check_schedule does for a schedule that cannot
// finish.
Timeline simulate(const Schedule& schedule, const ActionCosts& costs);

// The textbook bubble fractions: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m+p-1)
// for interleaved 1F1B, (p-1)/(3m+p-1) for ZB-H1 with F = I = W and m >= p (with
// fewer micro-batches there are not enough W to fill the cool-down).
double theoretical_bubble(ScheduleKind kind, int ranks, int micro_batches, int virtual_stages = 1);

}  // namespace dtensor::parallel
