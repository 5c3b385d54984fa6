// One step of a pipeline on one rank (internal to src/parallel): Pipeline::Runtime
// executes the rank's action list; its transfers are in pipeline_wire.cpp, the rest in
// pipeline_runtime.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/autograd.h"
#include "dtensor/parallel/pipeline.h"

namespace dtensor::parallel {

// One step's execution of this rank's action list.
struct Pipeline::Runtime {
  Runtime(Pipeline& pipeline, int64_t step_index, bool train, std::function<DistTensor(const DistTensor&)> transform,
          std::optional<DType> compute_dtype);

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
  // Micro-batch `m`'s weight in the step's loss.
  double micro_weight(int m) const {
    return pipe.data_.weights.empty() ? 1.0 / schedule().micro_batches : pipe.data_.weights[static_cast<size_t>(m)];
  }

  const PipelineStage& stage_at(int stage) const;

  // Where stage `stage` receives its activations (PipelineStage::device).
  Device device_of(int stage) const;

  // ---- transfers (pipeline_wire.cpp) ----

  // Completed sends give their buffers back at once: an activation sent on is not
  // kept to the end of the step (that would hold every micro-batch's output on a
  // 1F1B stage, not only the p in flight). wait() on a completed one rethrows its error.
  void release_completed_sends();

  void send(const Tensor& t, int to_stage, int tag);

  int header_tag(int sender_stage) const { return 2 * schedule().stages + sender_stage; }

  // The activation of (stage, micro) from the previous stage's rank, as a leaf on this
  // stage's mesh (waits for it).
  DistTensor received_activation(int stage, int m, Micro& st);

  // Reads the header (waiting for it when asked, else only if it is there) and posts
  // the receive of the data it announces.
  void post_activation_data(int stage, int m, Micro& st, bool wait_header);

  // ---- compute and bookkeeping (pipeline_runtime.cpp) ----

  void forward(const Action& a, Micro& st);

  // The gradient of the stage output: handed over by the next stage on this rank, or
  // received; none for the last stage (backward starts from the loss).
  DistTensor output_gradient(const Action& a, Micro& st);

  // The input's gradient in the layout the previous stage sent it in (zeros when no
  // gradient reached the input).
  void keep_input_gradient(int stage, Micro& st);

  void backward(const Action& a, Micro& st);
  void backward_weight(const Action& a, Micro& st);
  void forget_if_done(int stage, int m);

  void record_compute(const Action& a, double start);
  void record_transfer(const Action& a);

  void execute(const Action& a, size_t index);

  // Runs the list; returns the step's loss on every rank (training).
  double run();

  std::string context(const Action& a) const;

  static double now_seconds();
};

}  // namespace dtensor::parallel
