// The vectorised row kernels built for avx2 (32-byte registers); CMakeLists.txt
// gives this file its -m flags. See vec_kernels.h.
#define DTENSOR_VEC_NS avx2
#define DTENSOR_VEC_BYTES 32
#include "backend/cpu/vec_impl.h"

namespace dtensor::backend::cpu {

const VecKernels* vec_kernels_avx2() {
  static const VecKernels table = avx2::make_table("avx2");
  return &table;
}

}  // namespace dtensor::backend::cpu
