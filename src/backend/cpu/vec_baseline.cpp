// The vectorised row kernels built for the x86-64 baseline (SSE2, 16-byte
// registers), and the choice of table for this CPU. See vec_kernels.h.
#define DTENSOR_VEC_NS baseline
#define DTENSOR_VEC_BYTES 16
#include "backend/cpu/vec_impl.h"
#include <string_view>

#include "backend/cpu/cpu_features.h"

namespace dtensor::backend::cpu {

const VecKernels& vec_kernels_baseline() {
  static const VecKernels table = baseline::make_table("baseline");
  return table;
}

const VecKernels& vec() {
  static const VecKernels& table = [&]() -> const VecKernels& {
    const std::string_view isa = kernel_isa();
    if (isa == "avx512") return *vec_kernels_avx512();
    if (isa == "avx2") return *vec_kernels_avx2();
    return vec_kernels_baseline();
  }();
  return table;
}

}  // namespace dtensor::backend::cpu
