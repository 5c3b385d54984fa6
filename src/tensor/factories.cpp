// Tensor factories. Every fill runs on the tensor's device; random values are
// counter-based (dtensor/random.h, one definition for the CPU and the CUDA kernels),
// so a seed gives the same numbers on every device.
#include <cmath>

#include "backend/kernels.h"
#include "dtensor/tensor.h"
#include "util/check.h"

namespace dtensor {
namespace {

void check_shape(const Shape& shape, const char* op) {
  for (int64_t s : shape) DT_CHECK_ARG(s >= 0, op, "sizes must be >= 0, got ", shape);
}

// Builds on `device` with `fill` and that device's kernels.
template <class Fill>
Tensor make_on(const Shape& shape, DType dtype, Device device, const char* op, Fill&& fill) {
  check_shape(shape, op);
  Tensor t = Tensor::empty(shape, dtype, device);
  fill(backend::kernels_for(device), t);
  return t;
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, "empty");
  auto storage = std::make_shared<Storage>(shape_numel(shape) * dtype_size(dtype), device);
  return from_storage(std::move(storage), dtype, shape, contiguous_strides(shape), 0);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  check_shape(shape, "full");
  Tensor t = empty(shape, dtype, device);
  backend::kernels_for(device).fill(t, value);
  return t;
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  DT_CHECK_ARG(n >= 0, "arange", "expected n >= 0, got ", n);
  return make_on({n}, dtype, device, "arange",
                 [&](backend::Kernels& k, Tensor& t) { k.arange(t, 0.0, 1.0); });
}

Tensor Tensor::arange(double start, double end, double step, DType dtype, Device device) {
  DT_CHECK_ARG(step != 0, "arange", "step must be nonzero, got 0");
  DT_CHECK_ARG((end - start) / step >= 0, "arange", "step ", step, " never reaches ", end,
               " from ", start);
  const auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  return make_on({n}, dtype, device, "arange",
                 [&](backend::Kernels& k, Tensor& t) { k.arange(t, start, step); });
}

Tensor Tensor::randn(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  DT_CHECK_ARG(is_floating(dtype), "randn", "expected a floating dtype, got ", dtype_name(dtype));
  return make_on(shape, dtype, device, "randn",
                 [&](backend::Kernels& k, Tensor& t) { k.fill_randn(t, seed, 0); });
}

Tensor Tensor::rand(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  DT_CHECK_ARG(is_floating(dtype), "rand", "expected a floating dtype, got ", dtype_name(dtype));
  return make_on(shape, dtype, device, "rand",
                 [&](backend::Kernels& k, Tensor& t) { k.fill_rand(t, seed, 0); });
}

}  // namespace dtensor
