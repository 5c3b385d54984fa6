// Helpers shared by the op families in ops/ (internal).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dist_tensor/dispatch.h"
#include "dtensor/autograd.h"
#include "dtensor/ops.h"
#include "dtensor/trace.h"

namespace dtensor::ops {

using LocalFn = std::function<Tensor(const std::vector<Tensor>& locals)>;

// Runs an op described by an einsum spec: choose (cached) strategy, redistribute,
// run `local` on the local tensors, wrap with the output placements and `out_shape`.
// No autograd: callers record their own backward.
DistTensor run_einsum(const char* op, const std::vector<int64_t>& attributes, const std::vector<DistTensor>& inputs,
                      const dispatch::EinsumSpec& spec, const Shape& out_shape, const LocalFn& local);

// The same with the spec built only on a strategy-cache miss (hot ops: a hit then
// builds no strings).
DistTensor run_with_strategy(const std::vector<DistTensor>& inputs, const dispatch::Strategy& strategy,
                             const Shape& out_shape, const LocalFn& local);
template <class SpecFn>
DistTensor run_einsum_lazy(const char* op, const std::vector<int64_t>& attributes,
                           const std::vector<DistTensor>& inputs, SpecFn&& spec_fn, const Shape& out_shape,
                           const LocalFn& local) {
  TraceSpan span(op, "op");
  dispatch::common_mesh(inputs, op);
  const dispatch::Strategy& strategy = dispatch::cached_strategy(
      op, attributes, inputs,
      [&](const std::vector<DistTensor>& in) { return dispatch::einsum_strategies(spec_fn(), in, out_shape); });
  return run_with_strategy(inputs, strategy, out_shape, local);
}

// A pointwise op over broadcast inputs (NumPy alignment): the output has the
// broadcast shape and the letters "abc..." of its dims.
DistTensor run_pointwise(const char* op, const std::vector<int64_t>& attributes, const std::vector<DistTensor>& inputs,
                         dispatch::PartialRule partial, std::vector<bool> partial_inputs, const LocalFn& local);

// The gradient `grad` of a broadcast result summed back to `shape` (the inverse of
// broadcasting: leading dims and stretched size-1 dims are summed).
DistTensor sum_to(const DistTensor& grad, const Shape& shape);

// gelu's input gradient g * gelu'(a) (a pointwise op: a Partial is reduced first).
DistTensor gelu_backward(const DistTensor& g, const DistTensor& a, GeluApprox approx);

// The same values in another dtype (placements unchanged).
DistTensor cast(const DistTensor& a, DType dtype);

// The same values on another device (placements unchanged): a local copy on every
// rank, no communication.
DistTensor to_device(const DistTensor& a, Device device);

// Records a single-output op's backward.
inline DistTensor with_grad(DistTensor out, const std::string& name, const std::vector<DistTensor>& inputs,
                            autograd::BackwardFn backward) {
  std::vector<DistTensor> outs{out};
  autograd::record(name, inputs, outs, std::move(backward));
  return outs[0];
}

// The letters "abc..." for a tensor of `ndim` dims.
std::string letters(int64_t ndim);

}  // namespace dtensor::ops
