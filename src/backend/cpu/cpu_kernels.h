// The CPU kernel families (internal). cpu_kernels.cpp binds them into the CPU
// Kernels table; each family lives in its own file:
//   copy_fill.cpp   copy with dtype conversion, fill, random fills, arange
//   pointwise.cpp   unary, binary, where
//   reduce.cpp      sum/mean/max/min, var, argmax
//   gemm.cpp        matmul: the engines (gemm_engine.h), their choice, the split over cores
//   nn.cpp          softmax, norms, activations' backward, embedding, cross-entropy
//   attention.cpp   fused attention (online softmax over key tiles), forward and backward
//   optim.cpp       the fused AdamW step
//   sort.cpp        argsort (stable, sort_key.h's order), bincount
#pragma once

#include <string>
#include <vector>

#include "backend/kernels.h"

namespace dtensor::backend::cpu {

void copy(const Tensor& src, Tensor& dst);
void fill(Tensor& dst, double value);
void fill_randn(Tensor& dst, uint64_t seed, uint64_t index_offset);
void fill_rand(Tensor& dst, uint64_t seed, uint64_t index_offset);
void arange(Tensor& dst, double start, double step);

void unary(UnaryOp op, const Tensor& a, Tensor& out);
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);

void reduce(Kernels::Reduce op, const Tensor& a, const std::vector<int64_t>& dims, Tensor& out);
void var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, Tensor& out);
void argmax(const Tensor& a, int64_t dim, Tensor& out);

void matmul(const Tensor& a, const Tensor& b, Tensor& out);
void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out);
void matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, GeluApprox approx, Tensor& out,
                      Tensor& pre);

void softmax(const Tensor& a, int64_t dim, bool log, Tensor& out);
void softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim, bool log, Tensor& grad_in);
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& out, Tensor& mean,
                Tensor& rstd);
void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, Tensor& grad_in, Tensor& grad_weight, Tensor& grad_bias);
void rms_norm(const Tensor& x, const Tensor& weight, double eps, Tensor& out, Tensor& rstd);
void rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& rstd, const Tensor& weight,
                       Tensor& grad_in, Tensor& grad_weight);
void gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApprox approx, Tensor& grad_in);
void silu_backward(const Tensor& grad_out, const Tensor& x, Tensor& grad_in);
void embedding(const Tensor& table, const Tensor& ids, bool masked, Tensor& out);
void embedding_backward(const Tensor& grad_out, const Tensor& ids, bool masked, Tensor& grad_table);
void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& losses);
void cross_entropy_backward(const Tensor& grad_rows, const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            Tensor& grad_logits);

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out, Tensor& lse);
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, bool causal, double scale, Tensor& grad_q, Tensor& grad_k, Tensor& grad_v);

void argsort(const Tensor& a, bool descending, Tensor& out);
void bincount(const Tensor& ids, Tensor& counts);

bool adamw_step(const AdamWStep& step, Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq);

// The per-rank core budget of every CPU kernel, GEMM included (parallel.h):
// max(1, usable cores / ranks on this host), so simulated ranks (threads) or
// co-located processes do not oversubscribe cores. DTENSOR_NUM_THREADS overrides.
void configure_blas_threads(int ranks_on_host);
int blas_threads();

// C = op(A) op(B) (beta 0 or 1) on raw row-major F32 operands, on the calling
// thread only (for kernels that run GEMMs inside their own tasks, e.g. attention
// tiles): the engine is chosen per shape by measurement as for matmul.
struct GemmArgs;
void gemm_f32(const GemmArgs& g, const float* a, const float* b, float* c);

// One line per GEMM signature seen: the route chosen and the measured candidates.
std::vector<std::string> gemm_choices();

}  // namespace dtensor::backend::cpu
