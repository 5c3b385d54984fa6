// The pipeline's wire: activation headers encoded and decoded, and the sends and
// receives of Pipeline::Runtime (pipeline_runtime.h) that carry activations and
// gradients between the stages' ranks.
#include "parallel/pipeline_wire.h"

#include <algorithm>
#include <mutex>

#include "dtensor/trace.h"
#include "parallel/pipeline_runtime.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "pipeline";

// "[*, *, 64]"
std::string pattern_to_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t d = 0; d < dims.size(); ++d)
    out += (d ? ", " : "") + (dims[d] < 0 ? std::string("*") : std::to_string(dims[d]));
  return out + "]";
}

}  // namespace

// ---- activation headers --------------------------------------------------------------------

Tensor encode_header(const DistTensor& t) {
  const std::string text = placements_to_string(t.placements());
  DT_CHECK_SUPPORTED(t.dim() <= kMaxDims && static_cast<int64_t>(text.size()) <= kHeaderSlots - kTextStart, kOp,
                     "activations up to ", kMaxDims, " dims and placements '", text, "' fit a header; got shape ",
                     t.shape());
  std::vector<int64_t> slots(static_cast<size_t>(kHeaderSlots), 0);
  slots[0] = static_cast<int64_t>(t.dtype());
  slots[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) slots[static_cast<size_t>(2 + d)] = t.size(d);
  slots[static_cast<size_t>(kTextStart - 1)] = static_cast<int64_t>(text.size());
  for (size_t k = 0; k < text.size(); ++k) slots[static_cast<size_t>(kTextStart) + k] = text[k];
  return Tensor::from_vector<int64_t>(slots, {kHeaderSlots});
}

ActivationHeader decode_header(const Tensor& header) {
  const std::vector<int64_t> slots = header.to_vector<int64_t>();
  ActivationHeader h;
  h.dtype = static_cast<DType>(slots[0]);
  for (int64_t d = 0; d < slots[1]; ++d) h.shape.push_back(slots[static_cast<size_t>(2 + d)]);
  std::string text;
  for (int64_t k = 0; k < slots[static_cast<size_t>(kTextStart - 1)]; ++k) {
    text += static_cast<char>(slots[static_cast<size_t>(kTextStart + k)]);
  }
  h.placements = parse_placements(text);
  return h;
}

Placements gradient_layout(const DistTensor& t) {
  Placements p = t.placements();
  for (Placement& q : p) {
    if (q.is_partial()) q = Replicate();
  }
  return p;
}

void keep_until_exit(std::vector<Tensor> tensors) {
  static std::mutex mutex;
  static auto* kept = new std::vector<Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  for (Tensor& t : tensors) kept->push_back(std::move(t));
}

// ---- the runtime's transfers ---------------------------------------------------------------

void Pipeline::Runtime::release_completed_sends() {
  auto done =
      std::stable_partition(outgoing.begin(), outgoing.end(), [](const Outgoing& o) { return !o.work.is_completed(); });
  for (auto it = done; it != outgoing.end(); ++it) it->work.wait();
  outgoing.erase(done, outgoing.end());
}

void Pipeline::Runtime::send(const Tensor& t, int to_stage, int tag) {
  release_completed_sends();
  const Tensor data = t.is_contiguous() ? t : t.contiguous();
  outgoing.push_back({send_async(group(), data, rank_of(to_stage), tag), data});
  ++pipe.stats_.sends;
  pipe.stats_.bytes_sent += data.nbytes();
}

DistTensor Pipeline::Runtime::received_activation(int stage, int m, Micro& st) {
  if (!st.activation_posted) post_activation_data(stage, m, st, /*wait_header=*/true);
  const double t0 = now_seconds();
  {
    TraceSpan span("pipeline_recv_wait", "comm");
    st.activation_work.wait();
  }
  pipe.stats_.wait_seconds += now_seconds() - t0;
  const ActivationHeader h = decode_header(st.header);
  ++pipe.stats_.receives;
  pipe.stats_.bytes_received += st.activation.nbytes();
  return DistTensor::from_local(st.activation, stage_mesh(), h.placements, h.shape);
}

void Pipeline::Runtime::post_activation_data(int stage, int m, Micro& st, bool wait_header) {
  if (!wait_header && !st.header_work.is_completed()) return;
  const double t0 = now_seconds();
  {
    TraceSpan span("pipeline_recv_wait", "comm");
    st.header_work.wait();
  }
  pipe.stats_.wait_seconds += now_seconds() - t0;
  const ActivationHeader h = decode_header(st.header);
  const std::vector<int64_t>& want = stage_at(stage).input_shape;
  bool fits = want.empty() || want.size() == h.shape.size();
  for (size_t d = 0; fits && d < want.size(); ++d) fits = want[d] < 0 || want[d] == h.shape[d];
  DT_CHECK_ARG(fits, kOp, "stage ", stage, " takes inputs ", pattern_to_string(want), "; stage ", stage - 1, " sent ",
               h.shape, " ", dtype_name(h.dtype), " for micro-batch ", m);
  DT_CHECK_ARG(h.placements.size() == static_cast<size_t>(stage_mesh().ndim()), kOp, "stage ", stage - 1,
               " sent an activation laid out as ", placements_to_string(h.placements), " for a mesh of ",
               h.placements.size(), " dims; stage ", stage, "'s mesh is ", stage_mesh().to_string());
  st.activation = Tensor::empty(local_shape(h.shape, stage_mesh().shape(), h.placements, stage_mesh().coordinate()),
                                h.dtype, device_of(stage));
  st.activation_work =
      recv_async(group(), st.activation, rank_of(stage - 1), message_tag({ActionKind::RecvActivation, stage, m}));
  st.activation_posted = true;
}

}  // namespace dtensor::parallel
