// Shape ops that cut or join along one dim: slice, cat, stack, split, chunk.
//
// Rule: the dim being cut or joined must be whole on every rank (replicated across
// the mesh); every other dim keeps its sharding, since cutting along one dim does
// not move data along the others. A sharded cut dim is made whole first (a shard of
// a slice or of a piece does not line up with the chunk rule's shards of the
// result); the dispatch picks the cheapest way: an all-to-all onto another dim, or
// an all-gather. All of these ops are linear, so Partial passes through (cat needs
// every input Partial alike: cat(P, R) would sum the R part over the ranks).
//
// Backward: slice scatters its gradient into zeros of the input shape; cat splits
// its gradient; split and chunk cat their pieces' gradients, zeros where a piece got
// none; stack is unsqueeze + cat and differentiates through them.
#include <algorithm>
#include <numeric>

#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {

using Grads = std::vector<DistTensor>;

namespace {

// Letters for every dim of a tensor of `ndim` dims, all shardable but `dim`.
dispatch::EinsumSpec along_dim_spec(int64_t ndim, int64_t dim, size_t num_inputs, dispatch::PartialRule partial) {
  dispatch::EinsumSpec spec;
  const std::string letters = ops::letters(ndim);
  spec.inputs.assign(num_inputs, letters);
  spec.output = letters;
  spec.unshardable = std::string(1, letters[static_cast<size_t>(dim)]);
  spec.partial = partial;
  return spec;
}

// Local cat: copies each piece into its place in one new tensor.
Tensor cat_local(const std::vector<Tensor>& pieces, int64_t dim) {
  Shape shape = pieces[0].shape();
  shape[dim] = 0;
  for (const Tensor& p : pieces) shape[dim] += p.size(dim);
  Tensor out = Tensor::empty(shape, pieces[0].dtype(), pieces[0].device());
  int64_t offset = 0;
  for (const Tensor& p : pieces) {
    if (p.size(dim) > 0) out.narrow(dim, offset, p.size(dim)).copy_(p);
    offset += p.size(dim);
  }
  return out;
}

struct SliceBounds {
  int64_t start, end, step, length;
};

// Python bounds as Tensor::slice: negative counts from the end, then clamp to [0, n].
SliceBounds slice_bounds(int64_t n, int64_t start, int64_t end, int64_t step) {
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t lo = clamp(start), hi = std::max(clamp(end), lo);
  return {lo, hi, step, (hi - lo + step - 1) / step};
}

DistTensor slice_backward(const DistTensor& grad, const Shape& input_shape, int64_t dim, const SliceBounds& b);

DistTensor slice_normalized(const DistTensor& a, int64_t dim, const SliceBounds& b) {
  Shape out_shape = a.shape();
  out_shape[dim] = b.length;
  const dispatch::EinsumSpec spec = along_dim_spec(a.dim(), dim, 1, dispatch::PartialRule::OneOf);
  DistTensor out =
      ops::run_einsum("slice", {dim, b.start, b.end, b.step}, {a}, spec, out_shape,
                      [dim, b](const std::vector<Tensor>& l) { return l[0].slice(dim, b.start, b.end, b.step); });
  if (!autograd::needs_grad({a})) return out;
  const Shape input_shape = a.shape();
  return ops::with_grad(out, "slice", {a}, [input_shape, dim, b](const Grads& g) {
    return Grads{slice_backward(g[0], input_shape, dim, b)};
  });
}

// The slice's gradient written into zeros of the input shape (its own backward is
// the slice again, so double backward works).
DistTensor slice_backward(const DistTensor& grad, const Shape& input_shape, int64_t dim, const SliceBounds& b) {
  const dispatch::EinsumSpec spec = along_dim_spec(grad.dim(), dim, 1, dispatch::PartialRule::OneOf);
  const int64_t full = input_shape[dim];
  DistTensor out = ops::run_einsum("slice_backward", {dim, b.start, b.end, b.step, full}, {grad}, spec, input_shape,
                                   [dim, b, full](const std::vector<Tensor>& l) {
                                     Shape shape = l[0].shape();
                                     shape[dim] = full;
                                     Tensor zeros = Tensor::zeros(shape, l[0].dtype(), l[0].device());
                                     if (b.length > 0) zeros.slice(dim, b.start, b.end, b.step).copy_(l[0]);
                                     return zeros;
                                   });
  if (!autograd::needs_grad({grad})) return out;
  return ops::with_grad(out, "slice_backward", {grad},
                        [dim, b](const Grads& g) { return Grads{slice_normalized(g[0], dim, b)}; });
}

// split and chunk: one op with several outputs, each a local view of its piece.
std::vector<DistTensor> split_as(const DistTensor& a, const std::vector<int64_t>& sizes, int64_t dim, const char* op) {
  int64_t total = 0;
  for (int64_t s : sizes) {
    DT_CHECK_ARG(s >= 0, op, "expected sizes >= 0, got ", Shape(sizes));
    total += s;
  }
  DT_CHECK_ARG(total == a.size(dim), op, "expected sizes that add up to ", a.size(dim), " (dim ", dim, " of ",
               a.shape(), "), got ", Shape(sizes), " (sum ", total, ")");
  const DeviceMesh& mesh = a.mesh();
  std::vector<int64_t> attributes{dim};
  attributes.insert(attributes.end(), sizes.begin(), sizes.end());
  const dispatch::Strategy& strategy =
      dispatch::cached_strategy(op, attributes, {a}, [&](const std::vector<DistTensor>& in) {
        return dispatch::einsum_strategies(along_dim_spec(a.dim(), dim, 1, dispatch::PartialRule::OneOf), in);
      });
  const Tensor local = dispatch::local_inputs(strategy, {a})[0];
  // The split dim is whole locally, so the local pieces have the global sizes there.
  const std::vector<Tensor> pieces = local.split(sizes, dim);
  std::vector<DistTensor> outs;
  outs.reserve(pieces.size());
  for (size_t p = 0; p < pieces.size(); ++p) {
    Shape shape = a.shape();
    shape[dim] = sizes[p];
    outs.push_back(dispatch::wrap(pieces[p], mesh, strategy.output, shape));
  }
  if (!autograd::needs_grad({a})) return outs;
  const Shape shape = a.shape();
  autograd::record(op, {a}, outs, [shape, sizes, dim](const Grads& g) {
    auto present = std::find_if(g.begin(), g.end(), [](const DistTensor& t) { return t.defined(); });
    if (present == g.end()) return Grads{DistTensor()};
    // Pieces that got no gradient contribute zeros, laid out like a piece that did
    // (Partial made Replicate: zeros are zeros either way) so cat moves little.
    Placements layout = present->placements();
    for (Placement& p : layout) {
      if (p.is_partial()) p = Replicate();
    }
    Grads filled;
    for (size_t p = 0; p < g.size(); ++p) {
      if (g[p].defined()) {
        filled.push_back(g[p]);
        continue;
      }
      Shape piece = shape;
      piece[dim] = sizes[p];
      filled.push_back(zeros(piece, present->mesh(), layout, present->dtype(), present->device()));
    }
    return Grads{cat(filled, dim)};
  });
  return outs;
}

}  // namespace

DistTensor slice(const DistTensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  DT_CHECK_ARG(a.defined(), "slice", "expected a defined DistTensor");
  const int64_t d = normalize_dim(dim, a.dim(), "slice");
  DT_CHECK_ARG(step > 0, "slice", "expected step > 0, got ", step);
  return slice_normalized(a, d, slice_bounds(a.size(d), start, end, step));
}

DistTensor cat(const std::vector<DistTensor>& tensors, int64_t dim) {
  DT_CHECK_ARG(!tensors.empty(), "cat", "expected at least one tensor, got none");
  dispatch::common_mesh(tensors, "cat");
  const DistTensor& first = tensors[0];
  DT_CHECK_ARG(first.dim() > 0, "cat", "expected tensors with at least one dim, got a 0-dim tensor");
  const int64_t d = normalize_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  std::vector<int64_t> sizes;
  for (size_t j = 0; j < tensors.size(); ++j) {
    const DistTensor& t = tensors[j];
    DT_CHECK_ARG(t.dtype() == first.dtype(), "cat", "expected every tensor in ", dtype_name(first.dtype()),
                 " (the dtype of tensor 0), got ", dtype_name(t.dtype()), " for tensor ", j);
    bool same = t.dim() == first.dim();
    for (int64_t k = 0; same && k < t.dim(); ++k) same = k == d || t.size(k) == first.size(k);
    DT_CHECK_ARG(same, "cat", "expected tensor ", j, " to match ", first.shape(), " (tensor 0) except in dim ", d,
                 ", got ", t.shape());
    sizes.push_back(t.size(d));
    out_shape[d] += t.size(d);
  }
  const dispatch::EinsumSpec spec = along_dim_spec(first.dim(), d, tensors.size(), dispatch::PartialRule::AllSame);
  DistTensor out = ops::run_einsum("cat", {d}, tensors, spec, out_shape,
                                   [d](const std::vector<Tensor>& l) { return cat_local(l, d); });
  if (!autograd::needs_grad(tensors)) return out;
  return ops::with_grad(out, "cat", tensors, [sizes, d](const Grads& g) { return split(g[0], sizes, d); });
}

DistTensor stack(const std::vector<DistTensor>& tensors, int64_t dim) {
  DT_CHECK_ARG(!tensors.empty(), "stack", "expected at least one tensor, got none");
  dispatch::common_mesh(tensors, "stack");
  const Shape& shape = tensors[0].shape();
  for (size_t j = 1; j < tensors.size(); ++j) {
    DT_CHECK_ARG(tensors[j].shape() == shape, "stack", "expected every tensor to have shape ", shape,
                 " (the shape of tensor 0), got ", tensors[j].shape(), " for tensor ", j);
  }
  const int64_t d = normalize_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<DistTensor> expanded;
  expanded.reserve(tensors.size());
  for (const DistTensor& t : tensors) expanded.push_back(unsqueeze(t, d));
  return cat(expanded, d);
}

std::vector<DistTensor> split(const DistTensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  DT_CHECK_ARG(a.defined(), "split", "expected a defined DistTensor");
  return split_as(a, sizes, normalize_dim(dim, a.dim(), "split"), "split");
}

std::vector<DistTensor> chunk(const DistTensor& a, int64_t k, int64_t dim) {
  DT_CHECK_ARG(a.defined(), "chunk", "expected a defined DistTensor");
  const int64_t d = normalize_dim(dim, a.dim(), "chunk");
  DT_CHECK_ARG(k >= 1, "chunk", "expected k >= 1 pieces, got ", k);
  // The DESIGN chunk rule: always k pieces, trailing ones short or empty.
  return split_as(a, chunk_sizes(a.size(d), k), d, "chunk");
}

}  // namespace dtensor
