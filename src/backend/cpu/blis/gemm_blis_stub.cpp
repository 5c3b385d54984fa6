// Built without BLIS (DTENSOR_WITH_BLIS=OFF or libblis-dev missing).
#include "backend/cpu/gemm_engine.h"

namespace dtensor::backend::cpu {

std::unique_ptr<GemmEngine> make_blis_engine() { return nullptr; }

}  // namespace dtensor::backend::cpu
