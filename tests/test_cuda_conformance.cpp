// Cross-device conformance in the manner of ggml's test-backend-ops (label cuda):
// one table of cases that together reach every entry of the kernel table
// (src/backend/kernels.h), forward and backward, every UnaryOp, BinaryOp and
// reduction, each in the dtypes the op supports; on a GPU every case runs on CUDA
// and on the CPU and the results are compared. Where no GPU is, the cases run on the
// CPU through a counting wrapper of its table and the suite checks that they reach
// every entry and op (a kernel added without a case here fails it), so the GPU run
// covers the whole backend. The per-family suites (test_cuda_elementwise, _nn,
// _matmul, _attention, ...) go deeper into layouts and edge cases of each family.
#include <algorithm>
#include <mutex>
#include <set>
#include <string>

#include "backend/kernels.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);
const std::vector<DType> kFloats = {DType::F32, DType::F64, DType::BF16, DType::F16};
const std::vector<DType> kEvery = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                   DType::I64, DType::I32, DType::Bool};

// Reproducible values in [lo, hi) of `dtype` (integers rounded, Bool: above the middle).
Tensor uniform(const Shape& shape, DType dtype, double lo, double hi, uint64_t seed) {
  Tensor u = Tensor::rand(shape, seed, DType::F64) * (hi - lo) + lo;
  if (dtype == DType::Bool) return binary(BinaryOp::Gt, u, (lo + hi) / 2);
  if (is_integral(dtype)) return u.to(DType::I64).to(dtype);
  return u.to(dtype);
}

// Every value of the enum: op_name gives the generic name past the last one.
std::vector<UnaryOp> all_unary_ops() {
  std::vector<UnaryOp> ops;
  for (int i = 0; std::string(op_name(static_cast<UnaryOp>(i))) != "unary"; ++i) ops.push_back(static_cast<UnaryOp>(i));
  return ops;
}
std::vector<BinaryOp> all_binary_ops() {
  std::vector<BinaryOp> ops;
  for (int i = 0; std::string(op_name(static_cast<BinaryOp>(i))) != "binary"; ++i) {
    ops.push_back(static_cast<BinaryOp>(i));
  }
  return ops;
}

// One case: inputs made on the CPU for a dtype, then the op(s) on those inputs moved
// to the device under test; every returned tensor is compared.
struct Case {
  std::string name;
  std::vector<DType> dtypes;
  std::function<std::vector<Tensor>(DType)> inputs;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, DType)> run;
  double tolerance_scale = 1;  // for ops that accumulate (matmul, attention)
};

std::vector<Case> cases() {
  std::vector<Case> all;
  // A one-element tensor whose only use is naming the device of a factory case.
  auto on_device = [](DType) { return std::vector<Tensor>{Tensor::zeros({1})}; };

  all.push_back({"copy: every dtype to every dtype, strided sources", kEvery,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({5, 6}, t, -3, 3, 1)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   std::vector<Tensor> out;
                   for (DType to : kEvery) out.push_back(in[0].to(to));
                   out.push_back(in[0].transpose(0, 1).contiguous());
                   out.push_back(in[0].slice(1, 1, 5, 2).contiguous());
                   return out;
                 }});
  all.push_back({"fill and arange",
                 {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32},
                 on_device,
                 [](const std::vector<Tensor>& in, DType t) {
                   const Device d = in[0].device();
                   return std::vector<Tensor>{Tensor::full({7, 3}, 3.0, t, d), Tensor::zeros({5}, t, d),
                                              Tensor::arange(1.0, 40.0, 3.0, t, d)};
                 }});
  all.push_back(
      {"randn and rand (one counter-based RNG)", kFloats, on_device, [](const std::vector<Tensor>& in, DType t) {
         const Device d = in[0].device();
         return std::vector<Tensor>{Tensor::randn({257}, 9, t, d), Tensor::rand({3, 129}, 10, t, d)};
       }});
  all.push_back({"unary: every op, contiguous and transposed", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({33, 17}, t, 0.1, 3.0, 2)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   std::vector<Tensor> out;
                   for (UnaryOp op : all_unary_ops()) {
                     out.push_back(unary(op, in[0]));
                     out.push_back(unary(op, in[0].transpose(0, 1)));
                   }
                   out.push_back(gelu(in[0] - 1.5, GeluApprox::Tanh));
                   return out;
                 }});
  all.push_back({"unary on integers",
                 {DType::I64, DType::I32},
                 [](DType t) {
                   return std::vector<Tensor>{uniform({9, 5}, t, -20, 20, 3)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   std::vector<Tensor> out;
                   for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Square}) {
                     out.push_back(unary(op, in[0]));
                   }
                   return out;
                 }});
  all.push_back({"binary: every op, broadcast and with a scalar",
                 {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32},
                 [](DType t) {
                   const bool integral = is_integral(t);
                   return std::vector<Tensor>{uniform({4, 1, 6}, t, integral ? -5 : 0.5, integral ? 9 : 2.5, 4),
                                              uniform({3, 1}, t, integral ? 1 : 0.5, integral ? 4 : 2.5, 5)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   std::vector<Tensor> out;
                   for (BinaryOp op : all_binary_ops()) {
                     out.push_back(binary(op, in[0], in[1]));
                     out.push_back(binary(op, in[0], 2.0));
                   }
                   return out;
                 },
                 10});
  all.push_back({"where",
                 {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64},
                 [](DType t) {
                   return std::vector<Tensor>{uniform({4, 6}, DType::Bool, 0, 1, 6), uniform({4, 6}, t, -3, 3, 7),
                                              uniform({6}, t, -3, 3, 8)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   return std::vector<Tensor>{where(in[0], in[1], in[2]), where(in[0], in[2], in[1])};
                 }});
  all.push_back({"reductions: sum, mean, amax, amin, var, argmax over dims, strided", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({6, 35}, t, -2, 2, 9)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   std::vector<Tensor> out;
                   for (const Tensor& x : {in[0], in[0].transpose(0, 1)}) {
                     for (std::vector<int64_t> dims : {std::vector<int64_t>{0}, {1}, {0, 1}}) {
                       out.push_back(sum(x, dims));
                       out.push_back(mean(x, dims, true));
                       out.push_back(amax(x, dims));
                       out.push_back(amin(x, dims));
                     }
                     out.push_back(var(x, {1}, 1));
                     out.push_back(var(x, {0, 1}, 0));
                     out.push_back(argmax(x, 1));
                   }
                   return out;
                 },
                 10});
  all.push_back({"reductions on integers",
                 {DType::I64, DType::I32},
                 [](DType t) {
                   return std::vector<Tensor>{uniform({6, 35}, t, -50, 50, 10)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   return std::vector<Tensor>{sum(in[0], {1}), amax(in[0], {0}), amin(in[0], {0, 1}), argmax(in[0], 0)};
                 }});
  all.push_back({"matmul (batched, transposed, broadcast), linear and linear_gelu with and without bias", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({2, 5, 7}, t, -1, 1, 11), uniform({2, 7, 3}, t, -1, 1, 12),
                                              uniform({4, 7}, t, -1, 1, 13), uniform({4}, t, -1, 1, 14)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   const Tensor& a = in[0];
                   const Tensor& b = in[1];
                   const LinearGeluResult lg = linear_gelu(a, in[2], in[3], GeluApprox::Tanh);
                   return std::vector<Tensor>{matmul(a, b),
                                              matmul(a, in[2].transpose(0, 1)),
                                              matmul(a, b.transpose(1, 2).contiguous().transpose(1, 2)),
                                              linear(a, in[2], in[3]),
                                              linear(a, in[2]),
                                              lg.out,
                                              lg.pre,
                                              linear_gelu(a, in[2], std::nullopt, GeluApprox::None).out};
                 },
                 10});
  all.push_back({"softmax and log_softmax, forward and backward", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({6, 37}, t, -4, 4, 15), uniform({6, 37}, t, -1, 1, 16)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   const Tensor y = softmax(in[0], 1), ly = log_softmax(in[0], 0);
                   return std::vector<Tensor>{y, ly, softmax_backward(in[1], y, 1), log_softmax_backward(in[1], ly, 0)};
                 },
                 10});
  all.push_back({"layer_norm and rms_norm, forward and backward", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({6, 40}, t, -2, 2, 17), uniform({40}, t, 0.5, 1.5, 18),
                                              uniform({40}, t, -0.5, 0.5, 19), uniform({6, 40}, t, -1, 1, 20)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   const Tensor &x = in[0], &w = in[1], &b = in[2], &g = in[3];
                   std::vector<Tensor> out;
                   const NormResult ln = layer_norm(x, {40}, w, b);
                   const NormGrads lg = layer_norm_backward(g, x, ln, {40}, w, true);
                   const NormResult rn = rms_norm(x, {40}, w);
                   const NormGrads rg = rms_norm_backward(g, x, rn, {40}, w);
                   const NormResult bare = layer_norm(x, {40}, std::nullopt, std::nullopt);
                   for (const Tensor& t : {ln.out, ln.mean, ln.rstd, lg.grad_input, lg.grad_weight, lg.grad_bias,
                                           rn.out, rn.rstd, rg.grad_input, rg.grad_weight, bare.out,
                                           layer_norm_backward(g, x, bare, {40}, std::nullopt, false).grad_input}) {
                     out.push_back(t);
                   }
                   return out;
                 },
                 10});
  all.push_back({"gelu and silu backward", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({9, 13}, t, -3, 3, 21), uniform({9, 13}, t, -1, 1, 22)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   return std::vector<Tensor>{gelu_backward(in[1], in[0], GeluApprox::None),
                                              gelu_backward(in[1], in[0], GeluApprox::Tanh),
                                              silu_backward(in[1], in[0])};
                 }});
  all.push_back({"embedding (plain and masked), forward and backward", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({10, 6}, t, -1, 1, 23),
                                              Tensor::from_vector<int64_t>({3, 0, 9, 3, 3, 7, 1, 0}, {2, 4}),
                                              Tensor::from_vector<int64_t>({3, -1, 12, 3, 10, 7, 1, 0}, {2, 4}),
                                              uniform({2, 4, 6}, t, -1, 1, 24)};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   return std::vector<Tensor>{embedding(in[0], in[1]), embedding(in[0], in[2], true),
                                              embedding_backward(in[3], in[1], 10),
                                              embedding_backward(in[3], in[2], 10, true)};
                 },
                 10});
  all.push_back({"argsort (both directions, stable), topk, bincount", kEvery,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({4, 37}, t, -3, 3, 30),
                                              Tensor::from_vector<int64_t>({3, 0, 9, 3, -1, 7, 1, 12}, {8})};
                 },
                 [](const std::vector<Tensor>& in, DType) {
                   const TopK top = topk(in[0], 5, 1);
                   return std::vector<Tensor>{argsort(in[0], 1), argsort(in[0], 0, true), top.values, top.indices,
                                              bincount(in[1], 10)};
                 }});
  all.push_back({"cross_entropy (mean, sum, none; an ignored target), forward and backward", kFloats,
                 [](DType t) {
                   return std::vector<Tensor>{uniform({8, 11}, t, -3, 3, 25),
                                              Tensor::from_vector<int64_t>({1, 10, 0, -100, 5, 5, 2, 9}, {8}),
                                              uniform({8}, t, 0.5, 1.5, 26)};
                 },
                 [](const std::vector<Tensor>& in, DType t) {
                   std::vector<Tensor> out;
                   const Tensor one = Tensor::full({}, 1.0, t, in[0].device());
                   for (LossReduction r : {LossReduction::Mean, LossReduction::Sum}) {
                     out.push_back(cross_entropy(in[0], in[1], r));
                     out.push_back(cross_entropy_backward(one, in[0], in[1], r));
                   }
                   out.push_back(cross_entropy(in[0], in[1], LossReduction::None));
                   out.push_back(cross_entropy_backward(in[2], in[0], in[1], LossReduction::None));
                   return out;
                 },
                 10});
  all.push_back(
      {"attention (causal and not, Sq != Sk), forward and backward", kFloats,
       [](DType t) {
         return std::vector<Tensor>{uniform({2, 2, 9, 8}, t, -1, 1, 27), uniform({2, 2, 11, 8}, t, -1, 1, 28),
                                    uniform({2, 2, 11, 8}, t, -1, 1, 29), uniform({2, 2, 9, 8}, t, -1, 1, 30)};
       },
       [](const std::vector<Tensor>& in, DType) {
         std::vector<Tensor> out;
         for (bool causal : {false, true}) {
           const AttentionResult r = scaled_dot_product_attention(in[0], in[1], in[2], causal);
           const AttentionGrads g = scaled_dot_product_attention_backward(in[3], in[0], in[1], in[2], r, causal);
           for (const Tensor& t : {r.out, r.lse, g.grad_q, g.grad_k, g.grad_v}) out.push_back(t);
         }
         return out;
       },
       10});
  // F32 parameters and state; the gradient in the case's dtype.
  all.push_back(
      {"the fused AdamW step",
       {DType::F32, DType::BF16},
       [](DType t) {
         return std::vector<Tensor>{uniform({300}, DType::F32, -1, 1, 31), uniform({300}, t, -1, 1, 32),
                                    uniform({300}, DType::F32, -0.1, 0.1, 33), uniform({300}, DType::F32, 0, 0.01, 34)};
       },
       [](const std::vector<Tensor>& in, DType) {
         Tensor param = in[0].clone(), exp_avg = in[2].clone(), exp_avg_sq = in[3].clone();
         const backend::AdamWStep step{
             .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 3};
         const bool fused = backend::kernels_for(param.device()).adamw_step(step, param, in[1], exp_avg, exp_avg_sq);
         EXPECT_TRUE(fused) << "no fused AdamW on " << param.device().to_string();
         return std::vector<Tensor>{param, exp_avg, exp_avg_sq};
       }});
  return all;
}

// Counts the entries (and ops) of the CPU table that calls reach.
class CountingKernels final : public backend::Kernels {
 public:
  explicit CountingKernels(backend::Kernels& inner) : inner_(inner) {}

  std::set<std::string> reached() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reached_;
  }

  void copy(const Tensor& src, Tensor& dst) override {
    note("copy");
    inner_.copy(src, dst);
  }
  void fill(Tensor& dst, double value) override {
    note("fill");
    inner_.fill(dst, value);
  }
  void fill_randn(Tensor& dst, uint64_t seed, uint64_t offset) override {
    note("fill_randn");
    inner_.fill_randn(dst, seed, offset);
  }
  void fill_rand(Tensor& dst, uint64_t seed, uint64_t offset) override {
    note("fill_rand");
    inner_.fill_rand(dst, seed, offset);
  }
  void arange(Tensor& dst, double start, double step) override {
    note("arange");
    inner_.arange(dst, start, step);
  }
  void unary(UnaryOp op, const Tensor& a, Tensor& out) override {
    note(std::string("unary ") + op_name(op));
    inner_.unary(op, a, out);
  }
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
    note(std::string("binary ") + op_name(op));
    inner_.binary(op, a, b, out);
  }
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) override {
    note("where");
    inner_.where(cond, a, b, out);
  }
  void reduce(Reduce op, const Tensor& a, const std::vector<int64_t>& dims, Tensor& out) override {
    note(reduce_name(op));
    inner_.reduce(op, a, dims, out);
  }
  void var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, Tensor& out) override {
    note("var");
    inner_.var(a, dims, correction, out);
  }
  void argmax(const Tensor& a, int64_t dim, Tensor& out) override {
    note("argmax");
    inner_.argmax(a, dim, out);
  }
  void matmul(const Tensor& a, const Tensor& b, Tensor& out) override {
    note("matmul");
    inner_.matmul(a, b, out);
  }
  void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) override {
    note("matmul_bias");
    inner_.matmul_bias(a, b, bias, out);
  }
  void matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, GeluApprox approx, Tensor& out,
                        Tensor& pre) override {
    note("matmul_bias_gelu");
    inner_.matmul_bias_gelu(a, b, bias, approx, out, pre);
  }
  void softmax(const Tensor& a, int64_t dim, bool log, Tensor& out) override {
    note(log ? "log_softmax" : "softmax");
    inner_.softmax(a, dim, log, out);
  }
  void softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim, bool log, Tensor& grad_in) override {
    note(log ? "log_softmax_backward" : "softmax_backward");
    inner_.softmax_backward(grad_out, out, dim, log, grad_in);
  }
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& out, Tensor& mean,
                  Tensor& rstd) override {
    note("layer_norm");
    inner_.layer_norm(x, weight, bias, eps, out, mean, rstd);
  }
  void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                           const Tensor& weight, Tensor& grad_in, Tensor& grad_weight, Tensor& grad_bias) override {
    note("layer_norm_backward");
    inner_.layer_norm_backward(grad_out, x, mean, rstd, weight, grad_in, grad_weight, grad_bias);
  }
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, Tensor& out, Tensor& rstd) override {
    note("rms_norm");
    inner_.rms_norm(x, weight, eps, out, rstd);
  }
  void rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& rstd, const Tensor& weight,
                         Tensor& grad_in, Tensor& grad_weight) override {
    note("rms_norm_backward");
    inner_.rms_norm_backward(grad_out, x, rstd, weight, grad_in, grad_weight);
  }
  void gelu_backward(const Tensor& grad_out, const Tensor& x, GeluApprox approx, Tensor& grad_in) override {
    note("gelu_backward");
    inner_.gelu_backward(grad_out, x, approx, grad_in);
  }
  void silu_backward(const Tensor& grad_out, const Tensor& x, Tensor& grad_in) override {
    note("silu_backward");
    inner_.silu_backward(grad_out, x, grad_in);
  }
  void embedding(const Tensor& table, const Tensor& ids, bool masked, Tensor& out) override {
    note("embedding");
    inner_.embedding(table, ids, masked, out);
  }
  void embedding_backward(const Tensor& grad_out, const Tensor& ids, bool masked, Tensor& grad_table) override {
    note("embedding_backward");
    inner_.embedding_backward(grad_out, ids, masked, grad_table);
  }
  void argsort(const Tensor& a, bool descending, Tensor& out) override {
    note("argsort");
    inner_.argsort(a, descending, out);
  }
  void bincount(const Tensor& ids, Tensor& counts) override {
    note("bincount");
    inner_.bincount(ids, counts);
  }
  void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& losses) override {
    note("cross_entropy");
    inner_.cross_entropy(logits, targets, ignore_index, losses);
  }
  void cross_entropy_backward(const Tensor& grad_rows, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index, Tensor& grad_logits) override {
    note("cross_entropy_backward");
    inner_.cross_entropy_backward(grad_rows, logits, targets, ignore_index, grad_logits);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                 Tensor& lse) override {
    note("attention");
    inner_.attention(q, k, v, causal, scale, out, lse);
  }
  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, bool causal, double scale, Tensor& grad_q, Tensor& grad_k,
                          Tensor& grad_v) override {
    note("attention_backward");
    inner_.attention_backward(grad_out, q, k, v, out, lse, causal, scale, grad_q, grad_k, grad_v);
  }
  bool adamw_step(const backend::AdamWStep& step, Tensor& param, const Tensor& grad, Tensor& exp_avg,
                  Tensor& exp_avg_sq) override {
    note("adamw_step");
    return inner_.adamw_step(step, param, grad, exp_avg, exp_avg_sq);
  }

  static std::string reduce_name(Reduce op) {
    switch (op) {
      case Reduce::Sum: return "reduce sum";
      case Reduce::Mean: return "reduce mean";
      case Reduce::Max: return "reduce max";
      case Reduce::Min: return "reduce min";
    }
    return "reduce ?";
  }

 private:
  void note(std::string entry) {
    std::lock_guard<std::mutex> lock(mutex_);
    reached_.insert(std::move(entry));
  }

  backend::Kernels& inner_;
  mutable std::mutex mutex_;
  std::set<std::string> reached_;
};

// What the cases must reach: every entry of the table, every UnaryOp and BinaryOp,
// every reduction kind (CountingKernels names them).
std::set<std::string> every_entry() {
  std::set<std::string> want = {"copy",
                                "fill",
                                "fill_randn",
                                "fill_rand",
                                "arange",
                                "where",
                                "var",
                                "argmax",
                                "matmul",
                                "matmul_bias",
                                "matmul_bias_gelu",
                                "softmax",
                                "log_softmax",
                                "softmax_backward",
                                "log_softmax_backward",
                                "layer_norm",
                                "layer_norm_backward",
                                "rms_norm",
                                "rms_norm_backward",
                                "gelu_backward",
                                "silu_backward",
                                "embedding",
                                "embedding_backward",
                                "argsort",
                                "bincount",
                                "cross_entropy",
                                "cross_entropy_backward",
                                "attention",
                                "attention_backward",
                                "adamw_step"};
  for (UnaryOp op : all_unary_ops()) want.insert(std::string("unary ") + op_name(op));
  for (BinaryOp op : all_binary_ops()) want.insert(std::string("binary ") + op_name(op));
  using Reduce = backend::Kernels::Reduce;
  for (Reduce op : {Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min}) {
    want.insert(CountingKernels::reduce_name(op));
  }
  return want;
}

double tolerance(DType t) {
  switch (t) {
    case DType::BF16: return 2e-2;
    case DType::F16: return 2e-3;
    case DType::F32: return 1e-5;
    case DType::F64: return 1e-12;
    default: return 0;
  }
}

}  // namespace

// Runs everywhere: the cases work on the CPU in every dtype they list, and together
// reach the whole kernel table, so the GPU comparison below covers every kernel.
TEST(CrossDevice, TheCasesReachEveryKernelOfTheTable) {
  CountingKernels counting(backend::kernels_for(Device::cpu()));
  {
    backend::ScopedCpuKernels scope(counting);
    for (const Case& c : cases()) {
      for (DType t : c.dtypes) {
        SCOPED_TRACE(c.name + " " + std::string(dtype_name(t)));
        const std::vector<Tensor> out = c.run(c.inputs(t), t);
        EXPECT_FALSE(out.empty());
        for (const Tensor& o : out) EXPECT_TRUE(o.defined());
      }
    }
  }
  const std::set<std::string> reached = counting.reached();
  for (const std::string& entry : every_entry()) {
    EXPECT_TRUE(reached.count(entry)) << "no case of test_cuda_conformance reaches the kernel '" << entry
                                      << "': add one, so that the GPU run compares it with the CPU";
  }
}

TEST(CrossDevice, EveryOpMatchesTheCpuInEveryDtype) {
  REQUIRE_GPU();
  for (const Case& c : cases()) {
    for (DType t : c.dtypes) {
      const std::string what = c.name + " " + std::string(dtype_name(t));
      const std::vector<Tensor> inputs = c.inputs(t);
      std::vector<Tensor> on_gpu;
      for (const Tensor& x : inputs) on_gpu.push_back(x.to(kGpu));
      const std::vector<Tensor> want = c.run(inputs, t);
      const std::vector<Tensor> got = c.run(on_gpu, t);
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string which = what + ", output " + std::to_string(i);
        ASSERT_EQ(got[i].device(), kGpu) << which;
        const Tensor back = got[i].to(Device::cpu());
        ASSERT_EQ(back.dtype(), want[i].dtype()) << which;
        ASSERT_EQ(back.shape(), want[i].shape()) << which;
        // The looser of the case's dtype and the output's (an F32 lse of BF16 inputs).
        const double tol =
            is_floating(want[i].dtype()) ? std::max(tolerance(t), tolerance(want[i].dtype())) * c.tolerance_scale : 0;
        EXPECT_TRUE(allclose(back.to(DType::F64), want[i].to(DType::F64), tol, tol))
            << which << ": " << compare(back.to(DType::F64), want[i].to(DType::F64), tol, tol).to_string();
      }
    }
  }
}
