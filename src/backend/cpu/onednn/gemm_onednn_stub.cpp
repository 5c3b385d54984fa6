// Built without oneDNN (DTENSOR_WITH_ONEDNN=OFF or libdnnl-dev missing).
#include "backend/cpu/gemm_engine.h"

namespace dtensor::backend::cpu {

std::unique_ptr<GemmEngine> make_onednn_engine() { return nullptr; }

}  // namespace dtensor::backend::cpu
