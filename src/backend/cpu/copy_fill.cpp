// Copy with dtype conversion, fill, counter-based random fills and arange.
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/loops.h"
#include "dtensor/random.h"

namespace dtensor::backend::cpu {

void copy(const Tensor& src, Tensor& dst) {
  assert(src.shape() == dst.shape());
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (src.numel() > 0 && src.data_ptr() != dst.data_ptr()) {
      std::memmove(dst.data_ptr(), src.data_ptr(), src.nbytes());
    }
    return;
  }
  if (src.dtype() == dst.dtype()) {
    // Same dtype: move the stored bits (no F32 round trip for the halves).
    switch (dtype_size(src.dtype())) {
      case 1: map<uint8_t, uint8_t>([](uint8_t v) { return v; }, dst, src); return;
      case 2: map<uint16_t, uint16_t>([](uint16_t v) { return v; }, dst, src); return;
      case 4: map<uint32_t, uint32_t>([](uint32_t v) { return v; }, dst, src); return;
      default: map<uint64_t, uint64_t>([](uint64_t v) { return v; }, dst, src); return;
    }
  }
  visit_dtype(dst.dtype(), [&](auto out_tag) {
    using Out = decltype(out_tag);
    visit_dtype(src.dtype(), [&](auto in_tag) {
      using In = decltype(in_tag);
      map<Out, In>([](auto v) { return v; }, dst, src);
    });
  });
}

void fill(Tensor& dst, double value) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    map<T>([v]() { return v; }, dst);
  });
}

namespace {

// dst is contiguous: element i gets draw(index_offset + i).
template <class Draw>
void fill_counter_based(Tensor& dst, uint64_t index_offset, Draw draw) {
  assert(dst.is_contiguous());
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(dst.data_ptr());
    const int64_t n = dst.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(draw(index_offset + static_cast<uint64_t>(i)));
  });
}

}  // namespace

void fill_randn(Tensor& dst, uint64_t seed, uint64_t index_offset) {
  fill_counter_based(dst, index_offset, [seed](uint64_t i) { return random::normal(seed, i); });
}

void fill_rand(Tensor& dst, uint64_t seed, uint64_t index_offset) {
  fill_counter_based(dst, index_offset, [seed](uint64_t i) { return random::uniform(seed, i); });
}

void arange(Tensor& dst, double start, double step) {
  assert(dst.dim() <= 1 && dst.is_contiguous());
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(dst.data_ptr());
    const int64_t n = dst.numel();
    // start + i*step rather than a running sum, so long ranges do not drift.
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(start + static_cast<double>(i) * step);
  });
}

}  // namespace dtensor::backend::cpu
