// Op dispatch on DistTensors (internal): sharding strategies, their choice by
// redistribution cost, and the decision cache.
//
// An op (1) lists candidate strategies: for every input the placements it needs and
// the placements the output then has; (2) picks the one whose input redistributions
// cost least under the cost model (costs within 1% tie; ties go to fewer changed
// inputs, then to the more sharded output, then to the first listed; a move of an input
// that will receive a gradient counts twice, for its mirror in backward); (3) redistributes the inputs
// (differentiably); (4) runs the local kernel; (5) wraps the output. Decisions are
// cached by (op, attributes, input layouts, shapes, dtypes).
//
// Most ops describe their sharding with an einsum-like spec (Paddle's SPMD rules,
// Shardy's factors): one letter per tensor dim, e.g. matmul "mk,kn->mn". Per mesh
// dim a strategy either replicates, or shards one letter (inputs with the letter
// are sharded on its dim, the others replicated; the output is sharded on the
// letter's dim, or Partial(sum) when the letter is contracted away), or passes a
// Partial through an input the op is linear in, if the output is no larger than
// that input (a Partial is resolved at the smallest tensor it reaches). A strategy
// that creates a Partial is charged what resolving it costs beyond resolving a
// sharded output (Strategy::deferred_seconds), so that keeping an operand in place
// by leaving a large output Partial loses to moving a small operand now.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/dist_tensor.h"
#include "dtensor/sharding_rule.h"

namespace dtensor::step_plan {
struct Recorder;
// This rank's open PlannedStep (dtensor/step_plan.h), or null.
extern thread_local Recorder* active;
}  // namespace dtensor::step_plan

namespace dtensor::dispatch {

struct Strategy {
  std::vector<Placements> inputs;
  Placements output;
  // For the Partials this strategy creates (not those it passes through): the
  // bandwidth an all-reduce needs beyond an all-gather of the output, charged when
  // strategies are compared, so that keeping operands in place by leaving a large
  // output Partial does not beat moving a small operand now (dispatch.cpp). 0
  // without created Partials.
  double deferred_seconds = 0;
};

// The rule type is public (sharding_rule.h): user ops use the same routine.
using PartialRule = dtensor::PartialRule;
using EinsumSpec = ShardingRule;

// The output's global shape, when the caller knows it, sizes the Partial rules
// (letters only the output has, as expand's stretched dims, cannot be derived
// from the spec); without it each output letter takes its size from an input.
std::vector<Strategy> einsum_strategies(const EinsumSpec& spec, const std::vector<DistTensor>& inputs,
                                        const std::optional<Shape>& out_shape = std::nullopt);

// The index of the cheapest strategy for these inputs: the predicted seconds of
// moving every input to the strategy's placements (twice for an input that will
// receive a gradient: its gradient moves back in backward) plus its deferred_seconds.
size_t choose_strategy(const std::vector<Strategy>& strategies, const std::vector<DistTensor>& inputs);

// The inputs moved to the strategy's placements, as local tensors. The moves are
// not recorded for autograd: every op records its own backward against its
// original inputs.
std::vector<Tensor> local_inputs(const Strategy& strategy, const std::vector<DistTensor>& inputs);

// While alive on this rank, local_inputs moves each (tensor, placements) pair
// once: a second op that needs the same tensor in the same placements reuses the
// result. A backward function opens one when it feeds one gradient to several ops
// (matmul's backward multiplies its output gradient twice; a Partial gradient is
// then all-reduced once, as in Megatron, not once per product). Scoped rather than
// kept on the tensor, so no moved copy outlives the function that needed it.
class MoveMemo {
 public:
  MoveMemo();
  ~MoveMemo();
  MoveMemo(const MoveMemo&) = delete;
  MoveMemo& operator=(const MoveMemo&) = delete;
  // The moved local tensor, if `t` was moved to `placements` in this scope.
  const Tensor* find(const DistTensor& t, const Placements& placements) const;
  void add(const DistTensor& t, const Placements& placements, const Tensor& moved);
  static MoveMemo* active();

 private:
  struct Entry {
    DistTensor source;  // held, so its address cannot be reused while the memo lives
    Placements placements;
    Tensor moved;
  };
  std::vector<Entry> entries_;
  MoveMemo* previous_;
};

// Cached strategy choice. `attributes` distinguishes calls of one op that need
// different strategies (dims, keepdim, ...). `build(inputs)` returns the candidate
// strategies for inputs of those shapes and layouts; it runs only on a miss, so a hit
// costs one hash lookup and no allocation. While a PlannedStep is open
// (dtensor/step_plan.h) the step's plan chooses instead, and `build` is also asked
// what the op offers for other layouts of its inputs.
using Builder = std::function<std::vector<Strategy>(const std::vector<DistTensor>&)>;
namespace detail {
// Fills this rank's scratch key for (op, attributes, inputs) and looks it up.
const Strategy* lookup(std::string_view op, const std::vector<int64_t>& attributes,
                       const std::vector<DistTensor>& inputs);
// Chooses among `strategies` and caches the choice under the scratch key.
const Strategy& insert(std::string_view op, std::vector<Strategy> strategies,
                       const std::vector<DistTensor>& inputs);
// True while this rank has a PlannedStep open.
inline bool step_open() { return step_plan::active != nullptr; }
const Strategy& planned(std::string_view op, const std::vector<int64_t>& attributes,
                        const std::vector<DistTensor>& inputs, const Builder& build);
// Adds a decision to the active DispatchTrace (if any), with `note` appended.
void trace(std::string_view op, const Strategy& s, const std::vector<DistTensor>& inputs, std::string_view note);
}  // namespace detail

template <class Build>
const Strategy& cached_strategy(std::string_view op, const std::vector<int64_t>& attributes,
                                const std::vector<DistTensor>& inputs, Build&& build) {
  if (detail::step_open()) [[unlikely]] {
    return detail::planned(op, attributes, inputs, Builder(std::ref(build)));
  }
  if (const Strategy* hit = detail::lookup(op, attributes, inputs)) return *hit;
  return detail::insert(op, build(inputs), inputs);
}

// Predicted seconds of moving a tensor of `shape` and `dtype` on `mesh` from one
// layout to another under the redistribution planner's model (0 for the same layout);
// `steps`, if given, receives the number of transforms (collectives or local steps).
double move_seconds(const Shape& shape, DType dtype, const DeviceMesh& mesh, const Placements& from,
                    const Placements& to, int* steps = nullptr);

// Wraps a local result as a DistTensor (no checks: the rule guarantees the layout).
DistTensor wrap(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                const Shape& global_shape);

// Checks that all inputs are defined and live on one mesh; returns it.
const DeviceMesh& common_mesh(const std::vector<DistTensor>& inputs, const char* op);

// Letters for the dims of a tensor of rank `ndim`, right-aligned against an output
// of rank `out_ndim` with letters "abc...": the NumPy broadcasting alignment. Dims of
// size 1 that broadcast get '_'.
std::string broadcast_letters(const Shape& input, const Shape& output);

// A readable line per decision, printed when DTENSOR_DEBUG contains "dispatch", and
// kept for explain_op().
std::string describe(std::string_view op, const Strategy& s, const std::vector<DistTensor>& inputs);

size_t strategy_cache_size();
void clear_strategy_cache();

}  // namespace dtensor::dispatch
