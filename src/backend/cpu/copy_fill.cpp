// Copy with dtype conversion, fill, counter-based random fills and arange.
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/scalar_ops.h"
#include "dtensor/random.h"

namespace dtensor::backend::cpu {

namespace {

// Elements per piece of a copy split over the rank's threads.
constexpr int64_t kCopyGrain = int64_t{1} << 16;

void copy_serial(const Tensor& src, Tensor& dst);

}  // namespace

// Large copies are split over the rank's threads; contiguous F32 <-> BF16 (the
// casts of mixed precision) take the vector conversions of vec_kernels.h.
void copy(const Tensor& src, Tensor& dst) {
  assert(src.shape() == dst.shape());
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    if (src.numel() > 0 && src.data_ptr() != dst.data_ptr()) {
      const char* from = static_cast<const char*>(src.data_ptr());
      char* to = static_cast<char*>(dst.data_ptr());
      const size_t bytes = src.nbytes();
      // Overlapping buffers (a shift within one storage) stay one memmove.
      if (to + bytes <= from || from + bytes <= to) {
        parallel_for(static_cast<int64_t>(bytes), kCopyGrain * 4, [&](int64_t b, int64_t e) {
          std::memcpy(to + b, from + b, static_cast<size_t>(e - b));
        });
      } else {
        std::memmove(to, from, bytes);
      }
    }
    return;
  }
  const bool f32_bf16 = (src.dtype() == DType::F32 && dst.dtype() == DType::BF16) ||
                        (src.dtype() == DType::BF16 && dst.dtype() == DType::F32);
  if (f32_bf16 && src.is_contiguous() && dst.is_contiguous()) {
    parallel_for(src.numel(), kCopyGrain, [&](int64_t b, int64_t e) {
      if (src.dtype() == DType::F32) {
        f32_to_bf16(static_cast<const float*>(src.data_ptr()) + b, static_cast<bf16*>(dst.data_ptr()) + b, e - b);
      } else {
        bf16_to_f32(static_cast<const bf16*>(src.data_ptr()) + b, static_cast<float*>(dst.data_ptr()) + b, e - b);
      }
    });
    return;
  }
  parallel_pieces<2>({&dst, &src}, kCopyGrain, [](std::array<Tensor, 2>& p) { copy_serial(p[1], p[0]); });
}

namespace {

void copy_serial(const Tensor& src, Tensor& dst) {
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

}  // namespace

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
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(scalar::arange_value(start, step, i));
  });
}

}  // namespace dtensor::backend::cpu
