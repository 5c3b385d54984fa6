// Matrix multiply on the CPU through OpenBLAS, and the BLAS thread policy.
//
// Strided operands go to BLAS without copies whenever one of their two matrix dims
// has unit stride (row-major as is, or transposed); only other layouts are copied.
// BF16/F16 are computed through F32, as the CPU has no native half GEMM here.
#include <cblas.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "backend/cpu/cpu_kernels.h"

namespace dtensor::backend::cpu {
namespace {

// How one [rows, cols] operand is handed to a row-major BLAS call.
struct BlasOperand {
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t ld = 1;
};

// Row-major as is (unit column stride) or transposed (unit row stride). A size-1
// dim's stride is meaningless, so it never disqualifies a layout.
std::optional<BlasOperand> blas_layout(int64_t rows, int64_t cols, int64_t row_stride,
                                       int64_t col_stride) {
  if (col_stride == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) return BlasOperand{CblasNoTrans, ld};
  }
  if (row_stride == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) return BlasOperand{CblasTrans, ld};
  }
  return std::nullopt;
}

template <class T>
void gemm(BlasOperand a, BlasOperand b, int64_t m, int64_t n, int64_t k, const T* pa, const T* pb,
          T* pc) {
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0f, pa, a.ld, pb, b.ld, 0.0f, pc, n);
  } else {
    cblas_dgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0, pa, a.ld, pb, b.ld, 0.0, pc, n);
  }
}

// a [B, m, k], b [B, k, n] (any strides, F32 or F64), out [B, m, n] contiguous.
template <class T>
void batched_gemm(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  T* pc = static_cast<T*>(out.data_ptr());
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(pc, pc + batch * m * n, T(0));
    return;
  }
  // Operands whose matrices BLAS cannot read are copied once, for all batches.
  auto prepare = [](const Tensor& t) {
    if (blas_layout(t.size(1), t.size(2), t.stride(1), t.stride(2))) return t;
    return t.contiguous();
  };
  const Tensor ta = prepare(a), tb = prepare(b);
  const BlasOperand la = *blas_layout(ta.size(1), ta.size(2), ta.stride(1), ta.stride(2));
  const BlasOperand lb = *blas_layout(tb.size(1), tb.size(2), tb.stride(1), tb.stride(2));
  const T* pa = static_cast<const T*>(ta.data_ptr());
  const T* pb = static_cast<const T*>(tb.data_ptr());
  for (int64_t i = 0; i < batch; ++i) {
    gemm<T>(la, lb, m, n, k, pa + i * ta.stride(0), pb + i * tb.stride(0), pc + i * m * n);
  }
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  switch (out.dtype()) {
    case DType::F32: return batched_gemm<float>(a, b, out);
    case DType::F64: return batched_gemm<double>(a, b, out);
    default: {
      Tensor out32 = Tensor::empty(out.shape(), DType::F32);
      batched_gemm<float>(a.to(DType::F32), b.to(DType::F32), out32);
      copy(out32, out);
    }
  }
}

void configure_blas_threads(int ranks_on_host) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(std::max(1, cores / std::max(1, ranks_on_host)));
}

int blas_threads() { return openblas_get_num_threads(); }

}  // namespace dtensor::backend::cpu
