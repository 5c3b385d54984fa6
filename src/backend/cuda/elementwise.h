// The CUDA elementwise launchers (internal): elementwise.cu. Operands are raw
// pointers with the index plan of offset_calc.h (operand 0 is the output); the
// dtype is dispatched at run time outside the kernels, the op inside them (a
// uniform branch: every thread of a launch takes the same case), so there is one
// kernel per storage type and layout, not one per op.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/offset_calc.h"
#include "dtensor/dtype.h"
#include "dtensor/tensor_ops.h"

namespace dtensor::backend::cuda {

// Each queues its kernel on `stream` (a cudaStream_t) and checks the launch.
// out = op(in); one dtype.
void launch_unary(UnaryOp op, DType dtype, int64_t n, const OffsetCalc<2>& calc, void* out, const void* in,
                  void* stream);
// out = op(a, b); a and b of `dtype`; out of `dtype`, or Bool for comparisons.
void launch_binary(BinaryOp op, DType dtype, int64_t n, const OffsetCalc<3>& calc, void* out, const void* a,
                   const void* b, void* stream);
// out = convert(in) from `src` to `dst` with the CPU's conversion rules.
void launch_copy(DType src, DType dst, int64_t n, const OffsetCalc<2>& calc, void* out, const void* in, void* stream);
// Every element of out = the `element_size`-byte pattern `bits`.
void launch_fill(size_t element_size, uint64_t bits, int64_t n, const OffsetCalc<1>& calc, void* out, void* stream);
// The activations whose backward (grad_in = grad_out * f'(x)) has a kernel.
enum class ActivationGrad : uint8_t { GeluTanh, GeluErf, Silu };
// grad_in = grad_out * f'(x); operands 0, 1, 2 of `calc`; one float dtype (F32, F64,
// BF16, F16).
void launch_activation_backward(ActivationGrad op, DType dtype, int64_t n, const OffsetCalc<3>& calc, void* grad_in,
                                const void* grad_out, const void* x, void* stream);
// out = cond ? a : b, moving stored bits of `element_size` bytes.
void launch_where(size_t element_size, int64_t n, const OffsetCalc<4>& calc, void* out, const void* cond, const void* a,
                  const void* b, void* stream);

}  // namespace dtensor::backend::cuda
