// Sharding rules for ops of your own, in the form the built-in ops use: an
// einsum-like spec with one letter per tensor dim (Paddle's SPMD rules, Shardy's
// factors).
//
//   "mk,kn->mn"  matmul: shard m -> output S(m); shard n -> S(n); shard k on both
//                -> output Partial(sum) (the contraction); a batch letter shards
//                the output the same way
//   "ab,b->ab"   x [N, D] with a bias [D]: the bias follows x's column shards
//   "ab->a"      a reduction over b: b sharded -> Partial (contraction op)
//   '_'          a dim that is never sharded (a broadcast size-1 dim)
//
// Dispatch lists, per mesh dim, "replicate" or "shard one letter" (plus Partial
// pass-through per `partial`), picks the cheapest input redistribution under the
// cost model, runs the local kernel and wraps the output; decisions are cached by
// op name and layouts, so an op name must be unique. Several mesh dims sharding one
// letter nest in one order for every operand (see placement.h).
//
//   const CustomOp bias_gelu{"bias_gelu", ShardingRule::parse("ab,b->ab"),
//                            [](const std::vector<Tensor>& l) { return gelu(add(l[0], l[1])); },
//                            /*backward=*/...};
//   DistTensor y = bias_gelu({x, b});
//
// examples/custom_op.cpp is a fused op with its rule and backward.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor {

// How an op passes Partial inputs through (only where the output is no larger than
// the Partial input: a Partial is resolved at the smallest tensor it reaches).
enum class PartialRule : uint8_t {
  None,     // every Partial input is reduced first (non-linear ops: relu, exp, ...)
  AllSame,  // all inputs Partial with the same linear op -> that op (add, sub)
  OneOf,    // exactly one input Partial(sum/avg), the others replicated (mul, matmul)
};

struct ShardingRule {
  std::vector<std::string> inputs;  // one letter per dim of each input
  std::string output;               // one letter per dim of the output
  PartialRule partial = PartialRule::None;
  // Which inputs may carry a Partial through (empty: all); div is linear in its
  // numerator only.
  std::vector<bool> partial_inputs = {};
  // Letters that must not be sharded (e.g. the dim a softmax runs along).
  std::string unshardable = {};
  // How a sharded letter that the output drops combines: sum for contractions and
  // sums, max/min for amax/amin.
  ReduceOp contraction = ReduceOp::Sum;

  // "ab,b->ab" (spaces ignored). Throws std::invalid_argument naming the position
  // for a missing "->", an empty operand, or a character other than a letter or '_'.
  static ShardingRule parse(std::string_view spec);
  std::string to_string() const;  // "ab,b->ab"
};

// The local computation: this rank's pieces (in the placements the rule chose) ->
// its piece of the output.
using LocalKernel = std::function<Tensor(const std::vector<Tensor>& locals)>;
// The gradients of the inputs (undefined where none) from the output's gradient
// and the inputs, written with DistTensor ops (another CustomOp for a fused
// backward kernel, say).
using OpBackward =
    std::function<std::vector<DistTensor>(const DistTensor& grad_output, const std::vector<DistTensor>& inputs)>;

struct CustomOp {
  std::string name;
  ShardingRule rule;
  LocalKernel forward;
  OpBackward backward = {};  // empty: the output does not carry gradients
  // The global output shape from the input shapes (empty: each output letter's size
  // from an input that has it, 1 for '_').
  std::function<Shape(const std::vector<Shape>&)> output_shape = {};

  // Checks the inputs against the rule (count, dims, sizes of shared letters),
  // dispatches, runs forward, records backward. Throws std::invalid_argument
  // tagged with the op's name.
  DistTensor operator()(const std::vector<DistTensor>& inputs) const;
};

// A process-wide table by name, for code that calls ops it does not define.
void register_op(CustomOp op);  // throws if the name is taken
DistTensor call_op(std::string_view name, const std::vector<DistTensor>& inputs);  // throws listing the names

}  // namespace dtensor
