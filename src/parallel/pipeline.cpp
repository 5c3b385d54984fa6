// The pipeline runtime: stage meshes, one rank's action list executed, the transfers
// between stages, tied parameters and the recorded timeline.
#include "dtensor/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>

#include "dtensor/autograd.h"
#include "dtensor/nn/layers.h"
#include "dtensor/ops.h"
#include "dtensor/optim.h"
#include "dtensor/trace.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "pipeline";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- activation headers --------------------------------------------------------------------

// dtype, ndim, 8 dims, length of the placements text, the text (one char per slot).
constexpr int64_t kMaxDims = 8;
constexpr int64_t kTextStart = 2 + kMaxDims + 1;
constexpr int64_t kHeaderSlots = kTextStart + 96;

struct Header {
  Shape shape;
  DType dtype = DType::F32;
  Placements placements;
};

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

Header decode_header(const Tensor& header) {
  const std::vector<int64_t> slots = header.to_vector<int64_t>();
  Header h;
  h.dtype = static_cast<DType>(slots[0]);
  for (int64_t d = 0; d < slots[1]; ++d) h.shape.push_back(slots[static_cast<size_t>(2 + d)]);
  std::string text;
  for (int64_t k = 0; k < slots[static_cast<size_t>(kTextStart - 1)]; ++k) {
    text += static_cast<char>(slots[static_cast<size_t>(kTextStart + k)]);
  }
  h.placements = parse_placements(text);
  return h;
}

// "[*, *, 64]"
std::string pattern_to_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t d = 0; d < dims.size(); ++d)
    out += (d ? ", " : "") + (dims[d] < 0 ? std::string("*") : std::to_string(dims[d]));
  return out + "]";
}

// The layout a gradient of `t` travels in: t's, with Partial read as Replicate (the
// gradient of a partial sum is the whole gradient on every coordinate).
Placements gradient_layout(const DistTensor& t) {
  Placements p = t.placements();
  for (Placement& q : p) {
    if (q.is_partial()) q = Replicate();
  }
  return p;
}

// Buffers of sends a failing rank posted: a peer may still match one before it learns
// of the failure, so they must outlive the failing rank's stack (a few tensors, once
// per failed job).
void keep_until_exit(std::vector<Tensor> tensors) {
  static std::mutex mutex;
  static auto* kept = new std::vector<Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  for (Tensor& t : tensors) kept->push_back(std::move(t));
}

}  // namespace

std::vector<int64_t> micro_batch_rows(int64_t rows, int64_t micro_batches) {
  DT_CHECK_ARG(micro_batches >= 1 && micro_batches <= rows, "micro_batch_rows", "expected between 1 and ", rows,
               " micro-batches of ", rows, " rows (each at least one row), got ", micro_batches);
  std::vector<int64_t> sizes;
  sizes.reserve(static_cast<size_t>(micro_batches));
  for (int64_t i = 0; i < micro_batches; ++i)
    sizes.push_back(rows / micro_batches + (i < rows % micro_batches ? 1 : 0));
  return sizes;
}

// ---- PipelineMesh ----------------------------------------------------------------------------

PipelineMesh::PipelineMesh(const DeviceMesh& mesh, const std::string& pp_dim) : mesh_(mesh), pp_dim_(pp_dim) {
  DT_CHECK_ARG(mesh.defined() && mesh.is_member(), kOp, "expected a mesh this rank belongs to");
  const std::vector<std::string>& names = mesh.names();
  DT_CHECK_ARG(std::find(names.begin(), names.end(), pp_dim) != names.end(), kOp, "the mesh ", mesh.to_string(),
               " has no '", pp_dim, "' dim: a pipeline runs its stages along it (e.g. ", pp_dim, "=2,",
               mesh.to_string(), ")");
  const int d = mesh.dim_index(pp_dim);
  Shape rest;
  std::vector<std::string> rest_names;
  for (int k = 0; k < mesh.ndim(); ++k) {
    if (k == d) continue;
    rest.push_back(mesh.size(k));
    rest_names.push_back(names[static_cast<size_t>(k)]);
  }
  if (rest.empty()) {
    rest = {1};
    rest_names = {"stage"};
  }
  const int p = static_cast<int>(mesh.size(d));
  std::vector<std::vector<int>> ranks(static_cast<size_t>(p));
  std::vector<int64_t> coordinate(static_cast<size_t>(mesh.ndim()), 0);
  for (int64_t linear = 0; linear < mesh.size(); ++linear) {
    int64_t rem = linear;
    for (int k = mesh.ndim() - 1; k >= 0; --k) {
      coordinate[static_cast<size_t>(k)] = rem % mesh.size(k);
      rem /= mesh.size(k);
    }
    ranks[static_cast<size_t>(coordinate[static_cast<size_t>(d)])].push_back(mesh.rank_at(coordinate));
  }
  for (int c = 0; c < p; ++c) {
    stage_meshes_.push_back(DeviceMesh::from_ranks(mesh.world(), ranks[static_cast<size_t>(c)], rest, rest_names));
  }
}

int PipelineMesh::size() const { return static_cast<int>(mesh_.size(pp_dim_)); }
int PipelineMesh::coordinate() const { return static_cast<int>(mesh_.coordinate(mesh_.dim_index(pp_dim_))); }
const DeviceMesh& PipelineMesh::stage_mesh() const { return stage_meshes_.at(static_cast<size_t>(coordinate())); }
const DeviceMesh& PipelineMesh::stage_mesh(int c) const {
  DT_CHECK_ARG(c >= 0 && c < size(), kOp, "pipeline coordinate ", c, " is outside ", pp_dim_, "=", size());
  return stage_meshes_[static_cast<size_t>(c)];
}
const Group& PipelineMesh::group() const { return mesh_.group(pp_dim_); }

// ---- the runtime of one step -------------------------------------------------------------------

// One step's execution of this rank's action list.
struct Pipeline::Runtime {
  Runtime(Pipeline& pipeline, int64_t step_index, bool train, std::function<DistTensor(const DistTensor&)> transform,
          std::optional<DType> compute_dtype)
      : pipe(pipeline), step(step_index), training(train), to_backward(std::move(transform)), compute(compute_dtype) {
    pipe.stats_ = PipelineStats{};
    pipe.entries_.clear();
    pipe.step_start_ = now_seconds();
    live_at_start = memory_stats().live_bytes;
  }

  Pipeline& pipe;
  int64_t step = 0;
  bool training = true;
  std::function<DistTensor(const DistTensor&)> to_backward;
  std::optional<DType> compute;

  struct Micro {
    DistTensor input;                     // the leaf the stage computed from (not on the first stage)
    DistTensor output;                    // the stage's output (sent on, or handed to the next stage here)
    DistTensor root;                      // what backward starts from (the output, or the scaled loss)
    DistTensor input_grad;                // the gradient of `input`, for the previous stage
    DeferredBackward weights;             // W of a split backward
    Tensor header, activation, gradient;  // receive buffers
    Work header_work, activation_work, gradient_work;
    bool activation_posted = false;
  };
  std::map<std::pair<int, int>, Micro> micro;  // (stage, micro-batch)
  struct Outgoing {
    Work work;
    Tensor tensor;
  };
  std::vector<Outgoing> outgoing;
  DistTensor loss_sum;              // the last stage's weighted losses (F64)
  std::vector<DistTensor> outputs;  // forward-only: the last stage's outputs
  int in_flight = 0;
  int64_t live_at_start = 0;
  std::map<int, size_t> last_backward;  // stage -> index of its last backward action

  const Schedule& schedule() const { return pipe.schedule_; }
  const Group& group() const { return pipe.mesh_.group(); }
  const DeviceMesh& stage_mesh() const { return pipe.mesh_.stage_mesh(); }
  int rank_of(int stage) const { return schedule().rank_of(stage); }
  bool is_last(int stage) const { return stage + 1 == schedule().stages; }

  const PipelineStage& stage_at(int stage) const {
    for (const PipelineStage& s : pipe.stages_) {
      if (s.stage == stage) return s;
    }
    throw std::logic_error("[pipeline] no local stage " + std::to_string(stage));
  }

  // Where stage `stage` receives its activations (PipelineStage::device).
  Device device_of(int stage) const {
    const PipelineStage& s = stage_at(stage);
    if (s.device) return *s.device;
    const std::vector<DistTensor> params = s.module->parameters();
    return params.empty() ? Device::cpu() : params.front().device();
  }

  // Completed sends give their buffers back at once: an activation sent on is not
  // kept to the end of the step (that would hold every micro-batch's output on a
  // 1F1B stage, not only the p in flight). wait() on a completed one rethrows its error.
  void release_completed_sends() {
    auto done = std::stable_partition(outgoing.begin(), outgoing.end(),
                                      [](const Outgoing& o) { return !o.work.is_completed(); });
    for (auto it = done; it != outgoing.end(); ++it) it->work.wait();
    outgoing.erase(done, outgoing.end());
  }

  void send(const Tensor& t, int to_stage, int tag) {
    release_completed_sends();
    const Tensor data = t.is_contiguous() ? t : t.contiguous();
    outgoing.push_back({send_async(group(), data, rank_of(to_stage), tag), data});
    ++pipe.stats_.sends;
    pipe.stats_.bytes_sent += data.nbytes();
  }

  int header_tag(int sender_stage) const { return 2 * schedule().stages + sender_stage; }

  // The activation of (stage, micro) from the previous stage's rank, as a leaf on this
  // stage's mesh (waits for it).
  DistTensor received_activation(int stage, int m, Micro& st) {
    if (!st.activation_posted) post_activation_data(stage, m, st, /*wait_header=*/true);
    const double t0 = now_seconds();
    {
      TraceSpan span("pipeline_recv_wait", "comm");
      st.activation_work.wait();
    }
    pipe.stats_.wait_seconds += now_seconds() - t0;
    const Header h = decode_header(st.header);
    ++pipe.stats_.receives;
    pipe.stats_.bytes_received += st.activation.nbytes();
    return DistTensor::from_local(st.activation, stage_mesh(), h.placements, h.shape);
  }

  // Reads the header (waiting for it when asked, else only if it is there) and posts
  // the receive of the data it announces.
  void post_activation_data(int stage, int m, Micro& st, bool wait_header) {
    if (!wait_header && !st.header_work.is_completed()) return;
    const double t0 = now_seconds();
    {
      TraceSpan span("pipeline_recv_wait", "comm");
      st.header_work.wait();
    }
    pipe.stats_.wait_seconds += now_seconds() - t0;
    const Header h = decode_header(st.header);
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

  void forward(const Action& a, Micro& st) {
    const PipelineStage& stage = stage_at(a.stage);
    DistTensor input;
    if (a.stage == 0) {
      input = pipe.data_.inputs(step, a.micro);
      DT_CHECK_ARG(input.defined() && input.mesh() == stage_mesh(), kOp, "the inputs of micro-batch ", a.micro,
                   " must live on the first stage's mesh ", stage_mesh().to_string(), ", got ",
                   input.defined() ? input.mesh().to_string() : std::string("an undefined tensor"));
    } else if (rank_of(a.stage - 1) == rank_of(a.stage)) {
      Micro& previous = micro.at({a.stage - 1, a.micro});  // handed over on this rank
      input = previous.output.detach();
      if (!training) {
        previous.output = DistTensor();
        forget_if_done(a.stage - 1, a.micro);
      }
    } else {
      input = received_activation(a.stage, a.micro, st);
    }
    if (training && a.stage > 0 && is_floating(input.dtype())) input.set_requires_grad();
    const double start = now_seconds();
    TraceSpan span(a.to_string(), "pipeline");
    std::optional<nn::ComputeDtype> precision;
    if (compute) precision.emplace(*compute);
    std::optional<NoGradGuard> no_grad;
    if (!training) no_grad.emplace();
    DistTensor out = (*stage.module)(input);
    DT_CHECK_ARG(out.defined(), kOp, "stage ", a.stage, " returned an undefined output");
    if (a.stage > 0 && training) st.input = input;
    if (!is_last(a.stage)) {
      st.output = out;
      st.root = out;
    } else if (!training) {
      outputs[static_cast<size_t>(a.micro)] = out;
    } else {
      const DistTensor loss = pipe.data_.loss(step, a.micro, out);
      DT_CHECK_ARG(loss.defined() && loss.numel() == 1, kOp, "the loss of micro-batch ", a.micro,
                   " must be one value, got ", loss.defined() ? loss.shape() : Shape{});
      const double weight = pipe.data_.weights.empty() ? 1.0 / schedule().micro_batches
                                                       : pipe.data_.weights[static_cast<size_t>(a.micro)];
      const DistTensor weighted = mul(loss, weight);
      {
        NoGradGuard no_record;
        const DistTensor value = weighted.detach().to(DType::F64);
        loss_sum = loss_sum.defined() ? add(loss_sum, value) : value;
      }
      st.root = to_backward ? to_backward(weighted) : weighted;
    }
    record_compute(a, start);
    if (training) pipe.stats_.peak_in_flight = std::max(pipe.stats_.peak_in_flight, ++in_flight);
  }

  // The gradient of the stage output: handed over by the next stage on this rank, or
  // received; none for the last stage (backward starts from the loss).
  DistTensor output_gradient(const Action& a, Micro& st) {
    if (is_last(a.stage)) return DistTensor();
    if (rank_of(a.stage + 1) == rank_of(a.stage)) {
      Micro& next = micro.at({a.stage + 1, a.micro});
      DistTensor g = next.input_grad;
      next.input_grad = DistTensor();
      forget_if_done(a.stage + 1, a.micro);
      return g;
    }
    const double t0 = now_seconds();
    {
      TraceSpan span("pipeline_recv_wait", "comm");
      st.gradient_work.wait();
    }
    pipe.stats_.wait_seconds += now_seconds() - t0;
    ++pipe.stats_.receives;
    pipe.stats_.bytes_received += st.gradient.nbytes();
    return DistTensor::from_local(st.gradient, stage_mesh(), gradient_layout(st.output), st.output.shape());
  }

  // The input's gradient in the layout the previous stage sent it in (zeros when no
  // gradient reached the input).
  void keep_input_gradient(int stage, Micro& st) {
    if (stage == 0) return;
    NoGradGuard no_grad;
    DistTensor g = st.input.grad();
    const Placements layout = gradient_layout(st.input);
    if (!g.defined()) {
      g = zeros(st.input.shape(), st.input.mesh(), layout, st.input.dtype());
      if (st.input.device() != g.device()) g = g.to(st.input.device());
    } else {
      if (g.placements() != layout) g = g.redistribute(layout);
      if (g.dtype() != st.input.dtype()) g = g.to(st.input.dtype());
    }
    st.input_grad = g;
  }

  void backward(const Action& a, Micro& st) {
    const DistTensor grad = output_gradient(a, st);
    const double start = now_seconds();
    {
      TraceSpan span(a.to_string(), "pipeline");
      if (a.kind == ActionKind::Backward) {
        st.root.backward(grad);
      } else {
        std::vector<DistTensor> inputs;
        if (st.input.defined()) inputs.push_back(st.input);
        st.weights = backward_input(st.root, grad, inputs);
      }
      keep_input_gradient(a.stage, st);
    }
    record_compute(a, start);
    // The activations go with the graph (a split backward keeps what W needs).
    st.root = DistTensor();
    st.output = DistTensor();
    st.input = DistTensor();
    if (a.kind == ActionKind::Backward) --in_flight;
    forget_if_done(a.stage, a.micro);
  }

  void backward_weight(const Action& a, Micro& st) {
    const double start = now_seconds();
    {
      TraceSpan span(a.to_string(), "pipeline");
      st.weights.run();
    }
    st.weights = DeferredBackward();
    record_compute(a, start);
    --in_flight;
    forget_if_done(a.stage, a.micro);
  }

  void forget_if_done(int stage, int m) {
    const auto it = micro.find({stage, m});
    if (it == micro.end()) return;
    const Micro& st = it->second;
    if (!st.input.defined() && !st.output.defined() && !st.root.defined() && !st.input_grad.defined() &&
        !st.weights.pending()) {
      micro.erase(it);
    }
  }

  void record_compute(const Action& a, double start) {
    pipe.entries_.push_back({a, start - pipe.step_start_, now_seconds() - pipe.step_start_});
    pipe.stats_.peak_held_bytes = std::max(pipe.stats_.peak_held_bytes, memory_stats().live_bytes - live_at_start);
  }
  void record_transfer(const Action& a) {
    const double t = now_seconds() - pipe.step_start_;
    pipe.entries_.push_back({a, t, t});
  }

  void execute(const Action& a, size_t index) {
    Micro& st = micro[{a.stage, a.micro}];
    switch (a.kind) {
      case ActionKind::Forward: forward(a, st); break;
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
      case ActionKind::BackwardWeight: {
        const auto last = last_backward.find(a.stage);
        const PipelineStage& stage = stage_at(a.stage);
        // The stage's last backward action of the step synchronises its gradients.
        if (stage.sync && last != last_backward.end() && last->second == index) stage.sync->set_accumulating(false);
        if (a.kind == ActionKind::BackwardWeight) {
          backward_weight(a, st);
        } else {
          backward(a, st);
        }
        break;
      }
      case ActionKind::SendActivation: {
        DT_CHECK_ARG(st.output.defined(), kOp, a.to_string(), " comes before the forward that produces it");
        send(encode_header(st.output), a.stage + 1, header_tag(a.stage));
        send(st.output.to_local(), a.stage + 1, message_tag(a));
        if (!training) {
          st.output = DistTensor();
          st.root = DistTensor();
          forget_if_done(a.stage, a.micro);
        }
        record_transfer(a);
        break;
      }
      case ActionKind::RecvActivation:
        st.header = Tensor::empty({kHeaderSlots}, DType::I64);
        st.header_work = recv_async(group(), st.header, rank_of(a.stage - 1), header_tag(a.stage - 1));
        post_activation_data(a.stage, a.micro, st, /*wait_header=*/false);
        record_transfer(a);
        break;
      case ActionKind::SendGradient:
        DT_CHECK_ARG(st.input_grad.defined(), kOp, a.to_string(), " comes before the backward that produces it");
        send(st.input_grad.to_local(), a.stage - 1, message_tag(a));
        st.input_grad = DistTensor();
        forget_if_done(a.stage, a.micro);
        record_transfer(a);
        break;
      case ActionKind::RecvGradient: {
        DT_CHECK_ARG(st.output.defined(), kOp, a.to_string(),
                     " comes before the forward whose output's gradient it receives");
        const Placements layout = gradient_layout(st.output);
        st.gradient =
            Tensor::empty(local_shape(st.output.shape(), stage_mesh().shape(), layout, stage_mesh().coordinate()),
                          st.output.dtype(), st.output.device());
        st.gradient_work = recv_async(group(), st.gradient, rank_of(a.stage + 1), message_tag(a));
        record_transfer(a);
        break;
      }
    }
  }

  // Runs the list; returns the step's loss on every rank (training).
  double run() {
    const std::vector<Action>& actions = schedule().actions[static_cast<size_t>(pipe.mesh_.coordinate())];
    for (size_t k = 0; k < actions.size(); ++k) {
      if (actions[k].kind == ActionKind::Backward || actions[k].kind == ActionKind::BackwardWeight ||
          (actions[k].kind == ActionKind::BackwardInput && !schedule().splits_backward())) {
        last_backward[actions[k].stage] = k;
      }
    }
    if (training) {
      for (const PipelineStage& s : pipe.stages_) {
        if (s.sync) s.sync->set_accumulating(true);
      }
    }
    outputs.assign(static_cast<size_t>(schedule().micro_batches), DistTensor());
    try {
      for (size_t k = 0; k < actions.size(); ++k) {
        const Action& a = actions[k];
        try {
          release_completed_sends();
          execute(a, k);
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(context(a) + e.what());
        } catch (const std::runtime_error& e) {
          throw std::runtime_error(context(a) + e.what());
        }
      }
      {
        TraceSpan span("pipeline_send_wait", "comm");
        for (Outgoing& o : outgoing) o.work.wait();
      }
      outgoing.clear();
    } catch (...) {
      std::vector<Tensor> buffers;
      for (Outgoing& o : outgoing) buffers.push_back(o.tensor);
      keep_until_exit(std::move(buffers));
      throw;
    }
    if (!training) return 0;
    // The loss, from the last stage to every rank.
    const int last = schedule().stages - 1;
    Tensor value = Tensor::zeros({1}, DType::F64);
    if (rank_of(last) == pipe.mesh_.coordinate()) value.fill_(loss_sum.full_tensor().item<double>());
    broadcast_(group(), value, rank_of(last));
    return value.item<double>();
  }

  std::string context(const Action& a) const {
    return detail::concat("[", kOp, "] stage ", a.stage, ", ", a.to_string(), " (step ", step, ", micro-batch ",
                          a.micro, "): ");
  }
};

// ---- Pipeline -----------------------------------------------------------------------------------

Pipeline::Pipeline(const PipelineMesh& mesh, std::vector<PipelineStage> stages, Schedule schedule, PipelineData data,
                   std::vector<TiedParameter> tied)
    : mesh_(mesh),
      schedule_(std::move(schedule)),
      data_(std::move(data)),
      stages_(std::move(stages)),
      tied_(std::move(tied)) {
  DT_CHECK_ARG(schedule_.ranks == mesh_.size(), kOp, "the schedule ", schedule_.name, " runs on ", schedule_.ranks,
               " pipeline ranks, the mesh ", mesh_.mesh().to_string(), " has ", mesh_.pp_dim(), "=", mesh_.size());
  check_schedule(schedule_);
  const int me = mesh_.coordinate();
  std::vector<int> want = schedule_.stages_of(me), got;
  for (const PipelineStage& s : stages_) {
    DT_CHECK_ARG(s.module, kOp, "stage ", s.stage, " has no module");
    got.push_back(s.stage);
    const std::vector<DistTensor> params = s.module->parameters();
    for (const DistTensor& p : params) {
      DT_CHECK_ARG(p.mesh() == mesh_.stage_mesh(), kOp, "stage ", s.stage, "'s parameters must live on its stage mesh ",
                   mesh_.stage_mesh().to_string(), " (the ranks at ", mesh_.pp_dim(), " coordinate ", me,
                   "), got one on ", p.mesh().to_string());
    }
  }
  std::sort(got.begin(), got.end());
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (size_t k = 0; k < v.size(); ++k) out += (k ? (k + 1 == v.size() ? " and " : ", ") : "") + std::to_string(v[k]);
    return out.empty() ? std::string("none") : out;
  };
  DT_CHECK_ARG(got == want, kOp, "pipeline rank ", me, " runs stage", want.size() > 1 ? "s " : " ", list(want), " of ",
               schedule_.name, " (", schedule_.stages, " stages on ", schedule_.ranks, " ranks), got stages ",
               list(got));
  const bool first = me == schedule_.rank_of(0), last = me == schedule_.rank_of(schedule_.stages - 1);
  DT_CHECK_ARG(!first || data_.inputs, kOp, "the first stage needs PipelineData::inputs");
  DT_CHECK_ARG(!last || !schedule_.has_backward() || data_.loss, kOp, "the last stage needs PipelineData::loss");
  DT_CHECK_ARG(data_.weights.empty() || static_cast<int>(data_.weights.size()) == schedule_.micro_batches, kOp,
               "expected one loss weight per micro-batch (", schedule_.micro_batches, "), got ", data_.weights.size());
  for (const TiedParameter& t : tied_) {
    DT_CHECK_ARG(t.stages.size() >= 2, kOp, "tied parameter '", t.name, "' needs at least two stages, got ",
                 t.stages.size());
    DT_CHECK_ARG(t.names.empty() || t.names.size() == t.stages.size(), kOp, "tied parameter '", t.name,
                 "': expected one name per holder (", t.stages.size(), ") or none, got ", t.names.size());
    bool here = false;
    for (int s : t.stages) {
      DT_CHECK_ARG(s >= 0 && s < schedule_.stages, kOp, "tied parameter '", t.name, "' names stage ", s, " of ",
                   schedule_.stages);
      if (schedule_.rank_of(s) != me) continue;
      here = true;
      const PipelineStage* holder = nullptr;
      for (const PipelineStage& st : stages_) holder = st.stage == s ? &st : holder;
      bool found = false;
      for (const auto& [name, _] : holder->module->named_parameters()) found |= name == t.name_in(s);
      DT_CHECK_ARG(found, kOp, "tied parameter '", t.name, "': stage ", s, " has no parameter named '", t.name_in(s),
                   "'");
    }
    tied_groups_.push_back(mesh_.group().split(here ? 0 : -1, me));
  }
}

Pipeline::~Pipeline() = default;

const std::string& TiedParameter::name_in(int stage) const {
  if (names.empty()) return name;
  for (size_t k = 0; k < stages.size() && k < names.size(); ++k) {
    if (stages[k] == stage) return names[k];
  }
  return name;
}

double Pipeline::run(int64_t step, const std::function<DistTensor(const DistTensor&)>& to_backward,
                     std::optional<DType> compute_dtype) {
  DT_CHECK_ARG(schedule_.has_backward(), kOp, "the ", schedule_.name, " schedule has no backward; use forward()");
  Runtime rt(*this, step, true, to_backward, compute_dtype);
  return rt.run();
}

double Pipeline::train_step(int64_t step, std::optional<DType> compute_dtype) {
  return run(step, nullptr, compute_dtype);
}

std::vector<DistTensor> Pipeline::forward(int64_t step, std::optional<DType> compute_dtype) {
  DT_CHECK_ARG(!schedule_.has_backward(), kOp, "forward() runs forward-only schedules, got ", schedule_.name);
  Runtime rt(*this, step, false, nullptr, compute_dtype);
  rt.run();
  return rt.outputs;
}

void Pipeline::finish_gradient_sync() {
  for (const PipelineStage& s : stages_) {
    if (s.sync) s.sync->finish_gradient_sync();
  }
  const int me = mesh_.coordinate();
  for (size_t k = 0; k < tied_.size(); ++k) {
    const TiedParameter& t = tied_[k];
    std::vector<DistTensor> copies;
    for (const PipelineStage& s : stages_) {
      if (std::find(t.stages.begin(), t.stages.end(), s.stage) == t.stages.end()) continue;
      for (const auto& [name, p] : s.module->named_parameters()) {
        if (name == t.name_in(s.stage)) copies.push_back(p);
      }
    }
    if (copies.empty()) continue;
    // Summed in the parameter's layout, which every copy shares.
    Tensor sum;
    for (const DistTensor& p : copies) {
      const DistTensor g = gradient_in_param_layout(p);
      const Tensor local = g.defined() ? g.to_local() : Tensor::zeros(p.to_local().shape(), p.dtype(), p.device());
      sum = sum.defined() ? add(sum, local) : local.clone();
    }
    const Group& g = tied_groups_[k];
    if (g.size() > 1) {
      if (!tied_checked_) {
        // Every holder must hold the same piece: compare sizes and layouts once.
        const std::string layout = placements_to_string(copies[0].placements()) + " " + shape_to_string(sum.shape());
        const std::vector<Tensor> all =
            all_gather_list(g, Tensor::from_vector<int64_t>(std::vector<int64_t>(layout.begin(), layout.end()),
                                                            {static_cast<int64_t>(layout.size())}));
        for (const Tensor& other : all) {
          const std::vector<int64_t> chars = other.to_vector<int64_t>();
          const std::string theirs(chars.begin(), chars.end());
          DT_CHECK_ARG(theirs == layout, kOp, "tied parameter '", t.name, "' is held as ", layout, " on pipeline rank ",
                       me, " and as ", theirs, " on another: wrap its holders alike");
        }
      }
      all_reduce_(g, sum, ReduceOp::Sum);
    }
    for (const DistTensor& p : copies) {
      p.set_grad(DistTensor::from_local(sum.clone(), p.mesh(), p.placements(), p.shape()));
    }
  }
  tied_checked_ = true;
}

double Pipeline::grad_norm(const std::vector<DistTensor>& params) {
  // The copies of tied parameters other than their first holder's count nowhere.
  std::set<const DistTensor::Impl*> duplicates;
  for (const TiedParameter& t : tied_) {
    for (const PipelineStage& s : stages_) {
      if (s.stage == t.stages.front() || std::find(t.stages.begin(), t.stages.end(), s.stage) == t.stages.end()) {
        continue;
      }
      for (const auto& [name, p] : s.module->named_parameters()) {
        if (name == t.name_in(s.stage)) duplicates.insert(p.impl().get());
      }
    }
  }
  std::vector<DistTensor> counted;
  for (const DistTensor& p : params) {
    if (!duplicates.count(p.impl().get())) counted.push_back(p);
  }
  const double stage_norm = dtensor::grad_norm(counted);
  Tensor total = Tensor::full({1}, stage_norm * stage_norm, DType::F64);
  all_reduce_(mesh_.group(), total, ReduceOp::Sum);
  return std::sqrt(total.item<double>());
}

Timeline Pipeline::gather_timeline(const std::string& title) const {
  std::vector<double> flat{step_start_, static_cast<double>(entries_.size())};
  for (const TimelineEntry& e : entries_) {
    flat.insert(flat.end(), {static_cast<double>(e.action.kind), static_cast<double>(e.action.stage),
                             static_cast<double>(e.action.micro), e.start, e.end});
  }
  const std::vector<Tensor> all =
      all_gather_list(mesh_.group(), Tensor::from_vector<double>(flat, {static_cast<int64_t>(flat.size())}));
  Timeline t;
  t.title = title.empty() ? schedule_.name : title;
  t.ranks = static_cast<int>(all.size());
  double origin = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    const double start = all[r].to_vector<double>()[0];
    origin = r == 0 ? start : std::min(origin, start);
  }
  t.entries.resize(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    const std::vector<double> v = all[r].to_vector<double>();
    const double shift = v[0] - origin;
    for (size_t k = 2; k + 5 <= v.size(); k += 5) {
      const Action a{static_cast<ActionKind>(static_cast<int>(v[k])), static_cast<int>(v[k + 1]),
                     static_cast<int>(v[k + 2])};
      t.entries[r].push_back({a, v[k + 3] + shift, v[k + 4] + shift});
    }
  }
  return t;
}

}  // namespace dtensor::parallel
