// Tensor parallelism as placements (Megatron-LM's layouts, PyTorch's API names).
//
//   parallel::parallelize_module(model, mesh["tp"], {{"blocks.*.fc1", parallel::ColwiseParallel{}},
//                                                    {"blocks.*.fc2", parallel::RowwiseParallel{}}});
//
// (models::gpt_tp_plan in models/gpt_parallel.h is Megatron-LM's plan for the GPT.)
//
// A style changes the placements of a module's parameters on the tensor-parallel
// mesh dim and registers forward hooks that move the module's input and output on
// that dim; ops inside the module then pick local strategies by sharding
// propagation. Nothing else is special: gradients, optimizers, DDP over another mesh
// dim and checkpoints see ordinary DistTensors.
//
// The tensor-parallel mesh is the module's own mesh (1-D) or the 1-D sub-mesh of one
// of its dims (`mesh["tp"]` of a (dp, tp) mesh): styles then change only that mesh
// dim of each placement list, so data parallelism over the other dim composes.
//
// Layouts per style (on the tp dim):
//   ColwiseParallel   Linear weight [out, in] S(0), bias S(0); Embedding weight S(1).
//                     Input moved to Replicate; output S(-1), then to output_layouts.
//   RowwiseParallel   Linear weight S(1), bias Replicate; Embedding weight S(0) (vocab
//                     parallel). Input moved to S(-1) (Linear) or Replicate (Embedding);
//                     output Partial, reduced to output_layouts (default Replicate:
//                     an all-reduce; Shard(1): a reduce-scatter, sequence parallel).
//   SequenceParallel  Norms and dropout with replicated parameters run on sequence
//                     shards: input moved to Shard(sequence_dim), output stays there.
//   PrepareModuleInput / PrepareModuleOutput  move a module's input / output.
//
// Inputs and outputs are DistTensors that carry their own placements, so a style
// moves them from wherever they are. `input_layouts` (and PrepareModuleOutput's
// `output_layouts`) state what the plan expects to arrive; when given, an input in
// another layout on the tp dim is an error naming the module (PyTorch uses them to
// annotate plain tensors; here they catch a plan that does not fit the model).
// ColwiseParallel's and RowwiseParallel's `output_layouts` say where the output
// goes. `use_local_output` is PyTorch's
// flag for handing plain local tensors to model code written for local shapes;
// dtensor model code is written for global shapes, so it is false and setting it
// is an error that says so.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dtensor/nn/module.h"

namespace dtensor::parallel {

struct ColwiseParallel {
  std::optional<Placement> input_layouts = std::nullopt;  // expected input (unchecked when absent)
  std::optional<Placement> output_layouts = std::nullopt;  // default Shard(-1)
  bool use_local_output = false;
};

struct RowwiseParallel {
  std::optional<Placement> input_layouts = std::nullopt;  // expected input (unchecked when absent)
  std::optional<Placement> output_layouts = std::nullopt;  // default Replicate()
  bool use_local_output = false;
};

struct SequenceParallel {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
};

struct PrepareModuleInput {
  std::optional<Placement> input_layouts = std::nullopt;
  Placement desired_input_layouts = Replicate();
  bool use_local_output = false;
};

struct PrepareModuleOutput {
  std::optional<Placement> output_layouts = std::nullopt;
  Placement desired_output_layouts = Replicate();
  bool use_local_output = false;
};

// nn::MoE's experts over the style's mesh dim. Expert parallel: the stacked expert
// weights Shard(0), each rank holding E/P whole experts; tokens travel to them by
// all-to-all (the mesh dim must shard the tokens: batch it there). With `hidden`,
// tensor parallel inside every expert instead: up/gate Shard(1), down Shard(2), the
// experts' output summed over the dim (the input replicated there, as for nn::MLP).
// The router stays replicated.
struct ExpertParallel {
  bool hidden = false;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput,
                                   PrepareModuleOutput, ExpertParallel>;

// Module name (as named_modules() gives it, "" for the root) -> style. A '*' in a
// pattern matches one name component ("blocks.*.attn.q" matches "blocks.0.attn.q";
// children registered with dotted names such as "blocks.0" count as two
// components). Entries apply in order; every pattern must match at least one module.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// Applies `plan` to `module` (collective over the mesh: parameters change layout).
// Throws std::invalid_argument naming the pattern or module for a pattern that
// matches nothing, a style on a module it does not fit, two parameter-placing
// styles on one module, a tp mesh that is neither the module's mesh nor a 1-D
// sub-mesh of it, and attention heads that the tensor-parallel degree does not
// divide, and (at run time) a local piece arriving at a module on a 2-D mesh.
// Create the optimizer after this call (it holds the parameters).
void parallelize_module(nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan);

// The entries of `plan` whose pattern matches a module of `module`: the part of a
// whole model's plan that applies to a pipeline stage holding some of its layers.
ParallelizePlan restrict_plan(const ParallelizePlan& plan, nn::Module& module);

// "ColwiseParallel(input R, output S(-1))" and so on.
std::string style_to_string(const ParallelStyle& style);

}  // namespace dtensor::parallel
