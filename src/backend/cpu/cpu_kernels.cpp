// Binds the CPU kernel families (cpu_kernels.h) into the CPU Kernels table.
#include "backend/cpu/cpu_kernels.h"

namespace dtensor::backend {
namespace {

class CpuKernels final : public Kernels {
 public:
  void copy(const Tensor& src, Tensor& dst) override { cpu::copy(src, dst); }
  void fill(Tensor& dst, double value) override { cpu::fill(dst, value); }
  void fill_randn(Tensor& dst, uint64_t seed, uint64_t offset) override { cpu::fill_randn(dst, seed, offset); }
  void fill_rand(Tensor& dst, uint64_t seed, uint64_t offset) override { cpu::fill_rand(dst, seed, offset); }
  void arange(Tensor& dst, double start, double step) override { cpu::arange(dst, start, step); }
  void unary(UnaryOp op, const Tensor& a, Tensor& out) override { cpu::unary(op, a, out); }
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override { cpu::binary(op, a, b, out); }
  void where(const Tensor& c, const Tensor& a, const Tensor& b, Tensor& out) override { cpu::where(c, a, b, out); }
  void reduce(Reduce op, const Tensor& a, const std::vector<int64_t>& dims, Tensor& out) override {
    cpu::reduce(op, a, dims, out);
  }
  void var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, Tensor& out) override {
    cpu::var(a, dims, correction, out);
  }
  void argmax(const Tensor& a, int64_t dim, Tensor& out) override { cpu::argmax(a, dim, out); }
  void matmul(const Tensor& a, const Tensor& b, Tensor& out) override { cpu::matmul(a, b, out); }
  void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) override {
    cpu::matmul_bias(a, b, bias, out);
  }
  void matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, GeluApprox approx, Tensor& out,
                        Tensor& pre) override {
    cpu::matmul_bias_gelu(a, b, bias, approx, out, pre);
  }
  void softmax(const Tensor& a, int64_t dim, bool log, Tensor& out) override { cpu::softmax(a, dim, log, out); }
  void softmax_backward(const Tensor& g, const Tensor& out, int64_t dim, bool log, Tensor& grad_in) override {
    cpu::softmax_backward(g, out, dim, log, grad_in);
  }
  void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& out, Tensor& mean,
                  Tensor& rstd) override {
    cpu::layer_norm(x, w, b, eps, out, mean, rstd);
  }
  void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                           Tensor& gi, Tensor& gw, Tensor& gb) override {
    cpu::layer_norm_backward(g, x, mean, rstd, w, gi, gw, gb);
  }
  void rms_norm(const Tensor& x, const Tensor& w, double eps, Tensor& out, Tensor& rstd) override {
    cpu::rms_norm(x, w, eps, out, rstd);
  }
  void rms_norm_backward(const Tensor& g, const Tensor& x, const Tensor& rstd, const Tensor& w, Tensor& gi,
                         Tensor& gw) override {
    cpu::rms_norm_backward(g, x, rstd, w, gi, gw);
  }
  void gelu_backward(const Tensor& g, const Tensor& x, GeluApprox approx, Tensor& gi) override {
    cpu::gelu_backward(g, x, approx, gi);
  }
  void silu_backward(const Tensor& g, const Tensor& x, Tensor& gi) override { cpu::silu_backward(g, x, gi); }
  void embedding(const Tensor& table, const Tensor& ids, bool masked, Tensor& out) override {
    cpu::embedding(table, ids, masked, out);
  }
  void embedding_backward(const Tensor& g, const Tensor& ids, bool masked, Tensor& grad_table) override {
    cpu::embedding_backward(g, ids, masked, grad_table);
  }
  void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& losses) override {
    cpu::cross_entropy(logits, targets, ignore_index, losses);
  }
  void cross_entropy_backward(const Tensor& grad_rows, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index, Tensor& grad_logits) override {
    cpu::cross_entropy_backward(grad_rows, logits, targets, ignore_index, grad_logits);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                 Tensor& lse) override {
    cpu::attention(q, k, v, causal, scale, out, lse);
  }
  void attention_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, bool causal, double scale, Tensor& gq, Tensor& gk, Tensor& gv) override {
    cpu::attention_backward(g, q, k, v, out, lse, causal, scale, gq, gk, gv);
  }
  void argsort(const Tensor& a, bool descending, Tensor& out) override { cpu::argsort(a, descending, out); }
  void bincount(const Tensor& ids, Tensor& counts) override { cpu::bincount(ids, counts); }
  bool adamw_step(const AdamWStep& step, Tensor& param, const Tensor& grad, Tensor& exp_avg,
                  Tensor& exp_avg_sq) override {
    return cpu::adamw_step(step, param, grad, exp_avg, exp_avg_sq);
  }
};

}  // namespace

Kernels& cpu_kernels() {
  static CpuKernels table;
  return table;
}

}  // namespace dtensor::backend
