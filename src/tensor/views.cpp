// Views: new shape/strides/offset over the same storage, never a copy (except
// reshape when no view exists, which says so in its contract).
#include <algorithm>
#include <numeric>
#include <optional>

#include "dtensor/tensor.h"
#include "util/check.h"

namespace dtensor {
namespace {

Tensor restride(const Tensor& t, Shape shape, Strides strides, int64_t offset) {
  return Tensor::from_storage(t.storage(), t.dtype(), std::move(shape), std::move(strides), offset);
}

// Replaces one -1 by the size that keeps numel; checks that numel matches.
Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape shape = requested;
  int64_t known = 1;
  std::optional<size_t> infer;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      DT_CHECK_ARG(!infer, op, "only one dim can be -1, got ", requested);
      infer = i;
    } else {
      DT_CHECK_ARG(shape[i] >= 0, op, "sizes must be >= 0 or -1, got ", requested);
      known *= shape[i];
    }
  }
  if (infer) {
    DT_CHECK_ARG(known != 0 && numel % known == 0, op, "shape ", requested,
                 " is invalid for a tensor of ", numel, " elements");
    shape[*infer] = numel / known;
  }
  DT_CHECK_ARG(shape_numel(shape) == numel, op, "shape ", requested, " is invalid for a tensor of ",
               numel, " elements");
  return shape;
}

// Strides that let `new_shape` view memory laid out as (old_shape, old_strides), or
// nullopt when the memory is not evenly spaced along some merged group of dims.
// Walks old dims from the innermost, grouping runs of dims that are contiguous with
// each other ("chunks"); each chunk must be covered exactly by a run of new dims.
// Example: a transposed [6, 4] matrix has shape [4, 6] and strides [1, 4]. Its two
// dims are separate chunks (stride 1 != 6 * 4), so it can be viewed as [4, 3, 2]
// (strides [1, 8, 4]: dim 1 splits) but not as [24] (the chunks would have to merge).
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides,
                                    const Shape& new_shape) {
  Strides strides(new_shape.size(), 1);
  if (shape_numel(old_shape) == 0 || old_shape.empty()) return contiguous_strides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    const bool chunk_ends = tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                                              old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = old_strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

}  // namespace

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  const int d = normalize_dim(dim, this->dim(), "slice");
  DT_CHECK_ARG(step > 0, "slice", "step must be > 0, got ", step);
  const int64_t n = shape()[d];
  // Python semantics: negative bounds count from the end, then clamp to [0, n].
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t lo = clamp(start), hi = std::max(clamp(end), clamp(start));
  Shape s = shape();
  Strides st = strides();
  s[d] = (hi - lo + step - 1) / step;
  st[d] *= step;
  return restride(*this, std::move(s), std::move(st), offset() + lo * strides()[d]);
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int d = normalize_dim(dim, this->dim(), "narrow");
  const int64_t n = shape()[d];
  const int64_t begin = start < 0 ? start + n : start;
  DT_CHECK_ARG(begin >= 0 && length >= 0 && begin + length <= n, "narrow", "expected [start, ",
               "start + length) inside [0, ", n, ") of dim ", d, ", got start ", start,
               " length ", length);
  return slice(d, begin, begin + length);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const int d = normalize_dim(dim, this->dim(), "select");
  const int64_t n = shape()[d];
  DT_CHECK_ARG(index >= -n && index < n, "select", "index ", index, " out of range for dim ", d,
               " of size ", n);
  const int64_t i = index < 0 ? index + n : index;
  Shape s = shape();
  Strides st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return restride(*this, std::move(s), std::move(st), offset() + i * strides()[d]);
}

std::vector<Tensor> Tensor::chunk(int64_t k, int64_t dim) const {
  const int d = normalize_dim(dim, this->dim(), "chunk");
  DT_CHECK_ARG(k >= 1, "chunk", "expected k >= 1 chunks, got ", k);
  const int64_t n = shape()[d];
  const int64_t c = (n + k - 1) / k;  // the DESIGN chunk rule: ceil(n / k)
  std::vector<Tensor> pieces;
  pieces.reserve(k);
  for (int64_t r = 0; r < k; ++r) {
    pieces.push_back(slice(d, std::min(n, r * c), std::min(n, (r + 1) * c)));
  }
  return pieces;
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t dim) const {
  const int d = normalize_dim(dim, this->dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    DT_CHECK_ARG(s >= 0, "split", "sizes must be >= 0, got ", Shape(sizes));
    total += s;
  }
  DT_CHECK_ARG(total == shape()[d], "split", "sizes ", Shape(sizes), " sum to ", total,
               " but dim ", d, " has size ", shape()[d]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(slice(d, start, start + s));
    start += s;
  }
  return pieces;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int a = normalize_dim(dim0, dim(), "transpose"), b = normalize_dim(dim1, dim(), "transpose");
  Shape s = shape();
  Strides st = strides();
  std::swap(s[a], s[b]);
  std::swap(st[a], st[b]);
  return restride(*this, std::move(s), std::move(st), offset());
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  DT_CHECK_ARG(static_cast<int64_t>(dims.size()) == dim(), "permute", "expected ", dim(),
               " dims, got ", Shape(dims));
  std::vector<bool> seen(dims.size(), false);
  Shape s(dims.size());
  Strides st(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int d = normalize_dim(dims[i], dim(), "permute");
    DT_CHECK_ARG(!seen[d], "permute", "dims must be a permutation, got ", Shape(dims));
    seen[d] = true;
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  return restride(*this, std::move(s), std::move(st), offset());
}

Tensor Tensor::expand(const Shape& target) const {
  DT_CHECK_ARG(target.size() >= shape().size(), "expand", "cannot expand ", shape(), " to ",
               target, ": the target has fewer dims");
  const size_t lead = target.size() - shape().size();
  Shape s(target.size());
  Strides st(target.size(), 0);
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      DT_CHECK_ARG(target[i] >= 0, "expand", "new leading dims need a size, got ", target);
      s[i] = target[i];
      continue;
    }
    const int64_t have = shape()[i - lead];
    const int64_t want = target[i] == -1 ? have : target[i];
    DT_CHECK_ARG(want == have || have == 1, "expand", "cannot expand ", shape(), " to ", target,
                 ": dim ", i, " has size ", have, " (only size-1 dims stretch)");
    s[i] = want;
    st[i] = want == have ? strides()[i - lead] : 0;
  }
  return restride(*this, std::move(s), std::move(st), offset());
}

Tensor Tensor::squeeze() const {
  Shape s;
  Strides st;
  for (int64_t i = 0; i < dim(); ++i) {
    if (shape()[i] != 1) {
      s.push_back(shape()[i]);
      st.push_back(strides()[i]);
    }
  }
  return restride(*this, std::move(s), std::move(st), offset());
}

Tensor Tensor::squeeze(int64_t dim) const {
  const int d = normalize_dim(dim, this->dim(), "squeeze");
  if (this->dim() == 0 || shape()[d] != 1) return *this;  // as in PyTorch: a no-op
  return select(d, 0);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const int d = normalize_dim(dim, this->dim() + 1, "unsqueeze");
  Shape s = shape();
  Strides st = strides();
  const int64_t stride = d < this->dim() ? strides()[d] * shape()[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return restride(*this, std::move(s), std::move(st), offset());
}

Tensor Tensor::view(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "view");
  std::optional<Strides> st = view_strides(this->shape(), strides(), target);
  DT_CHECK_ARG(st.has_value(), "view", "cannot view ", this->shape(), " with strides ",
               Shape(strides()), " as ", target,
               ": the dims to merge are not contiguous; use reshape (copies) or contiguous()");
  return restride(*this, target, std::move(*st), offset());
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "reshape");
  if (std::optional<Strides> st = view_strides(this->shape(), strides(), target)) {
    return restride(*this, target, std::move(*st), offset());
  }
  return clone().view(target);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int a = normalize_dim(start_dim, dim(), "flatten"), b = normalize_dim(end_dim, dim(), "flatten");
  DT_CHECK_ARG(a <= b, "flatten", "start_dim ", start_dim, " must not come after end_dim ", end_dim);
  Shape s(shape().begin(), shape().begin() + a);
  int64_t merged = 1;
  for (int i = a; i <= b; ++i) merged *= shape()[i];
  s.push_back(merged);
  s.insert(s.end(), shape().begin() + b + 1, shape().end());
  return reshape(s);
}

}  // namespace dtensor
