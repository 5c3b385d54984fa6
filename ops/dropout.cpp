// dropout on DistTensors with layout-independent randomness.
//
// Element i of the global tensor (row-major) is kept when
// random::uniform(seed, i) >= p, and scaled by 1/(1-p). Each rank computes the
// global index of each of its local elements from its block (local_block), so the
// mask is the same for any mesh and placement, with no communication. A Partial
// input keeps its placements: every coordinate applies the same mask, and dropout
// is linear in its input. The backward applies the same mask to the gradient, in
// whatever layout the gradient has (the mask is a function of the global index).
#include "dtensor/random.h"
#include "ops/nn_helpers.h"
#include "util/check.h"

namespace dtensor {

namespace {

// 1/(1-p) where element is kept, 0 where dropped, for this rank's block of `t`.
Tensor local_mask(const DistTensor& t, double p, uint64_t seed) {
  const Tensor& local = t.to_local();
  const Shape& shape = t.shape();
  const std::vector<Range> block = local_block(shape, t.mesh().shape(), t.placements(), t.mesh().coordinate());
  const size_t ndim = shape.size();
  std::vector<int64_t> global_stride(ndim, 1);
  for (size_t d = ndim; d-- > 1;) global_stride[d - 1] = global_stride[d] * shape[d];
  const double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
  std::vector<double> values(static_cast<size_t>(local.numel()));
  std::vector<int64_t> index(ndim, 0);  // the local multi-index, row-major odometer
  for (double& value : values) {
    int64_t global = 0;
    for (size_t d = 0; d < ndim; ++d) global += (block[d].offset + index[d]) * global_stride[d];
    value = random::uniform(seed, static_cast<uint64_t>(global)) >= p ? scale : 0.0;
    for (size_t d = ndim; d-- > 0;) {
      if (++index[d] < local.size(static_cast<int64_t>(d))) break;
      index[d] = 0;
    }
  }
  return Tensor::from_vector(values, local.shape()).to(local.dtype()).to(local.device());
}

DistTensor apply_mask(const DistTensor& t, double p, uint64_t seed) {
  return dispatch::wrap(mul(t.to_local(), local_mask(t, p, seed)), t.mesh(), t.placements(), t.shape());
}

}  // namespace

DistTensor dropout(const DistTensor& a, double p, uint64_t seed, bool training) {
  DT_CHECK_ARG(a.defined(), "dropout", "expected a defined DistTensor, got an undefined one");
  DT_CHECK_ARG(p >= 0 && p <= 1, "dropout", "expected p in [0, 1], got ", p);
  DT_CHECK_ARG(is_floating(a.dtype()), "dropout", "expected a floating dtype, got ", dtype_name(a.dtype()));
  if (!training || p == 0) return a;
  DistTensor out = apply_mask(a, p, seed);
  if (!autograd::needs_grad({a})) return out;
  return ops::with_grad(out, "dropout", {a}, [p, seed](const std::vector<DistTensor>& g) {
    return std::vector<DistTensor>{apply_mask(g[0], p, seed)};
  });
}

}  // namespace dtensor
