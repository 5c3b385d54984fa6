// How a row-major batched matmul maps onto a column-major BLAS call (internal):
// the plan the cuBLASLt GEMM uses, in host code that the CPU tests check by running
// it through a reference column-major GEMM.
//
// out[B, m, n] = a[B, m, k] @ b[B, k, n] with out contiguous. Column-major BLAS sees
// a row-major matrix as its transpose, so the call is out^T = b^T @ a^T: BLAS's "A"
// is b (n x k), its "B" is a (k x m), its C is out (n x m, ldc = n). A stored
// operand whose rows are contiguous (last stride 1) is passed as is; one whose
// columns are contiguous (a transposed view) is passed with op T; any other layout
// needs a contiguous copy first.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtensor::backend {

// One operand as BLAS sees it: op (transposed or not), leading dimension, batch stride.
struct BlasOperand {
  bool transpose = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

// The operand for a row-major matrix X [rows, cols] with strides (row_stride,
// col_stride) and batch stride, as the column-major BLAS operand X^T (cols x rows).
// Returns false when neither rows nor columns are contiguous.
inline bool blas_operand(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, int64_t batch_stride,
                         BlasOperand& op) {
  op.batch_stride = batch_stride;
  // A size-1 dim's stride is arbitrary; BLAS only needs ld >= the stored row count.
  if (col_stride == 1 || cols == 1) {
    if (rows == 1 || row_stride >= cols) {
      op.transpose = false;
      op.ld = rows == 1 ? (cols > 0 ? cols : 1) : row_stride;
      return true;
    }
  }
  if (row_stride == 1 || rows == 1) {
    if (cols == 1 || col_stride >= rows) {
      op.transpose = true;
      op.ld = cols == 1 ? (rows > 0 ? rows : 1) : col_stride;
      return true;
    }
  }
  return false;
}

struct GemmPlan {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  BlasOperand a;  // BLAS's first operand: the row-major b (n x k as BLAS sees it)
  BlasOperand b;  // BLAS's second operand: the row-major a (k x m)
  int64_t ldc = 0, batch_stride_c = 0;
};

// The plan for out[batch, m, n] = a @ b, from a's and b's [batch, rows, cols] strides.
// False when an operand needs a contiguous copy first.
inline bool make_gemm_plan(int64_t batch, int64_t m, int64_t n, int64_t k, const int64_t a_strides[3],
                           const int64_t b_strides[3], GemmPlan& plan) {
  plan.m = m;
  plan.n = n;
  plan.k = k;
  plan.batch = batch;
  plan.ldc = n > 0 ? n : 1;
  plan.batch_stride_c = m * n;
  return blas_operand(k, n, b_strides[1], b_strides[2], b_strides[0], plan.a) &&
         blas_operand(m, k, a_strides[1], a_strides[2], a_strides[0], plan.b);
}

// The largest power of two up to 256 that divides the address: the alignment
// cuBLASLt's heuristic is told a pointer has (it assumes 256 bytes otherwise).
inline uint32_t pointer_alignment(const void* ptr) {
  uint32_t bytes = 256;
  while (bytes > 1 && reinterpret_cast<uintptr_t>(ptr) % bytes != 0) bytes /= 2;
  return bytes;
}

// Everything that decides a cuBLASLt call's descriptors and algorithm: the plan,
// the dtype, the compute mode (TF32 or not), the device and each pointer's
// alignment. Calls with equal keys reuse one cached set of descriptors and the
// heuristic's choice (a heuristic query costs about as much as a small GEMM).
struct GemmKey {
  static constexpr size_t kFields = 17;
  int64_t fields[kFields] = {};
  bool operator==(const GemmKey& other) const {
    for (size_t i = 0; i < kFields; ++i) {
      if (fields[i] != other.fields[i]) return false;
    }
    return true;
  }
};

// bias: null for a plain GEMM, else the bias epilogue's vector; pre: null, else the
// GELU epilogue's pre-activation output (their alignments are a field: the heuristic
// depends on them, and a present pointer's alignment is at least 1).
inline GemmKey gemm_key(const GemmPlan& p, int dtype, bool tf32, int device, const void* a, const void* b,
                        const void* out, const void* bias = nullptr, const void* pre = nullptr) {
  return GemmKey{
      {p.m, p.n, p.k, p.batch, p.a.transpose, p.a.ld, p.a.batch_stride, p.b.transpose, p.b.ld, p.b.batch_stride, p.ldc,
       p.batch_stride_c, dtype, tf32, device,
       // the three alignments in one field: each is a power of two <= 256
       int64_t{pointer_alignment(a)} | int64_t{pointer_alignment(b)} << 16 | int64_t{pointer_alignment(out)} << 32,
       (bias ? int64_t{pointer_alignment(bias)} : 0) | (pre ? int64_t{pointer_alignment(pre)} << 16 : 0)}};
}

struct GemmKeyHash {
  size_t operator()(const GemmKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : key.fields) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

}  // namespace dtensor::backend
