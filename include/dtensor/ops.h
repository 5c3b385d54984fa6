// Ops on DistTensors: write model code as if tensors were local.
//
//   DistTensor y = gelu(matmul(x, w));      // or x.matmul(w).gelu()
//
// Each op picks a sharding strategy from its rule (cheapest input redistribution
// under the cost model, ties keep inputs as they are), redistributes the inputs,
// runs the local kernel and wraps the result; decisions are cached per rank. Every
// op records its backward when an input requires grad (autograd.h). The same names
// work on local Tensors (tensor_ops.h).
//
// Partial values flow through linear ops: P+P stays P(sum), P*R and P@R stay
// P(sum), -P stays P; non-linear ops (relu, exp, ...) reduce a Partial first.
//
// Plain Tensors mixed with DistTensors are accepted only inside an
// ImplicitReplication scope, where they count as replicated on the other operand's
// mesh; elsewhere they are an error (an accidental full-size tensor on every rank).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/dist_tensor.h"
#include "dtensor/tensor_ops.h"

namespace dtensor {

class ImplicitReplication {
 public:
  ImplicitReplication();
  ~ImplicitReplication();
  ImplicitReplication(const ImplicitReplication&) = delete;
  ImplicitReplication& operator=(const ImplicitReplication&) = delete;
  static bool active();

 private:
  bool previous_;
};

// A plain tensor as a replicated DistTensor on `mesh`; throws unless inside an
// ImplicitReplication scope. Used by the mixed overloads below.
DistTensor implicit_replicate(const Tensor& t, const DeviceMesh& mesh, const char* op);

// ---- pointwise ---------------------------------------------------------------------
DistTensor unary(UnaryOp op, const DistTensor& a);
DistTensor binary(BinaryOp op, const DistTensor& a, const DistTensor& b);
DistTensor binary(BinaryOp op, const DistTensor& a, double scalar);
DistTensor binary(BinaryOp op, const DistTensor& a, const Tensor& b);
DistTensor binary(BinaryOp op, const Tensor& a, const DistTensor& b);

DistTensor neg(const DistTensor& a);
DistTensor abs(const DistTensor& a);
DistTensor exp(const DistTensor& a);
DistTensor log(const DistTensor& a);
DistTensor sqrt(const DistTensor& a);
DistTensor rsqrt(const DistTensor& a);
DistTensor tanh(const DistTensor& a);
DistTensor sigmoid(const DistTensor& a);
DistTensor relu(const DistTensor& a);
DistTensor gelu(const DistTensor& a, GeluApprox approx = GeluApprox::None);
DistTensor silu(const DistTensor& a);
DistTensor square(const DistTensor& a);

DistTensor add(const DistTensor& a, const DistTensor& b);
DistTensor sub(const DistTensor& a, const DistTensor& b);
DistTensor mul(const DistTensor& a, const DistTensor& b);
DistTensor div(const DistTensor& a, const DistTensor& b);
DistTensor pow(const DistTensor& a, const DistTensor& b);
DistTensor maximum(const DistTensor& a, const DistTensor& b);
DistTensor minimum(const DistTensor& a, const DistTensor& b);
DistTensor eq(const DistTensor& a, const DistTensor& b);
DistTensor ne(const DistTensor& a, const DistTensor& b);
DistTensor lt(const DistTensor& a, const DistTensor& b);
DistTensor le(const DistTensor& a, const DistTensor& b);
DistTensor gt(const DistTensor& a, const DistTensor& b);
DistTensor ge(const DistTensor& a, const DistTensor& b);
DistTensor add(const DistTensor& a, double s);
DistTensor sub(const DistTensor& a, double s);
DistTensor mul(const DistTensor& a, double s);
DistTensor div(const DistTensor& a, double s);
DistTensor pow(const DistTensor& a, double s);
DistTensor maximum(const DistTensor& a, double s);
DistTensor minimum(const DistTensor& a, double s);
DistTensor where(const DistTensor& cond, const DistTensor& a, const DistTensor& b);

inline DistTensor operator+(const DistTensor& a, const DistTensor& b) { return add(a, b); }
inline DistTensor operator-(const DistTensor& a, const DistTensor& b) { return sub(a, b); }
inline DistTensor operator*(const DistTensor& a, const DistTensor& b) { return mul(a, b); }
inline DistTensor operator/(const DistTensor& a, const DistTensor& b) { return div(a, b); }
inline DistTensor operator+(const DistTensor& a, double s) { return add(a, s); }
inline DistTensor operator-(const DistTensor& a, double s) { return sub(a, s); }
inline DistTensor operator*(const DistTensor& a, double s) { return mul(a, s); }
inline DistTensor operator/(const DistTensor& a, double s) { return div(a, s); }
inline DistTensor operator-(const DistTensor& a) { return neg(a); }
inline DistTensor operator+(double s, const DistTensor& a) { return add(a, s); }
inline DistTensor operator-(double s, const DistTensor& a) { return add(neg(a), s); }
inline DistTensor operator*(double s, const DistTensor& a) { return mul(a, s); }
// Inside an ImplicitReplication scope a plain Tensor beside a DistTensor is the same
// value on every rank (Replicate on every mesh dim), broadcast against the
// DistTensor's global shape.
inline DistTensor operator+(const DistTensor& a, const Tensor& b) { return binary(BinaryOp::Add, a, b); }
inline DistTensor operator-(const DistTensor& a, const Tensor& b) { return binary(BinaryOp::Sub, a, b); }
inline DistTensor operator*(const DistTensor& a, const Tensor& b) { return binary(BinaryOp::Mul, a, b); }
inline DistTensor operator/(const DistTensor& a, const Tensor& b) { return binary(BinaryOp::Div, a, b); }
inline DistTensor operator+(const Tensor& a, const DistTensor& b) { return binary(BinaryOp::Add, a, b); }
inline DistTensor operator-(const Tensor& a, const DistTensor& b) { return binary(BinaryOp::Sub, a, b); }
inline DistTensor operator*(const Tensor& a, const DistTensor& b) { return binary(BinaryOp::Mul, a, b); }
inline DistTensor operator/(const Tensor& a, const DistTensor& b) { return binary(BinaryOp::Div, a, b); }

// ---- reductions ----------------------------------------------------------------------
// Reducing a sharded dim gives Partial (sum) or runs the needed collective; mean
// divides by the global count, exact on uneven shards.
DistTensor sum(const DistTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DistTensor mean(const DistTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DistTensor amax(const DistTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DistTensor amin(const DistTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DistTensor var(const DistTensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
               bool keepdim = false);
DistTensor argmax(const DistTensor& a, int64_t dim, bool keepdim = false);

// ---- linear algebra --------------------------------------------------------------------
DistTensor matmul(const DistTensor& a, const DistTensor& b);
DistTensor matmul(const DistTensor& a, const Tensor& b);
DistTensor linear(const DistTensor& x, const DistTensor& w, const std::optional<DistTensor>& bias = std::nullopt);
// gelu(linear(x, w, bias), approx) with the GELU in the GEMM's epilogue (one pass
// over the output fewer; nn::MLP's first layer): the same values, placements and
// gradients as the two ops, the same communication. Where the bias cannot ride in the
// epilogue (no bias, the contraction dim sharded so that linear's output would be
// Partial, a vector input) it is the two ops.
DistTensor linear_gelu(const DistTensor& x, const DistTensor& w, const std::optional<DistTensor>& bias,
                       GeluApprox approx = GeluApprox::None);

// ---- neural-network ops -------------------------------------------------------------------
DistTensor softmax(const DistTensor& a, int64_t dim);
DistTensor log_softmax(const DistTensor& a, int64_t dim);
DistTensor layer_norm(const DistTensor& x, const Shape& normalized_shape,
                      const std::optional<DistTensor>& weight = std::nullopt,
                      const std::optional<DistTensor>& bias = std::nullopt, double eps = 1e-5);
DistTensor rms_norm(const DistTensor& x, const Shape& normalized_shape,
                    const std::optional<DistTensor>& weight = std::nullopt, double eps = 1e-6);
// table [V, D] sharded on rows (vocab-parallel: masked lookup -> Partial) or columns.
DistTensor embedding(const DistTensor& table, const DistTensor& ids);
// logits [N..., C] (any sharding, the class dim included: never gathered), targets
// [N...] (any number of leading dims).
DistTensor cross_entropy(const DistTensor& logits, const DistTensor& targets,
                         LossReduction reduction = LossReduction::Mean, int64_t ignore_index = -100);
// q, k, v [..., S, Dh]; heads sharded -> local. Scale 1/sqrt(Dh). The sequence
// sharded over one mesh dim (context parallelism: q, k, v of one length, laid out
// alike, the head dim whole) -> ring attention or the all-gather variant, chosen by
// the cost model unless a ContextParallelScope names one; no S x S scores are held.
// Other layouts run as a composite of matmul and softmax.
DistTensor scaled_dot_product_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v,
                                        bool causal = false);

// Context parallelism's knobs for a scope on this rank (parallel/context_parallel.h
// shows the whole picture). Forward and backward of the model run inside the scope;
// activation checkpointing recomputes under the scope its forward saw.
enum class ContextAttention : uint8_t {
  Auto,       // the cost model's choice
  Ring,       // K/V blocks passed around the ring, overlapped with the blocks' compute
  AllGather,  // K/V all-gathered (one collective, no merges), dK/dV reduce-scattered
};
struct ContextParallelOptions {
  std::string mesh_dim = "cp";
  // Sequences on a mesh with `mesh_dim` (of size P) are in load_balanced_positions
  // order: causal attention masks by those positions (and takes the context-parallel
  // path), sequence_positions gives them (position embeddings). S must be a multiple
  // of 2P.
  bool load_balanced = false;
  ContextAttention attention = ContextAttention::Auto;
};
class ContextParallelScope {
 public:
  explicit ContextParallelScope(ContextParallelOptions options);
  // None: no change (what ParallelGPT::context_parallel() gives without a cp dim).
  explicit ContextParallelScope(std::optional<ContextParallelOptions> options);
  ~ContextParallelScope();
  ContextParallelScope(const ContextParallelScope&) = delete;
  ContextParallelScope& operator=(const ContextParallelScope&) = delete;
  // The innermost scope's options on this rank, if any.
  static std::optional<ContextParallelOptions> current();

 private:
  std::optional<ContextParallelOptions> previous_;
};

// The global position of each row of the load-balanced order of `seq` positions over
// `ranks` context-parallel ranks (Megatron's and TorchTitan's): 2 * ranks equal
// chunks, rank r holding chunks r and 2 * ranks - 1 - r, so that under a causal mask
// every rank does the same work. seq = 8, ranks = 2: {0, 1, 6, 7, 2, 3, 4, 5}.
std::vector<int64_t> load_balanced_positions(int64_t seq, int64_t ranks);
// The position of each row of a sequence of length `seq` on `mesh`: 0, 1, ..., or the
// load-balanced order inside a load-balanced ContextParallelScope whose mesh dim
// `mesh` has.
std::vector<int64_t> sequence_positions(const DeviceMesh& mesh, int64_t seq);
// Zeroes elements with probability p and scales the rest by 1/(1-p). The mask is a
// function of (seed, global element index): the same for any mesh and placement.
DistTensor dropout(const DistTensor& a, double p, uint64_t seed, bool training = true);

// ---- shape ops ---------------------------------------------------------------------------
DistTensor transpose(const DistTensor& a, int64_t dim0, int64_t dim1);
DistTensor permute(const DistTensor& a, const std::vector<int64_t>& dims);
// Keeps sharding where the sharded dim maps cleanly (flatten with the sharded dim
// outermost, split of a sharded dim that stays outermost); otherwise redistributes.
DistTensor reshape(const DistTensor& a, const Shape& shape);
// view is reshape: a local piece is copied where its strides cannot express the
// new shape (a DistTensor view could not alias global storage anyway).
DistTensor view(const DistTensor& a, const Shape& shape);
DistTensor flatten(const DistTensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
DistTensor slice(const DistTensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
DistTensor cat(const std::vector<DistTensor>& tensors, int64_t dim);
DistTensor stack(const std::vector<DistTensor>& tensors, int64_t dim);
std::vector<DistTensor> split(const DistTensor& a, const std::vector<int64_t>& sizes, int64_t dim);
std::vector<DistTensor> chunk(const DistTensor& a, int64_t k, int64_t dim);
DistTensor expand(const DistTensor& a, const Shape& shape);
DistTensor squeeze(const DistTensor& a, int64_t dim);
DistTensor unsqueeze(const DistTensor& a, int64_t dim);

}  // namespace dtensor
