// Shape ops that only relabel or add size-1 dims: transpose, permute, unsqueeze,
// squeeze, expand. Their rules are einsum relabellings (a dim keeps its sharding
// wherever it moves; size-1 and stretched dims are never sharded), so they never
// communicate unless an input is sharded on a dim that disappears or stretches.
#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {

using ops::with_grad;
using Grads = std::vector<DistTensor>;

namespace {

// Partial values pass through: each of these is linear.
DistTensor relabel(const char* op, const std::vector<int64_t>& attributes, const DistTensor& a,
                   const std::string& in_letters, const std::string& out_letters, const Shape& out_shape,
                   const ops::LocalFn& local) {
  dispatch::EinsumSpec spec;
  spec.inputs = {in_letters};
  spec.output = out_letters;
  spec.partial = dispatch::PartialRule::OneOf;
  return ops::run_einsum(op, attributes, {a}, spec, out_shape, local);
}

}  // namespace

DistTensor permute(const DistTensor& a, const std::vector<int64_t>& dims) {
  DT_CHECK_ARG(static_cast<int64_t>(dims.size()) == a.dim(), "permute", "expected ", a.dim(), " dims, got ",
               Shape(dims));
  const std::string in = ops::letters(a.dim());
  std::string out;
  Shape out_shape;
  std::vector<int64_t> normalized, inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], a.dim(), "permute");
    DT_CHECK_ARG(out.find(in[d]) == std::string::npos, "permute", "dims must be a permutation, got ", Shape(dims));
    out += in[d];
    out_shape.push_back(a.size(d));
    normalized.push_back(d);
    inverse[d] = static_cast<int64_t>(i);
  }
  // A view, as on local tensors: GEMMs read transposed operands in place, and
  // kernels that need contiguous data copy where they must.
  DistTensor result = relabel("permute", normalized, a, in, out, out_shape,
                              [normalized](const std::vector<Tensor>& l) { return l[0].permute(normalized); });
  if (!autograd::needs_grad({a})) return result;
  return with_grad(result, "permute", {a}, [inverse](const Grads& g) { return Grads{permute(g[0], inverse)}; });
}

DistTensor transpose(const DistTensor& a, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(a.dim());
  for (int64_t i = 0; i < a.dim(); ++i) dims[i] = i;
  std::swap(dims[normalize_dim(dim0, a.dim(), "transpose")], dims[normalize_dim(dim1, a.dim(), "transpose")]);
  return permute(a, dims);
}

DistTensor unsqueeze(const DistTensor& a, int64_t dim) {
  const int64_t d = normalize_dim(dim, a.dim() + 1, "unsqueeze");
  const std::string in = ops::letters(a.dim());
  std::string out = in;
  out.insert(out.begin() + d, '_');
  Shape out_shape = a.shape();
  out_shape.insert(out_shape.begin() + d, 1);
  DistTensor result = relabel("unsqueeze", {d}, a, in, out, out_shape,
                              [d](const std::vector<Tensor>& l) { return l[0].unsqueeze(d); });
  if (!autograd::needs_grad({a})) return result;
  return with_grad(result, "unsqueeze", {a}, [d](const Grads& g) { return Grads{squeeze(g[0], d)}; });
}

DistTensor squeeze(const DistTensor& a, int64_t dim) {
  const int64_t d = normalize_dim(dim, a.dim(), "squeeze");
  if (a.size(d) != 1) return a;  // as on local tensors: a no-op
  std::string in = ops::letters(a.dim());
  std::string out = in;
  out.erase(out.begin() + d);
  in[d] = '_';
  Shape out_shape = a.shape();
  out_shape.erase(out_shape.begin() + d);
  DistTensor result = relabel("squeeze", {d}, a, in, out, out_shape,
                              [d](const std::vector<Tensor>& l) { return l[0].squeeze(d); });
  if (!autograd::needs_grad({a})) return result;
  return with_grad(result, "squeeze", {a}, [d](const Grads& g) { return Grads{unsqueeze(g[0], d)}; });
}

DistTensor expand(const DistTensor& a, const Shape& shape) {
  DT_CHECK_ARG(shape.size() >= static_cast<size_t>(a.dim()), "expand", "cannot expand ", a.shape(), " to ", shape,
               ": the target has fewer dims");
  Shape target = shape;
  const size_t lead = shape.size() - a.dim();
  for (size_t i = lead; i < shape.size(); ++i) {
    if (target[i] == -1) target[i] = a.size(static_cast<int64_t>(i - lead));
    DT_CHECK_ARG(target[i] == a.size(static_cast<int64_t>(i - lead)) || a.size(static_cast<int64_t>(i - lead)) == 1,
                 "expand", "cannot expand ", a.shape(), " to ", shape, ": dim ", i, " has size ",
                 a.size(static_cast<int64_t>(i - lead)), " (only size-1 dims stretch)");
  }
  if (target == a.shape()) return a;
  const std::string in = dispatch::broadcast_letters(a.shape(), target);
  // A replicated piece stays a view (the caller reads it); it is materialised only
  // where a kernel needs contiguous data.
  // Locally: stretched and new dims take the target size (they are never sharded);
  // every other dim keeps the local size of the input's piece.
  DistTensor result = relabel("expand", target, a, in, ops::letters(static_cast<int64_t>(target.size())), target,
                              [target, in](const std::vector<Tensor>& l) {
                                Shape local = target;
                                const size_t lead = target.size() - in.size();
                                for (size_t i = 0; i < in.size(); ++i) {
                                  if (in[i] != '_') local[lead + i] = l[0].size(static_cast<int64_t>(i));
                                }
                                return l[0].expand(local);
                              });
  if (!autograd::needs_grad({a})) return result;
  const Shape original = a.shape();
  return with_grad(result, "expand", {a}, [original](const Grads& g) { return Grads{ops::sum_to(g[0], original)}; });
}

}  // namespace dtensor
