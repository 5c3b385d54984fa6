// Reductions on DistTensors: sum, mean, amax, amin.
//
// Rule "abc->ac": a reduced dim that is sharded leaves each rank a partial result:
// Partial(sum) for sum and mean, Partial(max)/Partial(min) for amax/amin, resolved
// lazily by whoever needs the value. Kept dims keep their sharding. mean divides by
// the global count, so it is exact on uneven shards.
#include <algorithm>
#include <set>

#include "ops/op_helpers.h"
#include "placements/transform.h"
#include "util/check.h"

namespace dtensor {

using ops::with_grad;
using Grads = std::vector<DistTensor>;

namespace {

std::vector<int64_t> normalized_dims(const DistTensor& a, const std::vector<int64_t>& dims, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < a.dim(); ++d) out.push_back(d);
    return out;
  }
  std::set<int64_t> seen;
  for (int64_t d : dims) {
    const int64_t nd = normalize_dim(d, a.dim(), op);
    DT_CHECK_ARG(seen.insert(nd).second, op, "dim ", nd, " appears twice in ", Shape(dims));
    out.push_back(nd);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// The gradient of a reduction, shaped back to the input: put the reduced dims back
// (size 1) and stretch.
DistTensor expand_back(const DistTensor& g, const Shape& input_shape, const std::vector<int64_t>& dims, bool keepdim) {
  DistTensor out = g;
  if (!keepdim) {
    for (int64_t d : dims) out = unsqueeze(out, d);
  }
  return expand(out, input_shape);
}

enum class Kind { Sum, Max, Min };

DistTensor reduce(Kind kind, const char* op, const DistTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  const std::string in = ops::letters(a.dim());
  std::string out_letters;
  for (int64_t d = 0; d < a.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) out_letters += in[d];
    else if (keepdim) out_letters += '_';
  }
  dispatch::EinsumSpec spec;
  spec.inputs = {in};
  spec.output = out_letters;
  spec.contraction = kind == Kind::Sum ? ReduceOp::Sum : kind == Kind::Max ? ReduceOp::Max : ReduceOp::Min;
  // A Partial(sum) input passes through a sum; max/min pass their own kind.
  spec.partial = kind == Kind::Sum ? dispatch::PartialRule::OneOf : dispatch::PartialRule::None;
  std::vector<int64_t> attributes = dims;
  attributes.push_back(keepdim);
  attributes.push_back(static_cast<int64_t>(kind));
  const Shape out_shape = reduced_shape(a.shape(), dims, keepdim);
  return ops::run_einsum(op, attributes, {a}, spec, out_shape, [kind, dims, keepdim](const std::vector<Tensor>& l) {
    const Tensor& x = l[0];
    if (kind == Kind::Sum) return sum(x, dims, keepdim);
    // An empty local piece (an uneven shard) contributes the identity.
    bool empty = false;
    for (int64_t d : dims) empty |= x.size(d) == 0;
    if (empty) {
      const ReduceOp op = kind == Kind::Max ? ReduceOp::Max : ReduceOp::Min;
      return Tensor::full(reduced_shape(x.shape(), dims, keepdim), redistribution::reduce_identity(op, x.dtype()),
                          x.dtype(), x.device());
    }
    return kind == Kind::Max ? amax(x, dims, keepdim) : amin(x, dims, keepdim);
  });
}

DistTensor extreme(Kind kind, const char* op, const DistTensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  const std::vector<int64_t> dims = normalized_dims(a, dims_in, op);
  DistTensor out = reduce(kind, op, a, dims, keepdim);
  if (!autograd::needs_grad({a})) return out;
  const DistTensor sa = a.detach(), so = out.detach();
  return with_grad(out, op, {a}, [sa, so, dims, keepdim](const Grads& g) {
    // The gradient goes to the elements equal to the extreme, split evenly on ties.
    const DistTensor hit = ops::cast(eq(sa, expand_back(so, sa.shape(), dims, keepdim)), g[0].dtype());
    const DistTensor count = expand_back(sum(hit, dims, keepdim), sa.shape(), dims, keepdim);
    return Grads{div(mul(expand_back(g[0], sa.shape(), dims, keepdim), hit), count)};
  });
}

}  // namespace

DistTensor sum(const DistTensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  const std::vector<int64_t> dims = normalized_dims(a, dims_in, "sum");
  DistTensor out = reduce(Kind::Sum, "sum", a, dims, keepdim);
  if (!autograd::needs_grad({a})) return out;
  const Shape shape = a.shape();
  return with_grad(out, "sum", {a}, [shape, dims, keepdim](const Grads& g) {
    return Grads{expand_back(g[0], shape, dims, keepdim)};
  });
}

DistTensor mean(const DistTensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  DT_CHECK_ARG(is_floating(a.dtype()), "mean", "expected a floating dtype, got ", dtype_name(a.dtype()));
  const std::vector<int64_t> dims = normalized_dims(a, dims_in, "mean");
  int64_t count = 1;
  for (int64_t d : dims) count *= a.size(d);
  return div(sum(a, dims, keepdim), static_cast<double>(std::max<int64_t>(count, 1)));
}

DistTensor amax(const DistTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(Kind::Max, "amax", a, dims, keepdim);
}

DistTensor amin(const DistTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(Kind::Min, "amin", a, dims, keepdim);
}

}  // namespace dtensor
