// The CUDA kernel table: the elementwise family (copy, fill, unary, binary, where)
// runs on the GPU through elementwise.cu, sum/mean/max/min through reduce.cu, matmul
// through cuBLASLt; every other entry throws a
// std::runtime_error that names the op and says it has no CUDA kernel yet (move the
// tensors with to(Device::cpu()) meanwhile). Kernels run on the calling thread's
// current stream of the tensors' GPU.
#include <cassert>
#include <cstring>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/factories.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/optim.h"
#include "backend/cuda/reduce.h"
#include "backend/kernels.h"
#include "backend/offset_calc.h"
#include "backend/optim_math.h"
#include "util/check.h"

namespace dtensor::backend {

Kernels& cpu_kernels();  // cpu/cpu_kernels.cpp

namespace cuda {
namespace {

[[noreturn]] void not_yet(const char* op, const Tensor& t) {
  throw std::runtime_error(detail::concat("[", op, "] no CUDA kernel yet for ", op, " (tensor on ",
                                          t.device().to_string(),
                                          "); copy the operands with .to(Device::cpu()) until it lands"));
}

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
    const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
    if (out.numel() == 0) return;
    if (k == 0) return fill(out, 0);
    // An operand with neither rows nor columns contiguous is copied contiguous first.
    BlasOperand probe;
    const Tensor x = blas_operand(m, k, a.stride(1), a.stride(2), a.stride(0), probe) ? a : a.contiguous();
    const Tensor y = blas_operand(k, n, b.stride(1), b.stride(2), b.stride(0), probe) ? b : b.contiguous();
    GemmPlan p;
    [[maybe_unused]] const bool planned = make_gemm_plan(batch, m, n, k, x.strides().data(), y.strides().data(), p);
    assert(planned);
    gemm(p, out.dtype(), x.data_ptr(), y.data_ptr(), out.data_ptr(), out.device().index);
  }
  void softmax(const Tensor& a, int64_t, bool, Tensor&) override { not_yet("softmax", a); }
  void softmax_backward(const Tensor& g, const Tensor&, int64_t, bool, Tensor&) override {
    not_yet("softmax_backward", g);
  }
  void layer_norm(const Tensor& x, const Tensor&, const Tensor&, double, Tensor&, Tensor&, Tensor&) override {
    not_yet("layer_norm", x);
  }
  void layer_norm_backward(const Tensor& g, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                           Tensor&, Tensor&) override {
    not_yet("layer_norm_backward", g);
  }
  void rms_norm(const Tensor& x, const Tensor&, double, Tensor&, Tensor&) override { not_yet("rms_norm", x); }
  void rms_norm_backward(const Tensor& g, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&) override {
    not_yet("rms_norm_backward", g);
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
  void embedding(const Tensor& table, const Tensor&, bool, Tensor&) override { not_yet("embedding", table); }
  void embedding_backward(const Tensor& g, const Tensor&, bool, Tensor&) override { not_yet("embedding_backward", g); }
  void cross_entropy(const Tensor& logits, const Tensor&, int64_t, Tensor&) override {
    not_yet("cross_entropy", logits);
  }
  void cross_entropy_backward(const Tensor& g, const Tensor&, const Tensor&, int64_t, Tensor&) override {
    not_yet("cross_entropy_backward", g);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Tensor& out,
                 Tensor& lse) override {
    const AttentionShape s = attention_shape(q, k, v, causal, scale);
    launch_attention(s, attention_rows(q), attention_rows(k), attention_rows(v), attention_rows(out), q.data_ptr(),
                     k.data_ptr(), v.data_ptr(), out.data_ptr(), static_cast<float*>(lse.data_ptr()), stream_of(q));
  }
  void attention_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, bool causal, double scale, Tensor& grad_q, Tensor& grad_k,
                          Tensor& grad_v) override {
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
    DT_CHECK_SUPPORTED(make_attention_batch(q, s.batch), "cuda attention", "at most ", kMaxAttentionBatchDims,
                       " leading dims, got shape ", q.shape());
    s.queries = q.size(-2);
    s.keys = k.size(-2);
    s.head_dim = q.size(-1);
    s.value_dim = v.size(-1);
    s.scale = static_cast<float>(scale);
    s.causal = causal;
    s.bf16 = q.dtype() == DType::BF16;
    DT_CHECK_SUPPORTED(s.batch.entries <= 65535, "cuda attention", "at most 65535 batch entries, got ",
                       s.batch.entries);
    DT_CHECK_SUPPORTED(attention_shared_bytes(s) <= kAttentionMaxSharedBytes, "cuda attention",
                       "head dims whose rows fit the kernel's shared memory, got q ", q.shape(), " and v ", v.shape());
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
};

}  // namespace

Kernels& kernels() {
  static CudaKernels table;
  return table;
}

}  // namespace cuda
}  // namespace dtensor::backend
