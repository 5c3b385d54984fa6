// The table of local kernels of one device kind (internal).
//
// The free functions in tensor_ops.h validate arguments, compute output shapes and
// dtypes, allocate outputs and then call one of these. Kernels may therefore assume
// valid arguments (checked with assert): same device, outputs allocated with the
// right shape and dtype, inputs already broadcast (expanded) to the output's shape
// where the op is pointwise. Inputs may be strided views; outputs are contiguous
// unless stated otherwise.
#pragma once

#include <cstdint>
#include <vector>

#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"

namespace dtensor::backend {

// One AdamW step's constants (PyTorch's torch.optim.AdamW formulas).
struct AdamWStep {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  int64_t step = 1;  // counts this update
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // dst[i] = src[i] with dtype conversion; same shape; dst may be strided.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void fill(Tensor& dst, double value) = 0;
  // Element i (row-major over dst's shape) = f(seed, index_offset + i).
  virtual void fill_randn(Tensor& dst, uint64_t seed, uint64_t index_offset) = 0;
  virtual void fill_rand(Tensor& dst, uint64_t seed, uint64_t index_offset) = 0;
  virtual void arange(Tensor& dst, double start, double step) = 0;

  // Pointwise. a (and b) have out's shape (broadcast via zero strides). For
  // comparisons out is Bool and a, b share one dtype; otherwise all share out's dtype.
  virtual void unary(UnaryOp op, const Tensor& a, Tensor& out) = 0;
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) = 0;

  // Reductions over `dims` (sorted, unique, non-empty); out has a's shape with
  // those dims removed (no keepdim handling here).
  enum class Reduce : uint8_t { Sum, Mean, Max, Min };
  virtual void reduce(Reduce op, const Tensor& a, const std::vector<int64_t>& dims, Tensor& out) = 0;
  virtual void var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, Tensor& out) = 0;
  virtual void argmax(const Tensor& a, int64_t dim, Tensor& out) = 0;

  // out[b] = a[b] @ b[b]: a [B, m, k], b [B, k, n] (any strides), out [B, m, n] contiguous.
  // B may be broadcast through zero batch strides.
  virtual void matmul(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // The same with a bias epilogue (a Linear): out[b, i, j] = (a[b] @ b[b])[i, j] +
  // bias[j], bias [n] contiguous in out's dtype, added in the GEMM's epilogue rather
  // than by a second pass over the output.
  virtual void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) = 0;
  // A Linear feeding a GELU (the MLP's first layer): pre = a @ b + bias (bias as
  // above, or undefined for none) and out = gelu(pre), both [B, m, n] contiguous,
  // with the GELU in the GEMM's epilogue where the device has one (pre is what gelu's
  // backward reads). On the CPU bit for bit matmul_bias followed by unary gelu; on
  // CUDA cuBLASLt's GELU_AUX_BIAS epilogue (tanh form) takes the GELU from the
  // unrounded accumulator, so BF16 results may differ from the two ops by a rounding.
  virtual void matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, GeluApprox approx, Tensor& out,
                                Tensor& pre) = 0;

  // Along `dim` of a contiguous-or-strided input; out contiguous with a's shape.
  virtual void softmax(const Tensor& a, int64_t dim, bool log, Tensor& out) = 0;
  virtual void softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim, bool log, Tensor& grad_in) = 0;

  // x viewed as [rows, cols] (contiguous); weight/bias [cols] or undefined.
  // mean/rstd are [rows] in x's dtype for F32/F64 and F32 for BF16/F16.
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& out,
                          Tensor& mean, Tensor& rstd) = 0;
  virtual void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, Tensor& grad_in, Tensor& grad_weight, Tensor& grad_bias) = 0;
  virtual void rms_norm(const Tensor& x, const Tensor& weight, double eps, Tensor& out, Tensor& rstd) = 0;
  virtual void rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& rstd, const Tensor& weight,
                                 Tensor& grad_in, Tensor& grad_weight) = 0;

  virtual void gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApprox approx, Tensor& grad_in) = 0;
  virtual void silu_backward(const Tensor& grad_out, const Tensor& x, Tensor& grad_in) = 0;

  // table [V, D]; ids flat [N] integer; out [N, D].
  virtual void embedding(const Tensor& table, const Tensor& ids, bool masked, Tensor& out) = 0;
  // grad_table [V, D] zeroed by the caller; grad_out [N, D]; ids [N].
  virtual void embedding_backward(const Tensor& grad_out, const Tensor& ids, bool masked, Tensor& grad_table) = 0;

  // Sorting, along the last dim of a contiguous [rows, n] that is F64 or I64 (the
  // frontend widens the other dtypes, exactly): out [rows, n] I64 holds each row's
  // indices in sort_key.h's order, stable (equal keys keep their index order).
  virtual void argsort(const Tensor& a, bool descending, Tensor& out) = 0;
  // counts [bins] I64, zeroed by the caller, += 1 for each id (flat [N], I64 or I32)
  // in [0, bins); ids outside that range are counted nowhere.
  virtual void bincount(const Tensor& ids, Tensor& counts) = 0;

  // logits [N, C]; targets [N]; losses [N] (0 for ignored rows). Returns via `losses`.
  virtual void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& losses) = 0;
  // grad_rows [N] = upstream gradient per row (already scaled for Mean); out [N, C].
  virtual void cross_entropy_backward(const Tensor& grad_rows, const Tensor& logits, const Tensor& targets,
                                      int64_t ignore_index, Tensor& grad_logits) = 0;

  // Fused attention over the leading (batch) dims of q [..., Sq, D], k [..., Sk, D],
  // v [..., Sk, Dv] (any strides with unit stride along the last dim; one dtype);
  // out [..., Sq, Dv] (the same: strided rows allowed) and lse [..., Sq] F32
  // contiguous are written. See tensor_ops.h.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                         Tensor& lse) = 0;
  // grad_q/grad_k/grad_v have q/k/v's shapes (strided rows allowed).
  virtual void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& grad_q,
                                  Tensor& grad_k, Tensor& grad_v) = 0;

  // One fused AdamW update in place: param, exp_avg, exp_avg_sq contiguous F32 of one
  // shape, grad of that shape (F32 or BF16, contiguous). Returns false (nothing
  // done) where the device has no fused kernel for these operands; the caller then
  // composes the update from ops.
  virtual bool adamw_step(const AdamWStep& step, Tensor& param, const Tensor& grad, Tensor& exp_avg,
                          Tensor& exp_avg_sq) {
    return false;
  }
};

// The kernel table for a device; throws std::runtime_error naming the device and the
// build option when this build has none (e.g. CUDA without DTENSOR_WITH_CUDA).
Kernels& kernels_for(Device device);

// Puts `replacement` in the CPU table's place for the scope (the cross-device
// conformance suite wraps the table to count which entries its cases reach). Scopes
// do not nest; ops running on other threads meanwhile see either table.
class ScopedCpuKernels {
 public:
  explicit ScopedCpuKernels(Kernels& replacement);
  ~ScopedCpuKernels();
  ScopedCpuKernels(const ScopedCpuKernels&) = delete;
  ScopedCpuKernels& operator=(const ScopedCpuKernels&) = delete;
};

// Memory primitives per device, used by Storage and Tensor::to(Device).
void* device_allocate(Device device, size_t bytes);
void device_free(Device device, void* ptr, size_t bytes);
// Copies `bytes` between any two devices.
void device_memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace dtensor::backend
