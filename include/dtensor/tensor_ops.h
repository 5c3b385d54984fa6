// Operations on local tensors. Each is a short free function: check the inputs,
// promote dtypes, allocate the result, call the device's kernel table
// (src/backend/kernels.h). Later the same names gain DistTensor overloads.
//
// Broadcasting follows NumPy: shapes are right-aligned and a dim of size 1 (or a
// missing one) stretches. BF16/F16 inputs are computed in F32 and rounded back.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/tensor.h"

namespace dtensor {

// ---- pointwise -------------------------------------------------------------------
enum class UnaryOp : uint8_t {
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Tanh,
  Sigmoid,
  Relu,
  GeluTanh,
  GeluErf,
  Silu,
  Square,
  Reciprocal,
};
enum class BinaryOp : uint8_t {
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,  // comparisons give Bool
};
const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);

// The broadcast shape of a and b; throws naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");

Tensor unary(UnaryOp op, const Tensor& a);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary(BinaryOp op, const Tensor& a, double scalar);  // scalar keeps a's dtype

Tensor neg(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
enum class GeluApprox : uint8_t { None, Tanh };  // None = exact erf form
Tensor gelu(const Tensor& a, GeluApprox approx = GeluApprox::None);
Tensor silu(const Tensor& a);
Tensor square(const Tensor& a);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor pow(const Tensor& a, double s);
Tensor maximum(const Tensor& a, double s);
Tensor minimum(const Tensor& a, double s);
// cond ? a : b, all three broadcast together; cond must be Bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// ---- reductions -------------------------------------------------------------------
// `dims` empty means all dims. Negative dims allowed; duplicates are an error.
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Variance with `correction` (0: population, 1: Bessel, as torch.var).
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
// Index (I64) of the first maximum along one dim.
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);

// ---- sorting ----------------------------------------------------------------------
// Indices (I64, a's shape) that sort `a` along `dim`, stable: equal elements keep
// their order (torch.argsort(stable=True)). -0.0 equals +0.0 and NaN sorts above
// every number (first when descending), as torch.sort. On CUDA a radix sort (CUB)
// of the same keys as the CPU's, so both devices give the same indices.
Tensor argsort(const Tensor& a, int64_t dim = -1, bool descending = false);
// The k largest elements along `dim`, largest first, equal elements by lower index
// (torch.topk(largest=True, sorted=True)): values in a's dtype, indices I64, both of
// a's shape with size k along `dim`. 0 <= k <= a.size(dim).
struct TopK {
  Tensor values, indices;
};
TopK topk(const Tensor& a, int64_t k, int64_t dim = -1);
// How often each value in [0, bins) occurs in the 1-D integer `ids`: I64 [bins]
// (torch.bincount with minlength = bins). Ids outside [0, bins) are counted nowhere,
// on every device (checking them would copy GPU ids to the host): compare the sum
// with ids.numel() where a stray id is an error.
Tensor bincount(const Tensor& ids, int64_t bins);

// ---- linear algebra -------------------------------------------------------------
// [..., m, k] @ [..., k, n] -> [..., m, n] with broadcast batch dims; 1-D operands are
// promoted as in NumPy. Transposed views go to BLAS without copies.
Tensor matmul(const Tensor& a, const Tensor& b);
// x @ w^T + bias with w of shape [out, in] (the nn.Linear convention).
Tensor linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias = std::nullopt);
// gelu(linear(x, w, bias)) with the GELU in the GEMM's epilogue (one pass over the
// output fewer): `out`, and linear's output `pre` that gelu_backward reads. On the
// CPU bit for bit the two ops; on CUDA (cuBLASLt's GELU_AUX_BIAS, tanh form) within a
// rounding of them.
struct LinearGeluResult {
  Tensor out, pre;
};
LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                             GeluApprox approx = GeluApprox::None);

// ---- neural-network kernels ---------------------------------------------------------
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// Given y = softmax(x) (or log_softmax) and dL/dy, returns dL/dx.
Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim);

// Normalises over the trailing dims given by normalized_shape. weight/bias optional.
struct NormResult {
  Tensor out;
  Tensor mean;  // layer_norm only; shape = leading dims
  Tensor rstd;  // 1/sqrt(var + eps) (layer_norm) or 1/rms (rms_norm); shape = leading dims
};
NormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias, double eps = 1e-5);
NormResult rms_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                    double eps = 1e-6);
struct NormGrads {
  Tensor grad_input;
  Tensor grad_weight;  // undefined when there was no weight
  Tensor grad_bias;    // undefined when there was no bias
};
NormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const NormResult& saved,
                              const Shape& normalized_shape, const std::optional<Tensor>& weight, bool has_bias);
NormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x, const NormResult& saved,
                            const Shape& normalized_shape, const std::optional<Tensor>& weight);

// Derivatives of the pointwise activations: grad_out * f'(x).
Tensor gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApprox approx = GeluApprox::None);
Tensor silu_backward(const Tensor& grad_out, const Tensor& x);

// Fused attention: softmax(q k^T * scale [+ causal mask]) v without materialising
// the [Sq, Sk] scores (tiles of keys with an online softmax; FlashAttention-2's
// scheme). q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] with equal leading dims,
// one floating dtype; scale defaults to 1/sqrt(D); causal keeps key j for query i
// when j <= i (top-left aligned, PyTorch's is_causal). `out` [..., Sq, Dv] is laid
// out in q's dim order (q a transposed [B, S, H, D] view gives out the same
// [B, S, H, Dv] memory order, so transposing back is free); `lse` [..., Sq] (F32) is
// the log-sum-exp of each query's scaled scores, all the backward needs besides
// the inputs and out. F32 and BF16 run the fused kernel (F32 arithmetic, BF16
// rounded once on store), F16 through F32; F64 takes the naive formulas in F64.
struct AttentionResult {
  Tensor out;
  Tensor lse;
};
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                             std::optional<double> scale = std::nullopt);
struct AttentionGrads {
  Tensor grad_q, grad_k, grad_v;
};
// Recomputes the probabilities tile by tile from lse (no stored scores).
AttentionGrads scaled_dot_product_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const AttentionResult& saved, bool causal,
                                                     std::optional<double> scale = std::nullopt);

// table [V, D], ids integer of any shape -> [..., D]. Ids outside [0, V) are an error
// unless `masked`: then they give zero rows (the vocab-parallel lookup).
Tensor embedding(const Tensor& table, const Tensor& ids, bool masked = false);
// Scatter-add of grad_out [..., D] into a [num_rows, D] gradient; masked ids are skipped.
Tensor embedding_backward(const Tensor& grad_out, const Tensor& ids, int64_t num_rows, bool masked = false);

// Mean (or sum) negative log-likelihood of integer targets under softmax(logits).
// logits [N, C], targets [N] (I64/I32); targets equal to ignore_index do not count.
enum class LossReduction : uint8_t { Mean, Sum, None };
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, LossReduction reduction = LossReduction::Mean,
                     int64_t ignore_index = -100);
// dL/dlogits for a scalar upstream gradient (Mean/Sum) or [N] gradient (None).
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                              LossReduction reduction = LossReduction::Mean, int64_t ignore_index = -100);

}  // namespace dtensor
