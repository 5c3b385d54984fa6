// Tensor: metadata, element access, copies between dtypes and devices, printing
// and comparison. Views are in views.cpp, factories in factories.cpp.
#include "dtensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "backend/kernels.h"
#include "tensor/tensor_impl.h"
#include "util/check.h"

namespace dtensor {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  DT_CHECK_ARG(dim >= lo && dim <= hi, op, "dim ", dim, " out of range: expected a dim in [", lo,
               ", ", hi, "] for a tensor with ", ndim, " dims");
  return static_cast<int>(dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape,
                            Strides strides, int64_t offset) {
  auto impl = std::make_shared<Impl>();
  impl->storage = std::move(storage);
  impl->dtype = dtype;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  return Tensor(std::move(impl));
}

namespace {
const Tensor::Impl& checked(const std::shared_ptr<Tensor::Impl>& impl) {
  DT_CHECK_ARG(impl != nullptr, "tensor", "expected a defined tensor, got an undefined one");
  return *impl;
}
}  // namespace

const Shape& Tensor::shape() const { return checked(impl_).shape; }
const Strides& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::offset() const { return checked(impl_).offset; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).storage->device(); }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(impl_).storage; }
int64_t Tensor::numel() const { return shape_numel(shape()); }

int64_t Tensor::size(int64_t dim) const { return shape()[normalize_dim(dim, this->dim(), "size")]; }
int64_t Tensor::stride(int64_t dim) const {
  return strides()[normalize_dim(dim, this->dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  const Impl& impl = checked(impl_);
  int64_t expected = 1;
  for (size_t i = impl.shape.size(); i-- > 0;) {
    if (impl.shape[i] == 1) continue;  // a size-1 dim's stride never matters
    if (impl.strides[i] != expected) return false;
    expected *= impl.shape[i];
  }
  return true;
}

bool Tensor::shares_storage(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

void* Tensor::data_ptr() const {
  const Impl& impl = checked(impl_);
  auto* base = static_cast<char*>(impl.storage->data());
  if (!base) {
    if (!impl.storage->holds_memory()) {
      throw std::runtime_error("[tensor] the memory of this " + shape_to_string(impl.shape) +
                               " tensor was released (Storage::release_memory, e.g. a parameter FSDP resharded "
                               "after forward) and not restored");
    }
    return nullptr;
  }
  return base + impl.offset * static_cast<int64_t>(dtype_size(impl.dtype));
}

namespace detail {

void check_dtype_access(const Tensor& t, DType requested, const char* op) {
  DT_CHECK_ARG(t.defined(), op, "expected a defined tensor, got an undefined one");
  DT_CHECK_ARG(t.dtype() == requested, op, "element type mismatch: the tensor is ",
               dtype_name(t.dtype()), ", the request is for ", dtype_name(requested));
}

Tensor make_from_bytes(const void* data, DType dtype, const Shape& shape, Device device,
                       const char* op) {
  for (int64_t s : shape) DT_CHECK_ARG(s >= 0, op, "sizes must be >= 0, got ", shape);
  Tensor out = Tensor::empty(shape, dtype, device);
  backend::device_memcpy(out.data_ptr(), device, data, Device::cpu(), out.nbytes());
  return out;
}

namespace {
template <class T>
T element_as(const Tensor& t, int64_t flat_index) {
  Tensor one = t.reshape({-1}).slice(0, flat_index, flat_index + 1).to(Device::cpu()).to(dtype_v<T>);
  return *static_cast<const T*>(one.data_ptr());
}
}  // namespace

double element_as_double(const Tensor& t, int64_t flat_index) {
  return element_as<double>(t, flat_index);
}
int64_t element_as_int64(const Tensor& t, int64_t flat_index) {
  return element_as<int64_t>(t, flat_index);
}

}  // namespace detail

// ---- copies ------------------------------------------------------------------------

Tensor& Tensor::copy_(const Tensor& src) {
  DT_CHECK_ARG(defined() && src.defined(), "copy_", "expected defined tensors");
  Tensor source = src;
  if (source.shape() != shape()) source = source.expand(shape());  // throws if not broadcastable
  if (source.device() != device()) {
    // Stage through a contiguous buffer of the destination's dtype on the source
    // device, then one memcpy across devices.
    Tensor staged = source.to(dtype()).contiguous();
    if (is_contiguous()) {
      backend::device_memcpy(data_ptr(), device(), staged.data_ptr(), staged.device(), nbytes());
      return *this;
    }
    source = staged.to(device());
  }
  backend::kernels_for(device()).copy(source, *this);
  return *this;
}

Tensor& Tensor::fill_(double value) {
  backend::kernels_for(device()).fill(*this, value);
  return *this;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  Tensor out = empty(shape(), dtype, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), device);
  backend::device_memcpy(out.data_ptr(), device, src.data_ptr(), src.device(), src.nbytes());
  return out;
}

// ---- printing ----------------------------------------------------------------------

namespace {

void format_value(std::ostringstream& os, DType dtype, double v) {
  if (dtype == DType::Bool) {
    os << (v != 0 ? "true" : "false");
  } else if (is_integral(dtype)) {
    os << static_cast<int64_t>(v);
  } else {
    os << v;
  }
}

// Prints dim `d` of a contiguous F64 copy, eliding the middle of long dims.
void format_dim(std::ostringstream& os, const double* values, const Shape& shape, int64_t d,
                int64_t base, DType dtype, int64_t max_per_dim) {
  if (d == static_cast<int64_t>(shape.size())) {
    format_value(os, dtype, values[base]);
    return;
  }
  int64_t inner = 1;
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  const int64_t n = shape[d];
  const int64_t head = n > max_per_dim ? max_per_dim / 2 : n;
  const int64_t tail_start = n > max_per_dim ? n - (max_per_dim - head) : n;
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) os << ", ";
    if (i == head && head < tail_start) {
      os << "...";
      i = tail_start - 1;
      continue;
    }
    format_dim(os, values, shape, d + 1, base + i * inner, dtype, max_per_dim);
  }
  os << "]";
}

}  // namespace

std::string Tensor::to_string(int64_t max_per_dim) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << shape_to_string(shape()) << ", dtype=" << dtype_name(dtype());
  if (device() != Device::cpu()) os << ", device=" << device().to_string();
  os << ", ";
  Tensor values = to(Device::cpu()).to(DType::F64).contiguous();
  format_dim(os, static_cast<const double*>(values.data_ptr()), shape(), 0, 0, dtype(),
             std::max<int64_t>(max_per_dim, 2));
  os << ")";
  return os.str();
}

// ---- comparison --------------------------------------------------------------------

std::string CompareReport::to_string() const {
  std::ostringstream os;
  if (!shapes_match) return "shapes differ";
  os << "max abs error " << max_abs_error << " at flat index " << max_abs_index
     << ", max rel error " << max_rel_error << " at flat index " << max_rel_index << ", "
     << mismatches << " elements outside tolerance";
  return os.str();
}

CompareReport compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  CompareReport report;
  if (actual.shape() != expected.shape()) {
    report.shapes_match = false;
    report.mismatches = std::max(actual.numel(), expected.numel());
    return report;
  }
  const std::vector<double> a = actual.to(Device::cpu()).to(DType::F64).to_vector<double>();
  const std::vector<double> b = expected.to(Device::cpu()).to(DType::F64).to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    const double abs_error = a[i] == b[i] ? 0.0 : std::fabs(a[i] - b[i]);
    const double rel_error = abs_error / std::max(std::fabs(b[i]), 1e-300);
    if (!(abs_error <= atol + rtol * std::fabs(b[i])) || both_nan) ++report.mismatches;
    if (!(abs_error <= report.max_abs_error)) {  // NaN-aware: a NaN error always wins
      report.max_abs_error = abs_error;
      report.max_abs_index = static_cast<int64_t>(i);
    }
    if (abs_error > 0 && !(rel_error <= report.max_rel_error)) {
      report.max_rel_error = rel_error;
      report.max_rel_index = static_cast<int64_t>(i);
    }
  }
  return report;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  const CompareReport report = compare(a, b, rtol, atol);
  return report.shapes_match && report.mismatches == 0;
}

}  // namespace dtensor
