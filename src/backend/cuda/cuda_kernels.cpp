// The CUDA kernel table: every Kernels entry runs on the GPU. The elementwise family
// (copy, fill, unary, binary, where, activation gradients) through elementwise.cu,
// sum/mean/max/min/var/argmax through reduce.cu, matmul through cuBLASLt,
// softmax/log_softmax through softmax.cu, the norms through norm.cu, cross entropy
// and embedding through cross_entropy.cu and embedding.cu, attention through
// attention.cu, randn/rand/arange through factories.cu, argsort and bincount
// through sort.cu (CUB's radix sort) and the fused AdamW step through optim.cu
// (forward and backward where the op has one). Kernels run on the calling thread's
// current stream of the tensors' GPU.
#include <cassert>
#include <cstdint>
#include <cstring>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_engine.h"
#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/embedding.h"
#include "backend/cuda/factories.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/optim.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/softmax.h"
#include "backend/cuda/sort.h"
#include "backend/index_check.h"
#include "backend/kernels.h"
#include "backend/offset_calc.h"
#include "backend/optim_math.h"
#include "util/check.h"

namespace dtensor::backend {

Kernels& cpu_kernels();  // cpu/cpu_kernels.cpp

namespace cuda {
namespace {

// The operands' index plan (operand 0 is the output).
template <int N>
OffsetCalc<N> plan(const Shape& shape, std::array<const Tensor*, N> operands) {
  OffsetCalc<N> calc;
  std::array<const int64_t*, N> strides;
  for (int k = 0; k < N; ++k) strides[static_cast<size_t>(k)] = operands[static_cast<size_t>(k)]->strides().data();
  DT_CHECK_SUPPORTED(make_offset_calc<N>(shape, strides, calc), "cuda elementwise", "at most ", kMaxOffsetDims,
                     " strided dims after merging, got shape ", shape);
  return calc;
}

void* stream_of(const Tensor& t) { return current_stream(t.device().index); }

// The CPU's range check of an index operand (ids, targets; `skip` points at a value
// that is exempt, the ignore_index) on its values copied to the host. The copy waits
// for the stream: the one host synchronisation of these entries, kept so that a bad
// id raises the CPU's std::invalid_argument from this call. A device-side flag
// would avoid the wait but could only report the error from some later call.
void check_indices_on_host(const Tensor& ids, int64_t limit, const int64_t* skip, const char* op, const char* what) {
  const std::vector<int64_t> values = ids.to(Device::cpu()).to(DType::I64).contiguous().to_vector<int64_t>();
  for (size_t n = 0; n < values.size(); ++n) {
    if (!skip || values[n] != *skip) check_index(values[n], limit, n, op, what);
  }
}

CrossEntropyRows cross_entropy_rows(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  return {logits.size(0), logits.size(1), logits.stride(0), logits.stride(1), targets.stride(0), ignore_index};
}

// `table` is the table or its gradient, [V, D] with any strides.
EmbeddingShape embedding_shape(const Tensor& ids, const Tensor& table, bool masked) {
  return {ids.numel(), ids.stride(0), table.size(0), table.size(1), table.stride(0), table.stride(1), masked};
}

const void* optional_ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* optional_ptr(Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// The norms' backward: the F64 partials of the weight/bias gradients live in a
// scratch tensor from the stream-ordered pool (freed here, reused only by work queued
// after the kernels on the same stream).
void norm_backward(const NormShape& shape, const Tensor& g, const Tensor& x, const void* mean, const Tensor& rstd,
                   const Tensor& weight, Tensor& grad_in, Tensor& grad_weight, Tensor& grad_bias) {
  const int64_t wanted = (grad_weight.defined() ? 1 : 0) + (grad_bias.defined() ? 1 : 0);
  const Tensor partials =
      Tensor::empty({wanted * norm_gradient_chunks(shape.rows).chunks * shape.cols}, DType::F64, x.device());
  launch_norm_backward(x.dtype(), shape, g.data_ptr(), x.data_ptr(), mean, rstd.data_ptr(), optional_ptr(weight),
                       grad_in.data_ptr(), optional_ptr(grad_weight), optional_ptr(grad_bias),
                       static_cast<double*>(partials.data_ptr()), stream_of(x));
}

class CudaKernels final : public Kernels {
 public:
  void copy(const Tensor& src, Tensor& dst) override {
    assert(src.shape() == dst.shape() && src.device() == dst.device());
    if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
      cuda::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes(), CopyKind::DeviceToDevice, dst.device().index);
      return;
    }
    launch_copy(src.dtype(), dst.dtype(), dst.numel(), plan<2>(dst.shape(), {&dst, &src}), dst.data_ptr(),
                src.data_ptr(), stream_of(dst));
  }
  void fill(Tensor& dst, double value) override {
    // The element's bits as the CPU rounds `value` to the dtype.
    Tensor one = Tensor::empty({1}, dst.dtype());
    cpu_kernels().fill(one, value);
    uint64_t bits = 0;
    std::memcpy(&bits, one.data_ptr(), dtype_size(dst.dtype()));
    launch_fill(dtype_size(dst.dtype()), bits, dst.numel(), plan<1>(dst.shape(), {&dst}), dst.data_ptr(),
                stream_of(dst));
  }
  void fill_randn(Tensor& dst, uint64_t seed, uint64_t index_offset) override {
    assert(dst.is_contiguous());
    launch_random(RandomKind::Normal, seed, index_offset, dst.numel(), dst.dtype(), dst.data_ptr(), stream_of(dst));
  }
  void fill_rand(Tensor& dst, uint64_t seed, uint64_t index_offset) override {
    assert(dst.is_contiguous());
    launch_random(RandomKind::Uniform, seed, index_offset, dst.numel(), dst.dtype(), dst.data_ptr(), stream_of(dst));
  }
  void arange(Tensor& dst, double start, double step) override {
    assert(dst.dim() <= 1 && dst.is_contiguous());
    launch_arange(start, step, dst.numel(), dst.dtype(), dst.data_ptr(), stream_of(dst));
  }

  void unary(UnaryOp op, const Tensor& a, Tensor& out) override {
    launch_unary(op, out.dtype(), out.numel(), plan<2>(out.shape(), {&out, &a}), out.data_ptr(), a.data_ptr(),
                 stream_of(out));
  }
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override {
    launch_binary(op, a.dtype(), out.numel(), plan<3>(out.shape(), {&out, &a, &b}), out.data_ptr(), a.data_ptr(),
                  b.data_ptr(), stream_of(out));
  }
  void where(const Tensor& c, const Tensor& a, const Tensor& b, Tensor& out) override {
    launch_where(dtype_size(out.dtype()), out.numel(), plan<4>(out.shape(), {&out, &c, &a, &b}), out.data_ptr(),
                 c.data_ptr(), a.data_ptr(), b.data_ptr(), stream_of(out));
  }

  void reduce(Reduce op, const Tensor& a, const std::vector<int64_t>& dims, Tensor& out) override {
    assert(out.is_contiguous());
    ReducePlan p;
    DT_CHECK_SUPPORTED(make_reduce_plan(a.shape(), a.strides().data(), dims, p), "cuda reduce", "at most ",
                       kMaxOffsetDims, " strided dims after merging, got shape ", a.shape());
    const ReduceOp kind = op == Reduce::Sum    ? ReduceOp::Sum
                          : op == Reduce::Mean ? ReduceOp::Mean
                          : op == Reduce::Max  ? ReduceOp::Max
                                               : ReduceOp::Min;
    launch_reduce(kind, a.dtype(), out.dtype(), p, out.data_ptr(), a.data_ptr(), stream_of(a));
  }
  void var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, Tensor& out) override {
    assert(out.is_contiguous());
    ReducePlan p;
    DT_CHECK_SUPPORTED(make_reduce_plan(a.shape(), a.strides().data(), dims, p), "cuda var", "at most ", kMaxOffsetDims,
                       " strided dims after merging, got shape ", a.shape());
    launch_var(a.dtype(), out.dtype(), p, correction, out.data_ptr(), a.data_ptr(), stream_of(a));
  }
  void argmax(const Tensor& a, int64_t dim, Tensor& out) override {
    assert(out.is_contiguous() && out.dtype() == DType::I64);
    ReducePlan p;
    DT_CHECK_SUPPORTED(make_reduce_plan(a.shape(), a.strides().data(), {dim}, p), "cuda argmax", "at most ",
                       kMaxOffsetDims, " strided dims after merging, got shape ", a.shape());
    launch_argmax(a.dtype(), p, static_cast<int64_t*>(out.data_ptr()), a.data_ptr(), stream_of(a));
  }
  void matmul(const Tensor& a, const Tensor& b, Tensor& out) override {
    if (out.numel() == 0) return;
    if (a.size(2) == 0) return fill(out, 0);
    run_gemm(a, b, Tensor(), out);
  }
  void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) override {
    if (out.numel() == 0) return;
    if (a.size(2) == 0) return copy(bias.expand(out.shape()), out);  // an empty sum: every row is the bias
    run_gemm(a, b, bias, out);
  }
  void matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, GeluApprox approx, Tensor& out,
                        Tensor& pre) override {
    if (out.numel() == 0) return;
    if (a.size(2) > 0 && approx == GeluApprox::Tanh) {  // cuBLASLt's GELU is the tanh form
      const GemmCall c = gemm_call(a, b, out);
      if (gemm_bias_gelu(c.plan, out.dtype(), c.a.data_ptr(), c.b.data_ptr(), optional_ptr(bias), out.data_ptr(),
                         pre.data_ptr(), out.device().index)) {
        return;
      }
    }
    bias.defined() ? matmul_bias(a, b, bias, pre) : matmul(a, b, pre);
    unary(approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, pre, out);
  }
  void softmax(const Tensor& a, int64_t dim, bool log, Tensor& out) override {
    LinePlan<2> p;
    DT_CHECK_SUPPORTED(make_line_plan<2>(a.shape(), {out.strides().data(), a.strides().data()}, dim, p), "cuda softmax",
                       "at most ", kMaxOffsetDims, " strided dims after merging, got shape ", a.shape());
    launch_softmax(a.dtype(), p, log, out.data_ptr(), a.data_ptr(), stream_of(a));
  }
  void softmax_backward(const Tensor& g, const Tensor& out, int64_t dim, bool log, Tensor& grad_in) override {
    LinePlan<3> p;
    DT_CHECK_SUPPORTED(
        make_line_plan<3>(out.shape(), {grad_in.strides().data(), g.strides().data(), out.strides().data()}, dim, p),
        "cuda softmax_backward", "at most ", kMaxOffsetDims, " strided dims after merging, got shape ", out.shape());
    launch_softmax_backward(out.dtype(), p, log, grad_in.data_ptr(), g.data_ptr(), out.data_ptr(), stream_of(out));
  }
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& out, Tensor& mean,
                  Tensor& rstd) override {
    launch_norm(x.dtype(), {x.size(0), x.size(1), true}, eps, x.data_ptr(), optional_ptr(weight), optional_ptr(bias),
                out.data_ptr(), mean.data_ptr(), rstd.data_ptr(), stream_of(x));
  }
  void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                           const Tensor& weight, Tensor& grad_in, Tensor& grad_weight, Tensor& grad_bias) override {
    norm_backward({x.size(0), x.size(1), true}, g, x, mean.data_ptr(), rstd, weight, grad_in, grad_weight, grad_bias);
  }
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, Tensor& out, Tensor& rstd) override {
    launch_norm(x.dtype(), {x.size(0), x.size(1), false}, eps, x.data_ptr(), optional_ptr(weight), nullptr,
                out.data_ptr(), nullptr, rstd.data_ptr(), stream_of(x));
  }
  void rms_norm_backward(const Tensor& g, const Tensor& x, const Tensor& rstd, const Tensor& weight, Tensor& grad_in,
                         Tensor& grad_weight) override {
    Tensor no_bias;
    norm_backward({x.size(0), x.size(1), false}, g, x, nullptr, rstd, weight, grad_in, grad_weight, no_bias);
  }
  void gelu_backward(const Tensor& g, const Tensor& x, GeluApprox approx, Tensor& grad_in) override {
    activation_backward(approx == GeluApprox::Tanh ? ActivationGrad::GeluTanh : ActivationGrad::GeluErf, g, x, grad_in);
  }
  void silu_backward(const Tensor& g, const Tensor& x, Tensor& grad_in) override {
    activation_backward(ActivationGrad::Silu, g, x, grad_in);
  }
  void activation_backward(ActivationGrad op, const Tensor& g, const Tensor& x, Tensor& grad_in) {
    launch_activation_backward(op, grad_in.dtype(), grad_in.numel(), plan<3>(grad_in.shape(), {&grad_in, &g, &x}),
                               grad_in.data_ptr(), g.data_ptr(), x.data_ptr(), stream_of(grad_in));
  }
  void embedding(const Tensor& table, const Tensor& ids, bool masked, Tensor& out) override {
    if (!masked) check_indices_on_host(ids, table.size(0), nullptr, "embedding", "id");
    const EmbeddingShape shape = embedding_shape(ids, table, masked);
    launch_embedding(dtype_size(table.dtype()), ids.dtype(), shape, table.data_ptr(), ids.data_ptr(), out.data_ptr(),
                     stream_of(table));
  }
  void embedding_backward(const Tensor& g, const Tensor& ids, bool masked, Tensor& grad_table) override {
    if (!masked) check_indices_on_host(ids, grad_table.size(0), nullptr, "embedding_backward", "id");
    const EmbeddingShape shape = embedding_shape(ids, grad_table, masked);
    // Sort buffers and CUB's temporary storage from the stream-ordered pool.
    const size_t bytes = embedding_backward_scratch_bytes(shape);
    const Tensor scratch = Tensor::empty({static_cast<int64_t>((bytes + 7) / 8)}, DType::I64, g.device());
    launch_embedding_backward(g.dtype(), ids.dtype(), shape, g.data_ptr(), g.stride(0), g.stride(1), ids.data_ptr(),
                              grad_table.data_ptr(), scratch.data_ptr(), bytes, stream_of(g));
  }
  void argsort(const Tensor& a, bool descending, Tensor& out) override {
    // Key and position buffers and CUB's temporary storage from the stream-ordered pool.
    const size_t bytes = argsort_scratch_bytes(a.size(0), a.size(1));
    const Tensor scratch = Tensor::empty({static_cast<int64_t>((bytes + 7) / 8)}, DType::I64, a.device());
    launch_argsort(a.dtype(), a.size(0), a.size(1), descending, a.data_ptr(), static_cast<int64_t*>(out.data_ptr()),
                   scratch.data_ptr(), bytes, stream_of(a));
  }
  void bincount(const Tensor& ids, Tensor& counts) override {
    launch_bincount(ids.dtype(), ids.numel(), ids.data_ptr(), counts.numel(), static_cast<int64_t*>(counts.data_ptr()),
                    stream_of(ids));
  }
  void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& losses) override {
    check_indices_on_host(targets, logits.size(1), &ignore_index, "cross_entropy", "target");
    launch_cross_entropy(logits.dtype(), targets.dtype(), cross_entropy_rows(logits, targets, ignore_index),
                         logits.data_ptr(), targets.data_ptr(), losses.data_ptr(), stream_of(logits));
  }
  void cross_entropy_backward(const Tensor& grad_rows, const Tensor& logits, const Tensor& targets,
                              int64_t ignore_index, Tensor& grad_logits) override {
    check_indices_on_host(targets, logits.size(1), &ignore_index, "cross_entropy_backward", "target");
    const Tensor upstream = grad_rows.to(DType::F64).contiguous();  // the CPU reads it as doubles too
    launch_cross_entropy_backward(logits.dtype(), targets.dtype(), cross_entropy_rows(logits, targets, ignore_index),
                                  static_cast<const double*>(upstream.data_ptr()), logits.data_ptr(),
                                  targets.data_ptr(), grad_logits.data_ptr(), stream_of(logits));
  }
  // cuDNN's fused attention where it takes the call (attention_engine.h), else the own
  // kernels, which compute F16 through F32.
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                 Tensor& lse) override {
    if (const auto graph = cudnn_attention_graph({&q, &k, &v, &out}, causal, scale, false)) {
      const Tensor workspace = cudnn_workspace(graph->workspace_bytes, q.device());
      cudnn::run_forward(*graph, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                         static_cast<float*>(lse.data_ptr()), static_cast<float>(scale), workspace.data_ptr(),
                         stream_of(q));
      return;
    }
    if (q.dtype() == DType::F16) {
      Tensor out32 = Tensor::empty(out.shape(), DType::F32, out.device());
      own_attention(as_f32(q), as_f32(k), as_f32(v), causal, scale, out32, lse);
      out.copy_(out32);
      return;
    }
    own_attention(q, k, v, causal, scale, out, lse);
  }
  void attention_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, bool causal, double scale, Tensor& grad_q, Tensor& grad_k,
                          Tensor& grad_v) override {
    if (const auto graph =
            cudnn_attention_graph({&q, &k, &v, &out, &g, &grad_q, &grad_k, &grad_v}, causal, scale, true)) {
      const Tensor workspace = cudnn_workspace(graph->workspace_bytes, q.device());
      // cuDNN reads the stats 16-byte aligned; a context-parallel chunk's lse is a view.
      const Tensor stats = reinterpret_cast<uintptr_t>(lse.data_ptr()) % 16 == 0 ? lse : lse.clone();
      cudnn::run_backward(*graph, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), g.data_ptr(),
                          static_cast<const float*>(stats.data_ptr()), grad_q.data_ptr(), grad_k.data_ptr(),
                          grad_v.data_ptr(), static_cast<float>(scale), workspace.data_ptr(), stream_of(q));
      return;
    }
    if (q.dtype() == DType::F16) {
      Tensor gq = Tensor::empty(grad_q.shape(), DType::F32, q.device()),
             gk = Tensor::empty(grad_k.shape(), DType::F32, q.device()),
             gv = Tensor::empty(grad_v.shape(), DType::F32, q.device());
      own_attention_backward(as_f32(g), as_f32(q), as_f32(k), as_f32(v), as_f32(out), lse, causal, scale, gq, gk, gv);
      grad_q.copy_(gq);
      grad_k.copy_(gk);
      grad_v.copy_(gv);
      return;
    }
    own_attention_backward(g, q, k, v, out, lse, causal, scale, grad_q, grad_k, grad_v);
  }
  // An operand in F32 with rows of unit stride, as the own kernels read it.
  static Tensor as_f32(const Tensor& t) { return with_unit_stride_rows(t.to(DType::F32)); }
  static void own_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                            Tensor& lse) {
    const AttentionShape s = attention_shape(q, k, v, causal, scale);
    launch_attention(s, attention_rows(q), attention_rows(k), attention_rows(v), attention_rows(out), q.data_ptr(),
                     k.data_ptr(), v.data_ptr(), out.data_ptr(), static_cast<float*>(lse.data_ptr()), stream_of(q));
  }
  static void own_attention_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& grad_q,
                                     Tensor& grad_k, Tensor& grad_v) {
    const AttentionShape s = attention_shape(q, k, v, causal, scale);
    const AttentionGradRows rows{attention_rows(g),      attention_rows(q),     attention_rows(k),
                                 attention_rows(v),      attention_rows(out),   attention_rows(grad_q),
                                 attention_rows(grad_k), attention_rows(grad_v)};
    // rowsum(grad_out * out) per query, from the grad_q kernel to the grad_k/grad_v one.
    Tensor delta = Tensor::empty({s.batch.entries * s.queries}, DType::F32, q.device());
    launch_attention_backward(s, rows, g.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                              static_cast<const float*>(lse.data_ptr()), static_cast<float*>(delta.data_ptr()),
                              grad_q.data_ptr(), grad_k.data_ptr(), grad_v.data_ptr(), stream_of(q));
  }
  // The kernels' plan; what they cannot take is a runtime_error naming the limit.
  static AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
    AttentionShape s;
    DT_CHECK_SUPPORTED(make_attention_shape(q, k, v, causal, scale, s), "cuda attention", "at most ",
                       kMaxAttentionBatchDims, " leading dims, got shape ", q.shape());
    DT_CHECK_SUPPORTED(s.batch.entries <= 65535, "cuda attention", "at most 65535 batch entries, got ",
                       s.batch.entries);
    DT_CHECK_SUPPORTED(attention_fits(s), "cuda attention",
                       "head dims whose rows fit the kernels' shared memory, got q ", q.shape(), " and v ", v.shape());
    return s;
  }
  bool adamw_step(const AdamWStep& step, Tensor& param, const Tensor& grad, Tensor& exp_avg,
                  Tensor& exp_avg_sq) override {
    if (!adamw_fusable(param, grad, exp_avg, exp_avg_sq)) return false;
    launch_adamw(step, grad.dtype() == DType::BF16, param.numel(), static_cast<float*>(param.data_ptr()),
                 grad.data_ptr(), static_cast<float*>(exp_avg.data_ptr()), static_cast<float*>(exp_avg_sq.data_ptr()),
                 stream_of(param));
    return true;
  }

 private:
  // The operands of out = a @ b as cuBLASLt takes them: one with neither rows nor
  // columns contiguous is copied contiguous first, once.
  struct GemmCall {
    Tensor a, b;
    GemmPlan plan;
  };
  static GemmCall gemm_call(const Tensor& a, const Tensor& b, const Tensor& out) {
    const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
    BlasOperand probe;
    GemmCall c{blas_operand(m, k, a.stride(1), a.stride(2), a.stride(0), probe) ? a : a.contiguous(),
               blas_operand(k, n, b.stride(1), b.stride(2), b.stride(0), probe) ? b : b.contiguous(), GemmPlan{}};
    [[maybe_unused]] const bool planned =
        make_gemm_plan(batch, m, n, k, c.a.strides().data(), c.b.strides().data(), c.plan);
    assert(planned);
    return c;
  }
  // out = a @ b, plus `bias` when it is defined: in cuBLASLt's epilogue, or (F64, or
  // no algorithm with it for these operands) in a second pass.
  void run_gemm(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) {
    const GemmCall c = gemm_call(a, b, out);
    const int device = out.device().index;
    if (bias.defined() &&
        gemm_bias(c.plan, out.dtype(), c.a.data_ptr(), c.b.data_ptr(), bias.data_ptr(), out.data_ptr(), device)) {
      return;
    }
    gemm(c.plan, out.dtype(), c.a.data_ptr(), c.b.data_ptr(), out.data_ptr(), device);
    if (bias.defined()) binary(BinaryOp::Add, out, bias.expand(out.shape()), out);
  }
};

}  // namespace

Kernels& kernels() {
  static CudaKernels table;
  return table;
}

}  // namespace cuda
}  // namespace dtensor::backend
