// The pipeline runtime of one step on one rank: Pipeline::Runtime's forwards and
// backwards of the action list, its hand-overs between local stages, and the recorded
// timeline (its transfers are in pipeline_wire.cpp).
#include "parallel/pipeline_runtime.h"

#include <algorithm>
#include <chrono>

#include "dtensor/nn/layers.h"
#include "dtensor/nn/moe.h"
#include "dtensor/ops.h"
#include "dtensor/trace.h"
#include "parallel/pipeline_wire.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "pipeline";

}  // namespace

double Pipeline::Runtime::now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Pipeline::Runtime::Runtime(Pipeline& pipeline, int64_t step_index, bool train,
                           std::function<DistTensor(const DistTensor&)> transform, std::optional<DType> compute_dtype)
    : pipe(pipeline), step(step_index), training(train), to_backward(std::move(transform)), compute(compute_dtype) {
  pipe.stats_ = PipelineStats{};
  pipe.entries_.clear();
  pipe.step_start_ = now_seconds();
  live_at_start = memory_stats().live_bytes;
}

const PipelineStage& Pipeline::Runtime::stage_at(int stage) const {
  for (const PipelineStage& s : pipe.stages_) {
    if (s.stage == stage) return s;
  }
  throw std::logic_error("[pipeline] no local stage " + std::to_string(stage));
}

Device Pipeline::Runtime::device_of(int stage) const { return stage_at(stage).compute_device(); }

void Pipeline::Runtime::forward(const Action& a, Micro& st) {
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
    const DistTensor weighted = mul(loss, micro_weight(a.micro));
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

DistTensor Pipeline::Runtime::output_gradient(const Action& a, Micro& st) {
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

void Pipeline::Runtime::keep_input_gradient(int stage, Micro& st) {
  if (stage == 0) return;
  NoGradGuard no_grad;
  DistTensor g = st.input.grad();
  const Placements layout = gradient_layout(st.input);
  if (!g.defined()) {
    g = zeros(st.input.shape(), st.input.mesh(), layout, st.input.dtype(), st.input.device());
  } else {
    if (g.placements() != layout) g = g.redistribute(layout);
    if (g.dtype() != st.input.dtype()) g = g.to(st.input.dtype());
  }
  st.input_grad = g;
}

void Pipeline::Runtime::backward(const Action& a, Micro& st) {
  const DistTensor grad = output_gradient(a, st);
  const double start = now_seconds();
  {
    TraceSpan span(a.to_string(), "pipeline");
    // The micro-batch's weight in the loss, for the auxiliary losses inside the stage.
    const nn::AuxLossScale aux_scale(nn::AuxLossScale::current() * micro_weight(a.micro));
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

void Pipeline::Runtime::backward_weight(const Action& a, Micro& st) {
  const double start = now_seconds();
  {
    TraceSpan span(a.to_string(), "pipeline");
    const nn::AuxLossScale aux_scale(nn::AuxLossScale::current() * micro_weight(a.micro));
    st.weights.run();
  }
  st.weights = DeferredBackward();
  record_compute(a, start);
  --in_flight;
  forget_if_done(a.stage, a.micro);
}

void Pipeline::Runtime::forget_if_done(int stage, int m) {
  const auto it = micro.find({stage, m});
  if (it == micro.end()) return;
  const Micro& st = it->second;
  if (!st.input.defined() && !st.output.defined() && !st.root.defined() && !st.input_grad.defined() &&
      !st.weights.pending()) {
    micro.erase(it);
  }
}

void Pipeline::Runtime::record_compute(const Action& a, double start) {
  pipe.entries_.push_back({a, start - pipe.step_start_, now_seconds() - pipe.step_start_});
  pipe.stats_.peak_held_bytes = std::max(pipe.stats_.peak_held_bytes, memory_stats().live_bytes - live_at_start);
}

void Pipeline::Runtime::record_transfer(const Action& a) {
  const double t = now_seconds() - pipe.step_start_;
  pipe.entries_.push_back({a, t, t});
}

void Pipeline::Runtime::execute(const Action& a, size_t index) {
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

double Pipeline::Runtime::run() {
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

std::string Pipeline::Runtime::context(const Action& a) const {
  return detail::concat("[", kOp, "] stage ", a.stage, ", ", a.to_string(), " (step ", step, ", micro-batch ", a.micro,
                        "): ");
}

}  // namespace dtensor::parallel
