// What the schedule checker and the simulator share (internal to src/parallel): a
// schedule's one-line description, the static checks, and the abstract execution of
// the ranks' lists (pipeline_simulate.cpp) that is the checker's proof and the
// simulator's replay.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/parallel/pipeline_schedule.h"

namespace dtensor::parallel {

// "1F1B (p=4, m=8, v=1)"
std::string describe(const Schedule& s);

// ---- abstract execution (the checker's proof and the simulator) --------------------------

struct Position {
  int rank = -1;
  size_t index = 0;
};

using ActionKey = std::tuple<int, int, int>;  // kind, stage, micro
inline ActionKey key_of(const Action& a) { return {static_cast<int>(a.kind), a.stage, a.micro}; }

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
Execution execute(const Schedule& s, const ActionCosts& costs);

// "rank 0 at 0F2 waits for 1SEND_B1 on rank 1; rank 1 at 1B1 waits for ..." around a
// cycle of the wait-for graph of a stuck execution.
std::string describe_cycle(const Schedule& s, const Execution& ex);

// Everything check_schedule proves before executing (pipeline_schedule_check.cpp).
void check_static(const Schedule& s);

}  // namespace dtensor::parallel
