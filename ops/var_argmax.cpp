// var and argmax on DistTensors.
//
// var is a composite (mean, sub, square, sum): the mean divides by the global count
// and the final division by (global count - correction), so it is exact on uneven
// shards; a sharded reduced dim leaves Partial(sum) squared deviations for whoever
// needs the value (the mean itself is all-reduced, as sub needs it replicated).
//
// argmax along an unsharded dim is the local kernel with the other dims keeping
// their sharding. Along a sharded dim the tensor is never gathered: the global
// maximum comes from amax (Partial(max) -> all-reduce of the reduced-size tensor),
// each rank takes the first global index where its shard equals it (its local
// index plus its shard offset; a sentinel where it has none), and an all-reduce of
// Min over the mesh dims that shard the dim picks the first one globally.
#include <algorithm>
#include <cassert>
#include <set>

#include "ops/nn_helpers.h"
#include "util/check.h"

namespace dtensor {

namespace {

// Sorted, checked reduce dims ({} = all) and the number of elements they span.
std::pair<std::vector<int64_t>, int64_t> reduce_dims(const DistTensor& a, const std::vector<int64_t>& dims,
                                                     const char* op) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t d : dims) {
    const int64_t nd = normalize_dim(d, a.dim(), op);
    DT_CHECK_ARG(seen.insert(nd).second, op, "expected distinct dims, got dim ", nd, " twice in ", Shape(dims));
    out.push_back(nd);
  }
  if (dims.empty()) {
    for (int64_t d = 0; d < a.dim(); ++d) out.push_back(d);
  }
  std::sort(out.begin(), out.end());
  int64_t count = 1;
  for (int64_t d : out) count *= a.size(d);
  return {out, count};
}

Shape argmax_shape(const Shape& shape, int64_t dim, bool keepdim) {
  Shape out = shape;
  if (out.empty()) return out;
  if (keepdim) out[static_cast<size_t>(dim)] = 1;
  else out.erase(out.begin() + dim);
  return out;
}

// Dim unsharded (or the tensor 0-d): the local kernel; a sharding of `dim` would be
// redistributed away by the rule (the letter is unshardable), which the caller
// avoids by taking the distributed path instead.
DistTensor local_argmax(const DistTensor& a, int64_t dim, bool keepdim) {
  const std::string in = ops::letters(a.dim());
  dispatch::EinsumSpec spec;
  spec.inputs = {in};
  spec.output = in;
  if (a.dim() > 0) {
    spec.unshardable = std::string(1, in[static_cast<size_t>(dim)]);
    if (keepdim) spec.output[static_cast<size_t>(dim)] = '_';
    else spec.output.erase(spec.output.begin() + dim);
  }
  return ops::run_einsum("argmax", {dim, keepdim}, {a}, spec, argmax_shape(a.shape(), dim, keepdim),
                         [dim, keepdim](const std::vector<Tensor>& l) { return argmax(l[0], dim, keepdim); });
}

DistTensor sharded_argmax(const DistTensor& a, int64_t dim, bool keepdim) {
  const DistTensor x = ops::without_partials(a);
  const DeviceMesh& mesh = x.mesh();
  // The global maximum, replicated over the mesh dims that shard `dim` and laid out
  // like x elsewhere (amax keeps x's layout: that strategy costs nothing).
  const DistTensor top = amax(x, {dim}, true);
  const Tensor top_local = top.redistribute(ops::partials_replicated(top.placements())).to_local();
  const Tensor& local = x.to_local();
  assert(top_local.dim() == local.dim());
  const int64_t extent = x.size(dim);  // no global index reaches it: the "none here" sentinel
  Shape reduced = local.shape();
  reduced[static_cast<size_t>(dim)] = 1;
  Tensor first;
  if (local.size(dim) == 0) {
    first = Tensor::full(reduced, static_cast<double>(extent), DType::I64, local.device());
  } else {
    Shape column(static_cast<size_t>(local.dim()), 1);
    column[static_cast<size_t>(dim)] = local.size(dim);
    const int64_t offset = ops::shard_offset(mesh, x.shape(), x.placements(), dim);
    const Tensor positions = add(Tensor::arange(local.size(dim), DType::I64, local.device()), static_cast<double>(offset))
                                 .reshape(column);
    const Tensor sentinel = Tensor::full({}, static_cast<double>(extent), DType::I64, local.device());
    first = amin(where(eq(local, top_local), positions, sentinel), {dim}, true);
  }
  Placements placements = x.placements();
  for (int m = 0; m < mesh.ndim(); ++m) {
    Placement& p = placements[static_cast<size_t>(m)];
    if (p.is_shard(dim)) {
      first = all_reduce(mesh.group(m), first, ReduceOp::Min);
      p = Replicate();
    } else if (p.is_shard() && !keepdim && p.dim() > dim) {
      p = Shard(p.dim() - 1, p.order());
    }
  }
  if (!keepdim) first = first.squeeze(dim);
  return dispatch::wrap(first, mesh, placements, argmax_shape(x.shape(), dim, keepdim));
}

}  // namespace

DistTensor var(const DistTensor& a_in, const std::vector<int64_t>& dims_in, int64_t correction, bool keepdim) {
  DT_CHECK_ARG(a_in.defined(), "var", "expected a defined DistTensor, got an undefined one");
  DT_CHECK_ARG(correction >= 0, "var", "expected correction >= 0, got ", correction);
  // Integer inputs give F32, as the local var.
  const DistTensor a = is_floating(a_in.dtype()) ? a_in : ops::cast(a_in, DType::F32);
  const auto [dims, count] = reduce_dims(a, dims_in, "var");
  const DistTensor centered = sub(a, mean(a, dims, true));
  const DistTensor squares = sum(square(centered), dims, keepdim);
  // As the local kernel and torch: a non-positive denominator gives inf/nan.
  return div(squares, static_cast<double>(std::max<int64_t>(0, count - correction)));
}

DistTensor argmax(const DistTensor& a, int64_t dim_in, bool keepdim) {
  DT_CHECK_ARG(a.defined(), "argmax", "expected a defined DistTensor, got an undefined one");
  const int64_t dim = normalize_dim(dim_in, a.dim(), "argmax");
  DT_CHECK_ARG(a.dim() == 0 || a.size(dim) > 0, "argmax", "expected a non-empty dim ", dim, ", got shape ",
               a.shape());
  // An integer result: nothing to differentiate, nothing recorded.
  NoGradGuard no_grad;
  if (a.dim() > 0 && ops::is_sharded_on(a.placements(), dim)) return sharded_argmax(a, dim, keepdim);
  return local_argmax(a, dim, keepdim);
}

}  // namespace dtensor
