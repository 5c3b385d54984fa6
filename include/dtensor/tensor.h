// The local tensor: a cheap-to-copy value handle over shared storage.
//
// A Tensor is (storage, dtype, shape, strides, offset). Copying a Tensor copies
// the handle, not the data; views (slice, transpose, expand, ...) share storage
// and differ only in shape/strides/offset. `clone()` and `contiguous()` copy.
// Strides and offset count elements, not bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/allocator.h"
#include "dtensor/device.h"
#include "dtensor/dtype.h"
#include "dtensor/error.h"
#include "dtensor/shape.h"

namespace dtensor {

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // ---- factories -------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device::cpu());
  // 0, 1, ..., n-1 (I64 by default, as in PyTorch) and the general start/end/step form.
  static Tensor arange(int64_t n, DType dtype = DType::I64, Device device = Device::cpu());
  static Tensor arange(double start, double end, double step, DType dtype = DType::F32,
                       Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, Shape{static_cast<int64_t>(values.size())});
  }
  template <class T>
  static Tensor scalar(T value, DType dtype = dtype_v<T>) {
    return full({}, static_cast<double>(value), dtype);
  }
  // Counter-based random numbers: element i of the row-major flattened tensor is a
  // pure function of (seed, i + index_offset), so any slice of a big random tensor
  // can be drawn alone (see random.h). randn: standard normal; rand: uniform [0, 1).
  static Tensor randn(const Shape& shape, uint64_t seed, DType dtype = DType::F32,
                      Device device = Device::cpu());
  static Tensor rand(const Shape& shape, uint64_t seed, DType dtype = DType::F32,
                     Device device = Device::cpu());
  // Wraps existing storage (for backends and views).
  static Tensor from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape,
                             Strides strides, int64_t offset);

  // ---- metadata --------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Strides& strides() const;
  int64_t offset() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  DType dtype() const;
  Device device() const;
  bool is_contiguous() const;
  // True when both handles view the same storage block.
  bool shares_storage(const Tensor& other) const;
  const std::shared_ptr<Storage>& storage() const;

  // ---- access ------------------------------------------------------------------
  // Address of element 0 (storage base + offset). The typed form checks T.
  void* data_ptr() const;
  template <class T>
  T* data() const;
  // Row-major values (any layout); throws if T is not the tensor's dtype.
  template <class T>
  std::vector<T> to_vector() const;
  // The single value of a one-element tensor, converted to T.
  template <class T>
  T item() const;
  // Shape, dtype and values (the first and last few along long dims).
  std::string to_string(int64_t max_per_dim = 6) const;

  // ---- views (no copies) -----------------------------------------------------
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops `dim`
  // k pieces along dim following the chunk rule: size ceil(n/k); trailing pieces
  // may be short or empty. Always returns k tensors.
  std::vector<Tensor> chunk(int64_t k, int64_t dim = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a dim; new leading dims allowed
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  // view: never copies, throws if the strides cannot express the shape.
  // reshape: a view when possible, else a contiguous copy. One -1 is inferred.
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // ---- copies ------------------------------------------------------------------
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;       // always a new contiguous copy
  // Copies src into this tensor's elements (broadcasting src, converting dtype and
  // device). Returns *this.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor to(DType dtype) const;  // self if the same
  Tensor to(Device device) const;

  struct Impl;  // the shared state behind the handle (src/tensor/tensor_impl.h)

 private:
  explicit Tensor(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// ---- comparison helpers (tests and users) ----------------------------------------

// Where two tensors differ most.
struct CompareReport {
  double max_abs_error = 0;
  double max_rel_error = 0;
  int64_t max_abs_index = -1;  // row-major flat index of the max abs error
  int64_t max_rel_index = -1;
  int64_t mismatches = 0;      // elements outside |a-b| <= atol + rtol*|b|
  bool shapes_match = true;
  std::string to_string() const;
};
CompareReport compare(const Tensor& actual, const Tensor& expected, double rtol = 1e-5,
                      double atol = 1e-8);
// True when shapes match and every |a - b| <= atol + rtol * |b| (NaNs never close).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

// ---- template definitions --------------------------------------------------------

namespace detail {
void check_dtype_access(const Tensor& t, DType requested, const char* op);
Tensor make_from_bytes(const void* data, DType dtype, const Shape& shape, Device device,
                       const char* op);
double element_as_double(const Tensor& t, int64_t flat_index);
int64_t element_as_int64(const Tensor& t, int64_t flat_index);
}  // namespace detail

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape)) {
    throw std::invalid_argument(
        detail::concat("[from_vector] shape ", shape, " needs ", shape_numel(shape), " values, got ", values.size()));
  }
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return detail::make_from_bytes(bytes.data(), DType::Bool, shape, device, "from_vector");
  } else {
    return detail::make_from_bytes(values.data(), dtype_v<T>, shape, device, "from_vector");
  }
}

template <class T>
T* Tensor::data() const {
  detail::check_dtype_access(*this, dtype_v<T>, "data");
  return static_cast<T*>(data_ptr());
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  detail::check_dtype_access(*this, dtype_v<T>, "to_vector");
  Tensor c = to(Device::cpu()).contiguous();
  const T* p = static_cast<const T*>(c.data_ptr());
  return std::vector<T>(p, p + c.numel());
}

template <class T>
T Tensor::item() const {
  if (!defined() || numel() != 1) {
    throw std::invalid_argument(
        detail::concat("[item] expected a tensor with one element, got shape ", defined() ? shape() : Shape{}));
  }
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return static_cast<T>(detail::element_as_int64(*this, 0));  // exact beyond 2^53
  } else {
    return static_cast<T>(detail::element_as_double(*this, 0));
  }
}

}  // namespace dtensor
