// Whole-step layout planning: a training step is recorded once as a graph of
// DistTensor ops, every op's sharding strategy is then chosen jointly (the predicted
// seconds of all the step's communication, forward, backward and optimizer, under the
// cost model), and later steps replay the plan with no planning cost.
//
//   StepPlanner planner;
//   for (int step = 0; step < steps; ++step) {
//     PlannedStep scope(planner);        // step 0 records, step 1 on replays
//     DistTensor loss = mse(model.forward(x), y);
//     loss.backward();
//     optimizer.step();
//   }
//
// Dispatch alone chooses each op's layout looking one op ahead (docs/dispatch.md);
// a layout that pays off only over a sequence of ops (a Partial all-reduced once in
// forward so that backward needs nothing) is found only by a plan of the whole step.
//
// What the plan keeps (docs/dispatch.md, "Planning a whole step"):
// - the placements of every tensor the step did not compute: parameters, inputs, and
//   every `redistribute` the code calls (a pinned layout stays pinned);
// - the layout of any op output read with `to_local()` during the recorded step or
//   alive after it, and the path of every op that chooses one by a layout (a read
//   only in later steps, of a layout the plan changed, is an error);
// - the values: every strategy the planner may choose is one the op itself offers
//   for some layout of its inputs, so the planned step computes the same function.
// The first step runs greedily and records. The plan is used while the step issues
// the same ops on the same shapes; an op that differs ends the replay (the rest of
// that step is greedy) and the next step records again. A rank plans alone and
// deterministically (the search is bounded by work, not wall time), and the ranks of
// the first op's mesh check that they reached the same plan before using it.
//
// DTENSOR_PLAN=step makes parallel::Trainer plan its steps; DTENSOR_PLAN=greedy (the
// default) keeps one-op dispatch. DispatchTrace marks replayed decisions "[planned]".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace dtensor {

enum class PlanMode { Greedy, Step };

// DTENSOR_PLAN: "greedy" (or unset) or "step"; anything else is an error naming both.
PlanMode plan_mode_from_env();

struct StepPlannerOptions {
  // Upper bound on the search's work, in strategy evaluations (one candidate of one
  // op priced against its neighbours). Deterministic, so every rank stops at the
  // same point; the best plan found by then is used, and the greedy choice is the
  // starting point, so a cut-off search never plans worse than greedy.
  int64_t max_evaluations = 50'000'000;
};

// What the last step did.
struct StepPlanReport {
  enum class Phase { Recorded, Replayed, Diverged, Greedy };
  Phase phase = Phase::Greedy;
  int64_t ops = 0;              // dispatched ops in the step
  int64_t planned_ops = 0;      // ops whose strategy the plan chose (free to differ from greedy)
  int64_t changed_ops = 0;      // ops whose planned strategy differs from greedy's
  double greedy_seconds = 0;    // the step's predicted communication under greedy dispatch
  double planned_seconds = 0;   // ... under the plan
  double planning_seconds = 0;  // wall time spent planning (0 on replay)
  int64_t evaluations = 0;      // the search's work
  std::string note;             // why a step diverged or a plan was not used
  std::string to_string() const;
};

class StepPlanner {
 public:
  explicit StepPlanner(StepPlannerOptions options = {});
  ~StepPlanner();
  StepPlanner(const StepPlanner&) = delete;
  StepPlanner& operator=(const StepPlanner&) = delete;

  const StepPlanReport& last_report() const;
  // The plan, an op a line: its planned strategy (input layouts => output), greedy's
  // where it differs, and why an op kept its recorded strategy.
  std::string describe() const;
  // Forget the plan: the next step records again.
  void reset();

  struct State;

 private:
  friend class PlannedStep;
  std::unique_ptr<State> state_;
};

// One step under a planner, on this rank (this thread under the threads backend).
// Scopes do not nest; a scope of another planner cannot open inside one.
class PlannedStep {
 public:
  explicit PlannedStep(StepPlanner& planner);
  ~PlannedStep();
  PlannedStep(const PlannedStep&) = delete;
  PlannedStep& operator=(const PlannedStep&) = delete;

 private:
  StepPlanner& planner_;
};

}  // namespace dtensor
