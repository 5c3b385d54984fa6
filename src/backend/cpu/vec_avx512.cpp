// The vectorised row kernels built for avx512 (64-byte registers); CMakeLists.txt
// gives this file its -m flags. See vec_kernels.h.
#define DTENSOR_VEC_NS avx512
#define DTENSOR_VEC_BYTES 64
#include "backend/cpu/vec_impl.h"

namespace dtensor::backend::cpu {

const VecKernels* vec_kernels_avx512() {
  static const VecKernels table = avx512::make_table("avx512");
  return &table;
}

}  // namespace dtensor::backend::cpu
