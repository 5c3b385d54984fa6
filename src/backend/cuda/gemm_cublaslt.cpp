// Batched matmul through cuBLASLt (FP32, FP64, BF16 and F16 with FP32
// accumulation; FP32 on TF32 tensor cores when cuda::set_allow_tf32(true)). The
// row-major to column-major mapping is backend/gemm_layout.h (tested on the CPU);
// operands in neither layout are copied contiguous first. Runs on the calling
// thread's current stream, with its workspace from the caching allocator. Each
// thread keeps the descriptors and the heuristic's algorithm of the calls it has
// made (keyed by backend::GemmKey), so a training step's repeated shapes query the
// heuristic once. A Linear's bias rides in cuBLASLt's BIAS epilogue (gemm_bias):
// added to the accumulator before the output is rounded, with no second pass; a
// Linear feeding a GELU in GELU_AUX_BIAS (gemm_bias_gelu), which also writes the
// pre-activation for the backward.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_runtime.h"
#include "backend/cuda/gemm.h"
#include "backend/gemm_layout.h"
#include "dtensor/cuda.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor {
namespace cuda {
namespace {
std::atomic<bool> tf32_allowed{false};
}
void set_allow_tf32(bool allow) { tf32_allowed.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return tf32_allowed.load(std::memory_order_relaxed); }
}  // namespace cuda

namespace backend::cuda {
namespace {

constexpr size_t kWorkspace = size_t{32} << 20;  // as PyTorch's cuBLASLt default on Hopper

void check_lt(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(detail::concat("[", call, "] cuBLAS error: ", cublasLtGetStatusName(status), ": ",
                                            cublasLtGetStatusString(status)));
  }
}

// One handle per thread and device (a handle is cheap and not shared across ranks).
cublasLtHandle_t handle(int device) {
  struct Handles {
    cublasLtHandle_t h[64] = {};
    ~Handles() {
      for (auto x : h) {
        if (x) cublasLtDestroy(x);
      }
    }
  };
  thread_local Handles handles;
  cublasLtHandle_t& h = handles.h[device];
  if (!h) check_lt(cublasLtCreate(&h), "cublasLtCreate");
  return h;
}

// Owns the descriptors of one call shape.
struct Descriptors {
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cublasLtMatrixLayout_t layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch,
                              int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
             "cublasLtMatrixLayoutSetAttribute");
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                              sizeof batch_stride),
             "cublasLtMatrixLayoutSetAttribute");
  }
  return l;
}

// The descriptors of a call and the heuristic's first algorithm for them (found
// false: none fits the epilogue).
struct Plan {
  Descriptors d;
  cublasLtMatmulHeuristicResult_t result{};
  bool found = false;
};

// What rides in the GEMM's epilogue: the bias vector [n] and/or the GELU with its
// pre-activation output (out's layout and dtype); neither for a plain GEMM.
struct Epilogue {
  const void* bias = nullptr;
  void* pre = nullptr;
  bool any() const { return bias || pre; }
};

// This call's epilogue pointers (a cached plan is shared by calls of their alignment).
void set_pointers(cublasLtMatmulDesc_t op, const Epilogue& e) {
  if (e.bias) {
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof e.bias),
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  if (e.pre) {
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.pre, sizeof e.pre),
             "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
  }
}

// Fills `plan` for `p`, with the epilogue `e`. Throws, caching nothing, when no
// algorithm fits a plain GEMM; an epilogue plan that none fits is cached with
// found = false.
void describe(Plan& plan, const GemmPlan& p, DType dtype, cudaDataType_t type, cublasComputeType_t compute,
              cudaDataType_t scale, const void* a, const void* b, const void* out, const Epilogue& e, int device) {
  Descriptors& d = plan.d;
  check_lt(cublasLtMatmulDescCreate(&d.op, compute, scale), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = p.a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
           "cublasLtMatmulDescSetAttribute");
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
           "cublasLtMatmulDescSetAttribute");
  if (e.any()) {
    // BLAS's D is out^T (n x m, column-major): its rows are the output features, so
    // the epilogue's per-row vector is the Linear's bias; batch stride 0 shares it.
    // The GELU's pre-activation has D's layout (ld and batch stride).
    const cublasLtEpilogue_t epilogue = !e.pre   ? CUBLASLT_EPILOGUE_BIAS
                                        : e.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                 : CUBLASLT_EPILOGUE_GELU_AUX;
    check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
             "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (e.bias) {
      const int64_t bias_batch_stride = 0;
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_batch_stride,
                                              sizeof bias_batch_stride),
               "cublasLtMatmulDescSetAttribute(BIAS_BATCH_STRIDE)");
    }
    if (e.pre) {
      const int64_t ld = p.ldc, batch_stride = p.batch_stride_c;
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld),
               "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
      check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &batch_stride,
                                              sizeof batch_stride),
               "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_BATCH_STRIDE)");
    }
    set_pointers(d.op, e);  // the heuristic reads their alignment
  }
  // BLAS computes C (n x m) = op(A) (n x k) op(B) (k x m); layouts are of the stored
  // matrices, before op.
  const auto bn = static_cast<uint64_t>(p.n), bm = static_cast<uint64_t>(p.m), bk = static_cast<uint64_t>(p.k);
  d.a = p.a.transpose ? layout(type, bk, bn, p.a.ld, p.batch, p.a.batch_stride)
                      : layout(type, bn, bk, p.a.ld, p.batch, p.a.batch_stride);
  d.b = p.b.transpose ? layout(type, bm, bk, p.b.ld, p.batch, p.b.batch_stride)
                      : layout(type, bk, bm, p.b.ld, p.batch, p.b.batch_stride);
  d.c = layout(type, bn, bm, p.ldc, p.batch, p.batch_stride_c);
  check_lt(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace_bytes = kWorkspace;
  check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof workspace_bytes),
           "cublasLtMatmulPreferenceSetAttribute");
  // The heuristic assumes 256-byte aligned operands unless told otherwise, and views
  // (a row slice, select(0, i)) start anywhere: an algorithm that needs more alignment
  // than it gets fails or faults, so each pointer's own alignment is passed. In BLAS
  // terms A is b, B is a, and C = D is out (row-major swap above).
  const auto set_alignment = [&](cublasLtMatmulPreferenceAttributes_t attribute, const void* ptr) {
    const uint32_t bytes = pointer_alignment(ptr);
    check_lt(cublasLtMatmulPreferenceSetAttribute(d.pref, attribute, &bytes, sizeof bytes),
             "cublasLtMatmulPreferenceSetAttribute");
  };
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b);
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a);
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, out);
  set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, out);
  int found = 0;
  const cublasStatus_t heuristic =
      cublasLtMatmulAlgoGetHeuristic(handle(device), d.op, d.a, d.b, d.c, d.c, d.pref, 1, &plan.result, &found);
  // No algorithm for these layouts is NOT_SUPPORTED (or nothing found): say so plainly.
  // An epilogue the library rejects for these types (INVALID_VALUE, say) is not an
  // error either: the caller has the two-pass fallback.
  if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED || (e.any() && heuristic != CUBLAS_STATUS_SUCCESS))
    found = 0;
  else
    check_lt(heuristic, "cublasLtMatmulAlgoGetHeuristic");
  plan.found = found > 0;
  if (e.any()) return;
  DT_CHECK_SUPPORTED(found > 0, "matmul", "cuBLASLt has no algorithm for ", dtype_name(dtype), " [", p.batch, ", ", p.m,
                     ", ", p.k, "] @ [", p.k, ", ", p.n, "]");
}

// This thread's plan for `key`, made by `make` on first use. The cache is bounded
// (training reuses a few dozen shapes; a sweep over shapes starts it afresh).
template <class Make>
Plan& cached_plan(const GemmKey& key, Make&& make) {
  constexpr size_t kMaxPlans = 1024;
  thread_local std::unordered_map<GemmKey, std::unique_ptr<Plan>, GemmKeyHash> plans;
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  std::unique_ptr<Plan> made = make();
  if (plans.size() >= kMaxPlans) plans.clear();
  return *plans.emplace(key, std::move(made)).first->second;
}

// out = a @ b with the epilogue `e`: false when it has one and no algorithm does.
bool run_gemm(const GemmPlan& p, DType dtype, const void* a, const void* b, const Epilogue& e, void* out, int device) {
  cudaDataType_t type;
  cublasComputeType_t compute;
  cudaDataType_t scale = CUDA_R_32F;
  switch (dtype) {
    case DType::F32:
      type = CUDA_R_32F;
      compute = dtensor::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case DType::F64:
      type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      scale = CUDA_R_64F;
      break;
    case DType::BF16:
      type = CUDA_R_16BF;
      compute = CUBLAS_COMPUTE_32F;
      break;
    case DType::F16:
      type = CUDA_R_16F;
      compute = CUBLAS_COMPUTE_32F;
      break;
    default:
      throw std::runtime_error(
          detail::concat("[matmul] no CUDA matmul for ", dtype_name(dtype), " (cuBLASLt takes f32, f64, bf16, f16)"));
  }
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device));
  Plan& plan = cached_plan(
      gemm_key(p, static_cast<int>(dtype), compute == CUBLAS_COMPUTE_32F_FAST_TF32, device, a, b, out, e.bias, e.pre),
      [&] {
        auto made = std::make_unique<Plan>();
        describe(*made, p, dtype, type, compute, scale, a, b, out, e, device);
        return made;
      });
  if (!plan.found) return false;
  const Descriptors& d = plan.d;
  set_pointers(d.op, e);
  const cublasLtMatmulHeuristicResult_t& result = plan.result;
  cublasLtHandle_t h = handle(device);
  // The workspace is stream-ordered like any tensor: freed right after the launch,
  // reused only by later work on this stream.
  void* workspace = result.workspaceSize > 0 ? allocate(device, result.workspaceSize) : nullptr;
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  const void* alpha = scale == CUDA_R_64F ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = scale == CUDA_R_64F ? static_cast<const void*>(&zero_d) : &zero_f;
  const cublasStatus_t status = cublasLtMatmul(h, d.op, alpha, b, d.a, a, d.b, beta, out, d.c, out, d.c, &result.algo,
                                               workspace, result.workspaceSize, stream);
  if (workspace) free(device, workspace);
  if (e.any() && (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
    // Rejected before any launch: this shape's epilogue calls take the fallback from now on.
    plan.found = false;
    return false;
  }
  check_lt(status, "cublasLtMatmul");
  return true;
}

}  // namespace

void gemm(const GemmPlan& p, DType dtype, const void* a, const void* b, void* out, int device) {
  run_gemm(p, dtype, a, b, Epilogue{}, out, device);
}

bool gemm_bias(const GemmPlan& p, DType dtype, const void* a, const void* b, const void* bias, void* out, int device) {
  // cuBLASLt's epilogues are for the 16- and 32-bit float types; F64 adds the bias
  // in a second pass.
  if (dtype == DType::F64) return false;
  return run_gemm(p, dtype, a, b, Epilogue{bias, nullptr}, out, device);
}

bool gemm_bias_gelu(const GemmPlan& p, DType dtype, const void* a, const void* b, const void* bias, void* out,
                    void* pre, int device) {
  if (dtype == DType::F64) return false;
  // cuBLASLt's rule for the GELU input matrix: leading dimension and batch stride
  // divisible by 8.
  if (p.ldc % 8 != 0 || (p.batch > 1 && p.batch_stride_c % 8 != 0)) return false;
  return run_gemm(p, dtype, a, b, Epilogue{bias, pre}, out, device);
}

}  // namespace backend::cuda
}  // namespace dtensor
