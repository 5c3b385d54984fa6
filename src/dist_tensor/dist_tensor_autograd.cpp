// DistTensor's autograd members and fluent op forms (they forward to autograd.h and
// ops.h).
#include "dist_tensor/dist_tensor_impl.h"
#include "dtensor/autograd.h"
#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor {

bool DistTensor::requires_grad() const {
  return impl_ && impl_->autograd && impl_->autograd->requires_grad;
}

DistTensor& DistTensor::set_requires_grad(bool enabled) {
  DT_CHECK_ARG(defined(), "set_requires_grad", "expected a defined DistTensor");
  DT_CHECK_ARG(is_leaf(), "set_requires_grad", "only leaves can change requires_grad; this tensor comes from ",
               grad_fn_name(), " (use detach())");
  DT_CHECK_ARG(!enabled || is_floating(dtype()), "set_requires_grad",
               "only floating tensors can require gradients, got ", dtype_name(dtype()));
  if (!impl_->autograd) impl_->autograd = std::make_shared<AutogradMeta>();
  impl_->autograd->requires_grad = enabled;
  return *this;
}

bool DistTensor::is_leaf() const { return !impl_ || !impl_->autograd || !impl_->autograd->grad_fn; }

DistTensor DistTensor::grad() const { return impl_ && impl_->autograd ? impl_->autograd->grad : DistTensor(); }

void DistTensor::set_grad(const DistTensor& grad) const {
  DT_CHECK_ARG(defined(), "set_grad", "expected a defined DistTensor");
  DT_CHECK_ARG(!grad.defined() || grad.shape() == shape(), "set_grad", "gradient shape ",
               grad.defined() ? grad.shape() : Shape{}, " differs from the tensor's ", shape());
  if (!impl_->autograd) impl_->autograd = std::make_shared<AutogradMeta>();
  impl_->autograd->grad = grad;
}

void DistTensor::zero_grad() const {
  if (impl_ && impl_->autograd) impl_->autograd->grad = DistTensor();
}

DistTensor DistTensor::detach() const {
  auto impl = std::make_shared<Impl>();
  impl->local = local_of(*this);
  impl->mesh = mesh();
  impl->placements = placements();
  impl->global_shape = shape();
  impl->plan_tag = impl_ ? impl_->plan_tag : 0;  // the same tensor: a plan moves both
  return DistTensor(std::move(impl));
}

std::string DistTensor::grad_fn_name() const {
  return is_leaf() ? std::string() : impl_->autograd->grad_fn->name();
}

void DistTensor::backward(const DistTensor& grad, bool retain_graph) const {
  dtensor::backward(*this, grad, retain_graph);
}

DistTensor DistTensor::matmul(const DistTensor& other) const { return dtensor::matmul(*this, other); }
DistTensor DistTensor::relu() const { return dtensor::relu(*this); }
DistTensor DistTensor::gelu() const { return dtensor::gelu(*this); }
DistTensor DistTensor::silu() const { return dtensor::silu(*this); }
DistTensor DistTensor::exp() const { return dtensor::exp(*this); }
DistTensor DistTensor::log() const { return dtensor::log(*this); }
DistTensor DistTensor::tanh() const { return dtensor::tanh(*this); }
DistTensor DistTensor::sigmoid() const { return dtensor::sigmoid(*this); }
DistTensor DistTensor::softmax(int64_t dim) const { return dtensor::softmax(*this, dim); }
DistTensor DistTensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return dtensor::sum(*this, dims, keepdim);
}
DistTensor DistTensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return dtensor::mean(*this, dims, keepdim);
}
DistTensor DistTensor::transpose(int64_t dim0, int64_t dim1) const {
  return dtensor::transpose(*this, dim0, dim1);
}

}  // namespace dtensor
