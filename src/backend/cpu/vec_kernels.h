// Vectorised row kernels of the CPU backend, one table per instruction set
// (internal).
//
// The same source (vec_impl.h) is compiled three times: for AVX-512 (16 floats a
// register), AVX2 + FMA (8) and the x86-64 baseline SSE2 (4); vec() returns the
// widest table this CPU runs (cpu_features.h, capped by DTENSOR_CPU_ISA). Every
// kernel works on contiguous rows of F32 or BF16 (`bf16` rows are loaded into F32
// registers and rounded once, to nearest even, when stored), so BF16 data is never
// widened into F32 buffers.
//
// Transcendentals are polynomials (vec_math.h) with the error bounds stated there
// and tested against double-precision references in test_vec_kernels.cpp.
#pragma once

#include <cstdint>

#include "dtensor/dtype.h"

namespace dtensor::backend::cpu {

enum class VecUnary : uint8_t { Exp, Tanh, Sigmoid, GeluTanh, GeluErf, Silu };
enum class VecBinary : uint8_t { Add, Sub, Mul, Div };

// Per-row statistics of a norm (F32 whatever the data dtype).
struct NormRowsArgs {
  int64_t rows = 0, cols = 0;
  double eps = 0;
  bool centered = true;  // layer_norm (true) or rms_norm (false)
};

struct AdamWArgs {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float bias_correction1 = 1, bias_correction2 = 1;
};

// Function pointers of one instruction set. `T` below is float or bf16; each entry
// has one pointer per storage type ([0] F32, [1] BF16).
struct VecKernels {
  const char* isa;
  // y[i] = f(x[i]).
  void (*unary[2])(VecUnary op, const void* x, void* y, int64_t n);
  // z[i] = x[i] op y[i]; with y_scalar, z[i] = x[i] op y[0].
  void (*binary[2])(VecBinary op, const void* x, const void* y, bool y_scalar, void* z, int64_t n);
  // grad_in[i] = grad_out[i] * f'(x[i]) for GELU (tanh or erf form) and SiLU.
  void (*activation_backward[2])(VecUnary op, const void* grad_out, const void* x, void* grad_in, int64_t n);
  // Softmax (or log-softmax) of each of `rows` contiguous rows of length n.
  void (*softmax_rows[2])(const void* x, void* y, int64_t rows, int64_t n, bool log);
  void (*softmax_backward_rows[2])(const void* grad_out, const void* y, void* grad_in, int64_t rows, int64_t n,
                                   bool log);
  // Layer/RMS norm of `rows` rows; weight and bias ([cols], the data's dtype) may be
  // null; mean may be null when !centered.
  void (*norm_rows[2])(const NormRowsArgs& a, const void* x, const void* weight, const void* bias, void* y,
                       float* mean, float* rstd);
  // The input gradient of those rows, and the weight and bias gradients of these
  // rows accumulated into grad_weight/grad_bias (F32 [cols], may be null).
  void (*norm_backward_rows[2])(const NormRowsArgs& a, const void* grad_out, const void* x, const float* mean,
                                const float* rstd, const void* weight, void* grad_in, float* grad_weight,
                                float* grad_bias);
  // One fused AdamW step on F32 param/m/v with a gradient of either dtype.
  void (*adamw[2])(const AdamWArgs& a, float* param, const void* grad, float* m, float* v, int64_t n);
  void (*bf16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*f32_to_bf16)(const float* x, uint16_t* y, int64_t n);
  // Attention's softmax steps on F32 score tiles s [rows, n] with leading dim ld,
  // where row r keeps its first valid[r] entries (the causal mask) and the rest
  // become 0 (see attention.cpp).
  // Online softmax: with x = scale * s, row_max[r] becomes max(row_max[r], max x),
  // s = exp(x - row_max), correction[r] = exp(old max - new max) and
  // row_sum[r] = row_sum[r] * correction[r] + sum s.
  void (*softmax_tile_online)(float* s, int64_t rows, int64_t n, int64_t ld, float scale, const int64_t* valid,
                              float* row_max, float* row_sum, float* correction);
  // s = exp(scale * s - lse[r]): the probabilities again, from the saved log-sum-exp.
  void (*softmax_tile_recompute)(float* s, int64_t rows, int64_t n, int64_t ld, float scale, const int64_t* valid,
                                 const float* lse);
  // dp = scale * p * (dp - delta[r]): the scores' gradient, in place of dp.
  void (*softmax_tile_grad)(const float* p, float* dp, int64_t rows, int64_t n, int64_t ld, float scale,
                            const float* delta);
  // out[r] = sum_j a[r * ld + j] * b[r * ld + j], j < n.
  void (*row_dots)(const float* a, const float* b, float* out, int64_t rows, int64_t n, int64_t ld);
};

const VecKernels& vec();

// The tables of each build; null when the compiler could not build that ISA.
const VecKernels* vec_kernels_avx512();
const VecKernels* vec_kernels_avx2();
const VecKernels& vec_kernels_baseline();

inline int vec_index(DType t) { return t == DType::BF16 ? 1 : 0; }

inline void f32_to_bf16(const float* x, bf16* y, int64_t n) {
  vec().f32_to_bf16(x, reinterpret_cast<uint16_t*>(y), n);
}
inline void bf16_to_f32(const bf16* x, float* y, int64_t n) {
  vec().bf16_to_f32(reinterpret_cast<const uint16_t*>(x), y, n);
}

}  // namespace dtensor::backend::cpu
