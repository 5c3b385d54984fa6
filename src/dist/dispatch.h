// Op dispatch on DistTensors (internal): sharding strategies, their choice by
// redistribution cost, and the decision cache.
//
// An op (1) lists candidate strategies: for every input the placements it needs and
// the placements the output then has; (2) picks the one whose input redistributions
// cost least under the cost model (costs within 1% tie; ties go to fewer changed
// inputs, then to the more sharded output, then to the first listed); (3) redistributes the inputs
// (differentiably); (4) runs the local kernel; (5) wraps the output. Decisions are
// cached by (op, attributes, input layouts, shapes, dtypes).
//
// Most ops describe their sharding with an einsum-like spec (Paddle's SPMD rules,
// Shardy's factors): one letter per tensor dim, e.g. matmul "mk,kn->mn". Per mesh
// dim a strategy either replicates, or shards one letter (inputs with the letter
// are sharded on its dim, the others replicated; the output is sharded on the
// letter's dim, or Partial(sum) when the letter is contracted away), or passes a
// Partial through an input the op is linear in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor::dispatch {

struct Strategy {
  std::vector<Placements> inputs;
  Placements output;
};

// How an op passes Partial inputs through.
enum class PartialRule : uint8_t {
  None,     // every Partial input is reduced first (relu, exp, ...)
  AllSame,  // all inputs Partial with the same linear op -> that op (add, sub)
  OneOf,    // exactly one input Partial(sum/avg), the others replicated -> that op (mul, matmul)
};

// One letter per tensor dim of each input and of the output; '_' marks a dim that
// is never sharded (a broadcast dim of size 1).
struct EinsumSpec {
  std::vector<std::string> inputs;
  std::string output;
  PartialRule partial = PartialRule::None;
  // Which inputs may carry a Partial through (empty: all); div is linear in its
  // numerator only.
  std::vector<bool> partial_inputs;
  // Letters that must not be sharded (e.g. the softmax dim).
  std::string unshardable;
  // How a sharded letter that the output drops combines: sum for contractions and
  // sums, max/min for amax/amin.
  ReduceOp contraction = ReduceOp::Sum;
};

std::vector<Strategy> einsum_strategies(const EinsumSpec& spec, const std::vector<DistTensor>& inputs);

// The index of the cheapest strategy for these inputs.
size_t choose_strategy(const std::vector<Strategy>& strategies, const std::vector<DistTensor>& inputs);

// The inputs moved to the strategy's placements, as local tensors. The moves are
// not recorded for autograd: every op records its own backward against its
// original inputs.
std::vector<Tensor> local_inputs(const Strategy& strategy, const std::vector<DistTensor>& inputs);

// Cached strategy choice. `attributes` distinguishes calls of one op that need
// different strategies (dims, keepdim, ...). `build` (returning the candidate
// strategies) runs only on a miss, so a hit costs one hash lookup and no
// allocation.
namespace detail {
// Fills this rank's scratch key for (op, attributes, inputs) and looks it up.
const Strategy* lookup(std::string_view op, const std::vector<int64_t>& attributes,
                       const std::vector<DistTensor>& inputs);
// Chooses among `strategies` and caches the choice under the scratch key.
const Strategy& insert(std::string_view op, std::vector<Strategy> strategies,
                       const std::vector<DistTensor>& inputs);
}  // namespace detail

template <class Build>
const Strategy& cached_strategy(std::string_view op, const std::vector<int64_t>& attributes,
                                const std::vector<DistTensor>& inputs, Build&& build) {
  if (const Strategy* hit = detail::lookup(op, attributes, inputs)) return *hit;
  return detail::insert(op, build(), inputs);
}

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
