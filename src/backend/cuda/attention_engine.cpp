// Which attention runs a call on CUDA tensors (attention_engine.h).
#include "backend/cuda/attention_engine.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include "backend/attention_plan.h"
#include "util/check.h"

namespace dtensor::backend::cuda {
namespace {

// A fallback's reason on stderr, once per reason and process.
void say_once(const std::string& text) {
  static std::mutex mutex;
  static std::set<std::string> said;
  const std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(text).second) std::fprintf(stderr, "dtensor: %s\n", text.c_str());
}

}  // namespace

std::optional<cudnn::Prepared> cudnn_attention_graph(const std::vector<const Tensor*>& operands, bool causal,
                                                     double scale, bool backward) {
  using cudnn::AttentionEngine;
  const AttentionEngine engine = cudnn::attention_engine();
  const Tensor& q = *operands[0];
  if (engine == AttentionEngine::Own) return std::nullopt;
  if (engine == AttentionEngine::Auto && q.dtype() != DType::BF16 && q.dtype() != DType::F16) return std::nullopt;
  const int device = q.device().index;
  std::string what = detail::concat(backward ? "the backward of " : "", "attention of q ", q.shape(), " ",
                                    dtype_name(q.dtype()), causal ? " causal" : "");
  std::string why;
  AttentionShape shape;
  if (!cudnn::compiled()) {
    why = cudnn::prepare({}).refusal;  // the build's reason
  } else if (!make_attention_shape(q, *operands[1], *operands[2], causal, scale, shape)) {
    why = detail::concat("more than ", kMaxAttentionBatchDims, " batch dims");
  } else {
    std::vector<AttentionRows> rows;
    cudnn::AttentionTarget target = cudnn::target(device);
    for (const Tensor* t : operands) {
      rows.push_back(attention_rows(*t));
      target.pointers_aligned &= reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0;
    }
    const cudnn::AttentionDecision decision = cudnn::decide(shape, q.dtype(), rows, backward, target, device);
    why = decision.refusal;
    if (decision.key) {
      what = decision.key->to_string();
      const cudnn::Prepared prepared = cudnn::prepare(*decision.key);
      if (prepared.graph != nullptr) return prepared;
      why = prepared.refusal;
    }
  }
  if (engine == AttentionEngine::Cudnn) {
    throw std::runtime_error(
        detail::concat("[attention] DTENSOR_ATTENTION=cudnn, and cuDNN does not take ", what, ": ", why));
  }
  say_once(detail::concat("cuDNN's fused attention does not take ", what, " (", why,
                          "); the own attention kernels run it (DTENSOR_ATTENTION=own: always)"));
  return std::nullopt;
}

Tensor cudnn_workspace(int64_t bytes, Device device) {
  return Tensor::empty({std::max<int64_t>(1, (bytes + 7) / 8)}, DType::I64, device);
}

}  // namespace dtensor::backend::cuda
