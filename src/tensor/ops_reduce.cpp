// Reductions: dim normalisation, keepdim, output dtypes, then the device kernels.
//
// Output dtypes: sum of integers or Bool gives I64 (as torch.sum); mean and var of
// integers or Bool compute in F32 (torch refuses them; a mean of a Bool mask is too
// useful to refuse); amax/amin keep the dtype; argmax gives I64.
#include <algorithm>

#include "backend/kernels.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {
namespace {

using Reduce = backend::Kernels::Reduce;

// A reduction's view of its input: a 0-d tensor is reduced as [1], so kernels always
// see at least one dim.
struct ReductionPlan {
  Tensor input;
  std::vector<int64_t> dims;  // sorted, unique, non-empty
  Shape out_shape;            // without keepdim
  Shape keepdim_shape;
};

ReductionPlan plan_reduction(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  DT_CHECK_ARG(a.defined(), op, "expected a defined tensor, got an undefined one");
  ReductionPlan plan;
  plan.input = a.dim() == 0 ? a.reshape({1}) : a;
  const int64_t ndim = a.dim();
  if (dims.empty()) {
    for (int64_t d = 0; d < plan.input.dim(); ++d) plan.dims.push_back(d);
  } else {
    for (int64_t d : dims) {
      const int64_t n = normalize_dim(d, ndim, op);
      DT_CHECK_ARG(std::find(plan.dims.begin(), plan.dims.end(), n) == plan.dims.end(), op,
                   "dim ", n, " appears more than once in the dims to reduce (got ", Shape(dims),
                   ")");
      plan.dims.push_back(n);
    }
    std::sort(plan.dims.begin(), plan.dims.end());
  }
  for (int64_t d = 0; d < ndim; ++d) {
    const bool reduced = std::binary_search(plan.dims.begin(), plan.dims.end(), d);
    if (!reduced) plan.out_shape.push_back(a.size(d));
    plan.keepdim_shape.push_back(reduced ? 1 : a.size(d));
  }
  return plan;
}

void check_nonempty_extent(const ReductionPlan& plan, const char* op) {
  for (int64_t d : plan.dims) {
    DT_CHECK_ARG(plan.input.size(d) > 0, op, "cannot reduce over dim ", d, " of size 0 (shape ",
                 plan.input.shape(), "): the result has no identity");
  }
}

Tensor finish(const ReductionPlan& plan, const Tensor& out, bool keepdim) {
  return keepdim ? out.view(plan.keepdim_shape) : out;
}

Tensor run_reduce(Reduce kind, const Tensor& a, const std::vector<int64_t>& dims, bool keepdim,
                  const char* op) {
  const ReductionPlan plan = plan_reduction(a, dims, op);
  DType out_dtype = a.dtype();
  if (is_integral(a.dtype())) {
    if (kind == Reduce::Sum) out_dtype = DType::I64;
    if (kind == Reduce::Mean) out_dtype = DType::F32;
  }
  if (kind == Reduce::Max || kind == Reduce::Min) check_nonempty_extent(plan, op);
  Tensor out = Tensor::empty(plan.out_shape, out_dtype, a.device());
  backend::kernels_for(a.device()).reduce(kind, plan.input, plan.dims, out);
  return finish(plan, out, keepdim);
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce(Reduce::Sum, a, dims, keepdim, "sum");
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce(Reduce::Mean, a, dims, keepdim, "mean");
}

Tensor amax(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce(Reduce::Max, a, dims, keepdim, "amax");
}

Tensor amin(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return run_reduce(Reduce::Min, a, dims, keepdim, "amin");
}

Tensor var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  DT_CHECK_ARG(correction >= 0, "var", "expected correction >= 0, got ", correction);
  const ReductionPlan plan = plan_reduction(a, dims, "var");
  const DType out_dtype = is_integral(a.dtype()) ? DType::F32 : a.dtype();
  Tensor out = Tensor::empty(plan.out_shape, out_dtype, a.device());
  backend::kernels_for(a.device()).var(plan.input, plan.dims, correction, out);
  return finish(plan, out, keepdim);
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  const ReductionPlan plan = plan_reduction(a, {dim}, "argmax");
  check_nonempty_extent(plan, "argmax");
  Tensor out = Tensor::empty(plan.out_shape, DType::I64, a.device());
  backend::kernels_for(a.device()).argmax(plan.input, plan.dims[0], out);
  return finish(plan, out, keepdim);
}

}  // namespace dtensor
