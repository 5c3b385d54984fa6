// Reshape-like ops on DistTensors: reshape, view, flatten.
//
// The rule is derived from a "dim map" (Paddle's reshape SPMD rule, PyTorch's
// view_groups): the input and output dims are cut into the shortest runs whose
// element counts agree, so that each run of output dims is exactly a run of input
// dims re-split in row-major order. A run with one input and one output dim keeps
// the dim; many inputs to one output flattens; one input to many outputs splits.
//
//   [B, S, H] -> [B*S, H]      runs {B, S} -> {B*S} (flatten), {H} -> {H} (keep)
//   [B, S*H]  -> [B, S, H]     runs {B} -> {B} (keep), {S*H} -> {S, H} (split)
//
// Only the outermost dim (of size != 1) of a run may keep its sharding, and it
// passes it to the outermost dim of the run's outputs: every other dim of the run
// is strided inside the outermost one, so a rank's piece of it is not a contiguous
// piece of the output. Even the outermost dim keeps it only when its shard
// boundaries, scaled to element offsets inside the run, are the boundaries the
// chunk rule gives the output dim: [4, 3] -> [12] on 2 ranks holds rows [0, 2) and
// [2, 4) = elements [0, 6) and [6, 12) = chunks of 12, fine; [3, 4] -> [12] holds
// rows [0, 2), [2, 3) = elements [0, 8), [8, 12), but the output's chunks are
// [0, 6), [6, 12): that dim must be redistributed (the dispatch picks the cheapest
// layout that maps cleanly, e.g. an all-to-all onto another dim or an all-gather).
// Partial passes through: reshape is linear.
//
// view is reshape here: a DistTensor's local piece may have to be copied (the
// local reshape is a view when the local strides allow it, as for Tensor::reshape),
// and a view of a distributed tensor could not alias its global storage anyway.
#include <algorithm>

#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {

using Grads = std::vector<DistTensor>;

namespace {

// Input dims [in_begin, in_end) hold, in row-major order, the elements of output
// dims [out_begin, out_end). One side may be empty (a run of size-1 dims).
struct DimRun {
  int64_t in_begin, in_end, out_begin, out_end;
};

int64_t product(const Shape& shape, int64_t begin, int64_t end) {
  int64_t p = 1;
  for (int64_t d = begin; d < end; ++d) p *= shape[d];
  return p;
}

// The shortest runs whose element counts agree. Example: [2, 6, 1, 5] -> [12, 5]
// gives {0, 1} -> {0} and {2, 3} -> {1}. Empty tensors give one run over everything
// (their dims carry no data to map).
std::vector<DimRun> dim_runs(const Shape& in, const Shape& out) {
  const auto n_in = static_cast<int64_t>(in.size()), n_out = static_cast<int64_t>(out.size());
  if (shape_numel(in) == 0) return {{0, n_in, 0, n_out}};
  std::vector<DimRun> runs;
  int64_t i = 0, o = 0;
  while (i < n_in || o < n_out) {
    DimRun run{i, i, o, o};
    int64_t in_count = i < n_in ? in[i++] : 1;
    int64_t out_count = o < n_out ? out[o++] : 1;
    while (in_count != out_count) {
      // Equal totals guarantee the smaller side still has dims left.
      if (in_count < out_count) in_count *= in[i++];
      else out_count *= out[o++];
    }
    run.in_end = i;
    run.out_end = o;
    runs.push_back(run);
  }
  return runs;
}

// The outermost dim of [begin, end) whose size is not 1 (size-1 dims in front of
// it carry no offset), or begin when all are 1; -1 for an empty range.
int64_t outermost(const Shape& shape, int64_t begin, int64_t end) {
  if (begin == end) return -1;
  for (int64_t d = begin; d < end; ++d) {
    if (shape[d] != 1) return d;
  }
  return begin;
}

// The pieces of a dim of `size` nested-chunked by mesh dims of sizes `splits`
// (outermost first), in mesh order: each piece of the outer split is chunked again.
// Example: size 7, splits {2, 2} -> [0, 2), [2, 4), [4, 6), [6, 7).
std::vector<Range> nested_chunks(int64_t size, const std::vector<int64_t>& splits) {
  std::vector<Range> pieces{{0, size}};
  for (int64_t k : splits) {
    std::vector<Range> next;
    for (const Range& p : pieces) {
      for (int64_t r = 0; r < k; ++r) {
        const Range c = chunk_range(p.length, k, r);
        next.push_back({p.offset + c.offset, c.length});
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

struct ReshapePlan {
  std::vector<DimRun> runs;
  dispatch::EinsumSpec spec;
};

ReshapePlan plan_reshape(const Shape& in, const Shape& out) {
  ReshapePlan plan;
  plan.runs = dim_runs(in, out);
  std::string in_letters(in.size(), '_'), out_letters(out.size(), '_');
  if (shape_numel(in) != 0) {
    for (const DimRun& run : plan.runs) {
      const int64_t i = outermost(in, run.in_begin, run.in_end);
      const int64_t o = outermost(out, run.out_begin, run.out_end);
      if (i < 0 || o < 0) continue;  // size-1 dims appearing or vanishing: never sharded
      in_letters[i] = out_letters[o] = static_cast<char>('a' + i);
    }
  }
  plan.spec.inputs = {in_letters};
  plan.spec.output = out_letters;
  plan.spec.partial = dispatch::PartialRule::OneOf;
  return plan;
}

// True when every output dim the strategy shards gets exactly the elements the
// input's shards of its source dim hold (see the file comment).
bool maps_cleanly(const dispatch::Strategy& s, const ReshapePlan& plan, const Shape& in, const Shape& out,
                  const Shape& mesh_shape) {
  const auto in_nesting = shard_nesting(s.inputs[0], static_cast<int64_t>(in.size()));
  const auto out_nesting = shard_nesting(s.output, static_cast<int64_t>(out.size()));
  for (const DimRun& run : plan.runs) {
    const int64_t i = outermost(in, run.in_begin, run.in_end);
    const int64_t o = outermost(out, run.out_begin, run.out_end);
    if (i < 0 || o < 0 || in_nesting[i].empty()) continue;
    if (in_nesting[i] != out_nesting[o]) return false;
    std::vector<int64_t> splits;
    for (int m : in_nesting[i]) splits.push_back(mesh_shape[m]);
    const int64_t in_inner = product(in, i + 1, run.in_end), out_inner = product(out, o + 1, run.out_end);
    const std::vector<Range> from = nested_chunks(in[i], splits), to = nested_chunks(out[o], splits);
    for (size_t p = 0; p < from.size(); ++p) {
      if (from[p].offset * in_inner != to[p].offset * out_inner || from[p].length * in_inner != to[p].length * out_inner) {
        return false;
      }
    }
  }
  return true;
}

// The requested shape with -1 inferred, checked against the input's element count.
Shape infer_shape(const Shape& requested, const Shape& input, const char* op) {
  const int64_t numel = shape_numel(input);
  Shape shape = requested;
  int64_t known = 1, inferred = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      DT_CHECK_ARG(inferred < 0, op, "expected at most one -1 in the shape, got ", requested);
      inferred = static_cast<int64_t>(d);
      continue;
    }
    DT_CHECK_ARG(shape[d] >= 0, op, "expected sizes >= 0 or -1, got ", requested);
    known *= shape[d];
  }
  if (inferred >= 0) {
    DT_CHECK_ARG(known != 0 && numel % known == 0, op, "expected a shape that fits ", numel, " elements (input ",
                 input, "), got ", requested);
    shape[inferred] = numel / known;
  }
  DT_CHECK_ARG(shape_numel(shape) == numel, op, "expected a shape with ", numel, " elements (input ", input,
               "), got ", requested);
  return shape;
}

DistTensor reshape_as(const DistTensor& a, const Shape& requested, const char* op) {
  DT_CHECK_ARG(a.defined(), op, "expected a defined DistTensor");
  const Shape in = a.shape();
  const Shape out = infer_shape(requested, in, op);
  if (out == in) return a;
  const ReshapePlan plan = plan_reshape(in, out);
  const DeviceMesh& mesh = a.mesh();
  const dispatch::Strategy& strategy =
      dispatch::cached_strategy("reshape", out, {a}, [&](const std::vector<DistTensor>& operands) {
        std::vector<dispatch::Strategy> strategies = dispatch::einsum_strategies(plan.spec, operands, out);
        std::erase_if(strategies,
                      [&](const dispatch::Strategy& s) { return !maps_cleanly(s, plan, in, out, mesh.shape()); });
        return strategies;
      });
  const Tensor local = dispatch::local_inputs(strategy, {a})[0];
  // A sharded output dim is the outermost of its run: it takes whatever the local
  // piece of the run holds; every other output dim is whole.
  Shape local_out = out;
  if (shape_numel(in) != 0) {
    for (const DimRun& run : plan.runs) {
      const int64_t o = outermost(out, run.out_begin, run.out_end);
      if (o < 0) continue;
      local_out[o] = product(local.shape(), run.in_begin, run.in_end) / product(out, o + 1, run.out_end);
    }
  }
  DistTensor result = dispatch::wrap(local.reshape(local_out), mesh, strategy.output, out);
  if (!autograd::needs_grad({a})) return result;
  return ops::with_grad(result, op, {a}, [in](const Grads& g) { return Grads{reshape(g[0], in)}; });
}

}  // namespace

DistTensor reshape(const DistTensor& a, const Shape& shape) { return reshape_as(a, shape, "reshape"); }

DistTensor view(const DistTensor& a, const Shape& shape) { return reshape_as(a, shape, "view"); }

DistTensor flatten(const DistTensor& a, int64_t start_dim, int64_t end_dim) {
  DT_CHECK_ARG(a.defined(), "flatten", "expected a defined DistTensor");
  if (a.dim() == 0) return reshape_as(a, {1}, "flatten");
  const int64_t start = normalize_dim(start_dim, a.dim(), "flatten");
  const int64_t end = normalize_dim(end_dim, a.dim(), "flatten");
  DT_CHECK_ARG(start <= end, "flatten", "expected start_dim <= end_dim, got ", start_dim, " and ", end_dim,
               " for a tensor of ", a.dim(), " dims");
  Shape shape(a.shape().begin(), a.shape().begin() + start);
  shape.push_back(product(a.shape(), start, end + 1));
  shape.insert(shape.end(), a.shape().begin() + end + 1, a.shape().end());
  return reshape_as(a, shape, "flatten");
}

}  // namespace dtensor
