// Shared machinery of the op families: einsum-driven dispatch and broadcasting.
#include "ops/op_helpers.h"

#include "util/check.h"

namespace dtensor::ops {

std::string letters(int64_t ndim) {
  std::string out;
  for (int64_t i = 0; i < ndim; ++i) out += static_cast<char>('a' + i);
  return out;
}

DistTensor run_with_strategy(const std::vector<DistTensor>& inputs, const dispatch::Strategy& strategy,
                             const Shape& out_shape, const LocalFn& local) {
  return dispatch::wrap(local(dispatch::local_inputs(strategy, inputs)), inputs[0].mesh(), strategy.output,
                        out_shape);
}

DistTensor run_einsum(const char* op, const std::vector<int64_t>& attributes,
                      const std::vector<DistTensor>& inputs, const dispatch::EinsumSpec& spec,
                      const Shape& out_shape, const LocalFn& local) {
  return run_einsum_lazy(op, attributes, inputs, [&] { return spec; }, out_shape, local);
}

DistTensor run_pointwise(const char* op, const std::vector<int64_t>& attributes,
                         const std::vector<DistTensor>& inputs, dispatch::PartialRule partial,
                         std::vector<bool> partial_inputs, const LocalFn& local) {
  Shape out_shape = inputs[0].shape();
  for (size_t j = 1; j < inputs.size(); ++j) {
    if (inputs[j].shape() != out_shape) out_shape = broadcast_shapes(out_shape, inputs[j].shape(), op);
  }
  return run_einsum_lazy(
      op, attributes, inputs,
      [&] {
        dispatch::EinsumSpec spec;
        for (const DistTensor& t : inputs) spec.inputs.push_back(dispatch::broadcast_letters(t.shape(), out_shape));
        spec.output = letters(static_cast<int64_t>(out_shape.size()));
        spec.partial = partial;
        spec.partial_inputs = partial_inputs;
        return spec;
      },
      out_shape, local);
}

DistTensor sum_to(const DistTensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> leading, stretched;
  for (int64_t d = 0; d < lead; ++d) leading.push_back(d);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1 && grad.shape()[lead + d] != 1) stretched.push_back(static_cast<int64_t>(d));
  }
  DistTensor out = leading.empty() ? grad : sum(grad, leading, false);
  return stretched.empty() ? out : sum(out, stretched, true);
}

DistTensor cast(const DistTensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  // A Partial passes through a cast between floating dtypes only: truncating partial
  // sums to integers is not linear.
  const dispatch::PartialRule partial =
      is_floating(a.dtype()) && is_floating(dtype) ? dispatch::PartialRule::OneOf : dispatch::PartialRule::None;
  DistTensor out = run_pointwise("cast", {static_cast<int64_t>(dtype)}, {a}, partial, {},
                                 [dtype](const std::vector<Tensor>& l) { return l[0].to(dtype); });
  const DType from = a.dtype();
  return with_grad(out, "cast", {a}, [from](const std::vector<DistTensor>& g) {
    return std::vector<DistTensor>{cast(g[0], from)};
  });
}

DistTensor to_device(const DistTensor& a, Device device) {
  DT_CHECK_ARG(a.defined(), "to(Device)", "expected a defined DistTensor, got an undefined one");
  if (a.device() == device) return a;
  DistTensor out = DistTensor::from_local(a.to_local().to(device), a.mesh(), a.placements(), a.shape());
  const Device from = a.device();
  return with_grad(out, "to_device", {a},
                   [from](const std::vector<DistTensor>& g) { return std::vector<DistTensor>{to_device(g[0], from)}; });
}

}  // namespace dtensor::ops

namespace dtensor {
DistTensor DistTensor::to(DType dtype) const { return ops::cast(*this, dtype); }
DistTensor DistTensor::to(Device device) const { return ops::to_device(*this, device); }
}  // namespace dtensor
