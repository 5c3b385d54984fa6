// Sorting on the CPU: argsort by sort_key.h's keys (the ones the CUDA radix sort
// sorts, so both devices give the same indices), rows split over the cores; bincount.
#include <algorithm>
#include <cassert>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/sort_key.h"

namespace dtensor::backend::cpu {
namespace {

template <class T>
void argsort_rows(const T* in, int64_t rows, int64_t n, bool descending, int64_t* out) {
  // About 16k elements per task: a row of a few experts is not worth a thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(n, 1));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> keys(static_cast<size_t>(n));
    for (int64_t r = begin; r < end; ++r) {
      const T* row = in + r * n;
      for (int64_t i = 0; i < n; ++i) keys[static_cast<size_t>(i)] = sort_key::of(row[i], descending);
      int64_t* idx = out + r * n;
      std::iota(idx, idx + n, int64_t{0});
      std::stable_sort(idx, idx + n, [&](int64_t x, int64_t y) {
        return keys[static_cast<size_t>(x)] < keys[static_cast<size_t>(y)];
      });
    }
  });
}

}  // namespace

void argsort(const Tensor& a, bool descending, Tensor& out) {
  assert(a.is_contiguous() && out.is_contiguous() && a.dim() == 2);
  const int64_t rows = a.size(0), n = a.size(1);
  auto* o = static_cast<int64_t*>(out.data_ptr());
  if (a.dtype() == DType::F64) {
    argsort_rows(static_cast<const double*>(a.data_ptr()), rows, n, descending, o);
  } else {
    assert(a.dtype() == DType::I64);
    argsort_rows(static_cast<const int64_t*>(a.data_ptr()), rows, n, descending, o);
  }
}

void bincount(const Tensor& ids, Tensor& counts) {
  assert(ids.is_contiguous() && ids.dim() == 1 && counts.dtype() == DType::I64);
  const int64_t bins = counts.numel(), n = ids.numel();
  auto* c = static_cast<int64_t*>(counts.data_ptr());
  auto count = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i) {
      const auto id = static_cast<int64_t>(p[i]);
      if (id >= 0 && id < bins) ++c[id];
    }
  };
  if (ids.dtype() == DType::I64) {
    count(static_cast<const int64_t*>(ids.data_ptr()));
  } else {
    assert(ids.dtype() == DType::I32);
    count(static_cast<const int32_t*>(ids.data_ptr()));
  }
}

}  // namespace dtensor::backend::cpu
