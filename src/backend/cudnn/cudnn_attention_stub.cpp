// cuDNN's fused attention in a build without cuDNN (cudnn_attention.h): every call
// is refused with the reason, and the own kernels run it.
#include <stdexcept>

#include "backend/cudnn_attention.h"

namespace dtensor::backend::cudnn {

namespace {
const char* const kNoCudnn =
    "this build has no cuDNN (configure with the CUDA toolkit's cuDNN 9 found, or -DDTENSOR_WITH_CUDNN=ON)";
}

bool compiled() { return false; }
std::string version() { return ""; }
AttentionTarget target(int) { return {}; }
int64_t runs() { return 0; }
Prepared prepare(const AttentionKey&) { return {nullptr, 0, kNoCudnn}; }

void run_forward(const Prepared&, const void*, const void*, const void*, void*, float*, float, void*, void*) {
  throw std::runtime_error(std::string("[attention] ") + kNoCudnn);
}

void run_backward(const Prepared&, const void*, const void*, const void*, const void*, const void*, const float*, void*,
                  void*, void*, float, void*, void*) {
  throw std::runtime_error(std::string("[attention] ") + kNoCudnn);
}

}  // namespace dtensor::backend::cudnn
