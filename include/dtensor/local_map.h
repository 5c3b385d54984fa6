// local_map: run a function of each rank's pieces, for layouts and ops dispatch
// does not know (PyTorch's torch.distributed.tensor.experimental.local_map).
//
//   // A row-wise op that needs whole rows: rows sharded, columns replicated.
//   auto out = local_map(
//       [](const std::vector<DistTensor>& x) { return std::vector<DistTensor>{my_row_op(x[0])}; },
//       /*out_placements=*/{{Shard(0)}}, /*in_placements=*/{{Shard(0)}}, {x});
//
// The inputs are moved to `in_placements` first (recorded for autograd; with
// redistribute_inputs = false a mismatch is an error instead). `fn` receives each
// input's local piece as a DistTensor on local_mesh() and returns its outputs there;
// ops on them never communicate. Each output becomes this rank's piece of a tensor on
// the inputs' mesh with `out_placements`; its global shape comes from `out_shapes`
// or, without it, from one all-gather of the local sizes (as from_local does).
//
// Gradients flow through the DistTensor ops inside fn. An input's gradient comes
// back with these placements, per mesh dim: a Shard input gets its pieces' gradients
// as they are; a Replicate input gets Partial(sum) where some output is not
// Replicate on that dim (each rank's outputs then depend on the full input
// differently, so their gradients add up) and Replicate where every output is
// (the ranks computed the same thing); a Partial input gets Replicate (the gradient
// of a partial contribution). `in_grad_placements` overrides this per input
// (PyTorch assumes the input placements instead; Partial(sum) for a replicated
// input that feeds sharded outputs is what keeps that common case right).
//
// For a function written on plain tensors with a hand-written backward, see
// CustomOp in sharding_rule.h.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor {

using LocalMapFn = std::function<std::vector<DistTensor>(const std::vector<DistTensor>& locals)>;

struct LocalMapOptions {
  bool redistribute_inputs = true;
  // One entry per input (empty: the rule above for all).
  std::vector<std::optional<Placements>> in_grad_placements = {};
  // One global shape per output (empty: inferred with one all-gather each).
  std::vector<Shape> out_shapes = {};
};

std::vector<DistTensor> local_map(const LocalMapFn& fn, const std::vector<Placements>& out_placements,
                                  const std::vector<Placements>& in_placements, const std::vector<DistTensor>& inputs,
                                  const LocalMapOptions& options = {});

}  // namespace dtensor
