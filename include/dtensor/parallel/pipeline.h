// Pipeline parallelism: a model's stages on the coordinates of a mesh's "pp" dim, and
// the one runtime that executes a schedule's action lists (pipeline_schedule.h).
//
//   DeviceMesh mesh(world, {4, 2, 2}, {"pp", "dp", "tp"});
//   parallel::PipelineMesh pp(mesh);                // stage i on pp coordinate i
//   auto stage = ...;                                // a module on pp.stage_mesh()
//   parallel::DistributedDataParallel ddp(*stage, {.dp_dim = "dp"});
//   parallel::Pipeline pipe(pp, {{stage.get(), pp.coordinate(), &ddp}},
//                           parallel::one_f_one_b(4, /*micro_batches*/ 8),
//                           {.inputs = ..., .loss = ...});
//   parallel::Trainer trainer(optimizer, {.clip_grad_norm = 1.0});
//   trainer.step(step, pipe);                         // every micro-batch, then AdamW
//
// (pipeline_gpt.h builds the stages of models::GPT and the whole arrangement in one call.)
//
// Stages and meshes. Stage s runs on pp coordinate s % p: each stage lives on its own
// sub-mesh (the mesh's other dims, e.g. dp x tp), so tensor and data parallelism
// (parallelize_module, DDP, fully_shard) wrap a stage module as they wrap a model.
// Activations go from stage s's rank at sub-mesh coordinate c to stage s+1's rank at
// the same coordinate, and gradients back, on the pp group through c: both sides of a
// boundary have one layout, so each rank sends exactly its local piece.
//
// Transfers: explicit point-to-point messages on the pp group rather than a cross-mesh
// redistribute. A schedule puts a send and its receive at different places in two
// ranks' lists (the send right after the forward, the receive right before the
// consumer); a redistribute across meshes is one call on both sides at once, which
// would make the two ranks meet there. Here every transfer is posted where the list
// says and never blocks (a send is only waited for after the rank's last action), a
// compute action waits for the receives it consumes, and the adjacent transfers of a
// list (1F1B's send of an activation and receive of a gradient) are posted together;
// so a schedule that check_schedule accepts cannot deadlock here, whatever the
// backend. An activation carries a small header (shape, dtype, placements) ahead of
// its data, so micro-batches may differ in size and the receiving stage checks what
// arrives; a gradient has the layout of the activation it belongs to (Partial as
// Replicate).
//
// Backward. Each stage's backward starts from its output with the gradient the next
// stage sent (the last stage from its loss, weighted by the micro-batch's share and
// passed through the trainer's loss scaling); its input is a leaf, whose gradient goes
// back. Split schedules run backward_input (autograd.h) for I and the deferred part
// for W. Gradients accumulate over the micro-batches; each stage's DDP or FSDP is told
// to accumulate (GradientSync::set_accumulating) until that stage's last backward
// action of the step, which synchronises.
//
// Parameters several stages hold (a tied embedding on the first and the last stage,
// as Megatron-LM does): the copies start equal, their gradients are summed after the
// data-parallel synchronisation, and so they take the same optimizer steps. The first
// holder's copy counts in the gradient norm.
//
// Failure: an exception in a stage's action is rethrown with the stage, the action and
// the micro-batch named ("[pipeline] stage 2, 2F3: ..."); the communication layer
// releases the ranks waiting for it with an error naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/nn/module.h"
#include "dtensor/parallel/pipeline_schedule.h"
#include "dtensor/parallel/trainer.h"

namespace dtensor::parallel {

// The stage meshes of a mesh with a pipeline dim: stage mesh i holds the ranks at
// coordinate i of that dim, laid out over the other dims in order (a single dim
// "stage" of size 1 when the pipeline dim is the only one). Collective over the
// mesh's world, every rank of which must construct it.
class PipelineMesh {
 public:
  PipelineMesh() = default;
  // Throws std::invalid_argument naming the mesh when it has no `pp_dim`.
  explicit PipelineMesh(const DeviceMesh& mesh, const std::string& pp_dim = "pp");

  const DeviceMesh& mesh() const { return mesh_; }
  int size() const;                                       // pipeline ranks (p)
  int coordinate() const;                                 // this rank's pipeline coordinate
  const DeviceMesh& stage_mesh() const;                   // this rank's
  const DeviceMesh& stage_mesh(int pp_coordinate) const;  // any (others hold no data here)
  // The ranks that differ from this one only in the pipeline coordinate, by it.
  const Group& group() const;
  const std::string& pp_dim() const { return pp_dim_; }

 private:
  DeviceMesh mesh_;
  std::string pp_dim_;
  std::vector<DeviceMesh> stage_meshes_;
};

// One stage this rank runs.
struct PipelineStage {
  nn::Module* module = nullptr;  // forward(input) -> output, on the stage mesh
  int stage = 0;                 // its index among all stages (the schedule's)
  GradientSync* sync = nullptr;  // the stage's DDP or FSDP, if any
  // What the stage takes from the previous one, checked when an activation arrives:
  // the shape with -1 for "any" ({-1, -1, 64}: [rows, sequence, 64]). Empty: no check.
  std::vector<int64_t> input_shape;
  // Where the activations and gradients the stage receives are placed (a stage on a
  // GPU sends and receives CUDA tensors). Unset: the device of the module's
  // parameters, the CPU for a module without any; set it where they live elsewhere
  // (FSDP with offload keeps them on the host).
  std::optional<Device> device;

  // `device`, or the default above.
  Device compute_device() const;
};

// A parameter several stages hold (its name as each holder's named_parameters()
// gives it).
struct TiedParameter {
  std::string name;
  std::vector<int> stages;  // the holders; the first one's copy counts in the norm
  // Where the holders name it differently (an embedding as "tokens.weight", the head
  // reusing it as "head.tokens.weight"): one name per entry of `stages`. Empty: `name`
  // in every holder.
  std::vector<std::string> names = {};
  // The name in holder `stage`.
  const std::string& name_in(int stage) const;
};

struct PipelineData {
  // The input of micro-batch `micro` of step `step` on the first stage's mesh (called
  // on the first stage's ranks only).
  std::function<DistTensor(int64_t step, int64_t micro)> inputs;
  // The mean loss of the micro-batch from the last stage's output (called on the last
  // stage's ranks only). Not needed for forward-only schedules.
  std::function<DistTensor(int64_t step, int64_t micro, const DistTensor& output)> loss;
  // Each micro-batch's share of the step's loss (rows_i / rows when they differ in
  // size); empty: 1/m each.
  std::vector<double> weights;
};

// The sizes of `micro_batches` micro-batches of `rows` rows, as equal as they can be:
// the first rows % micro_batches are one row larger (torch.tensor_split's rule), so
// 10 rows in 4 give {3, 3, 2, 2}. Throws std::invalid_argument unless
// 1 <= micro_batches <= rows. PipelineData::weights of such a split are sizes[i] / rows.
std::vector<int64_t> micro_batch_rows(int64_t rows, int64_t micro_batches);

// What the last step did on this rank.
struct PipelineStats {
  int peak_in_flight = 0;  // most micro-batches whose activations were held at once
  // Most bytes this rank held above what it held when the step began, after any
  // action (the activations kept for backward, and the gradients once allocated).
  int64_t peak_held_bytes = 0;
  int64_t sends = 0, receives = 0;
  int64_t bytes_sent = 0, bytes_received = 0;
  double wait_seconds = 0;  // in receives (idle)
};

class Pipeline final : public MicroBatchRunner {
 public:
  // `stages`: the stages of this rank, those of schedule.stages_of(pp coordinate), in
  // any order. Checks the schedule (check_schedule) and that it fits the mesh (as many
  // ranks as the pp dim). Collective over the pp group (groups for tied parameters).
  Pipeline(const PipelineMesh& mesh, std::vector<PipelineStage> stages, Schedule schedule, PipelineData data,
           std::vector<TiedParameter> tied = {});
  ~Pipeline() override;
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // MicroBatchRunner (parallel::Trainer).
  double run(int64_t step, const std::function<DistTensor(const DistTensor&)>& to_backward,
             std::optional<DType> compute_dtype) override;
  void finish_gradient_sync() override;
  double grad_norm(const std::vector<DistTensor>& params) override;
  const Group& group() const override { return mesh_.mesh().group(); }
  Device device() const override { return stages_.front().compute_device(); }

  // A training step without a trainer: every forward and backward (no loss scaling);
  // returns the step's loss on every rank. Gradients stay unsynchronised until
  // finish_gradient_sync().
  double train_step(int64_t step, std::optional<DType> compute_dtype = std::nullopt);
  // A forward-only schedule (inference): the last stage's outputs of the micro-batches
  // of `step`, on the last stage's ranks (undefined tensors elsewhere). No gradients
  // are recorded.
  std::vector<DistTensor> forward(int64_t step, std::optional<DType> compute_dtype = std::nullopt);

  const Schedule& schedule() const { return schedule_; }
  const PipelineMesh& mesh() const { return mesh_; }
  const PipelineStats& stats() const { return stats_; }
  // This rank's actions of the last step, times from its start.
  const std::vector<TimelineEntry>& last_entries() const { return entries_; }
  // The last step on every rank of the pp group through this rank, on one clock from
  // the earliest start (collective over the pp group).
  Timeline gather_timeline(const std::string& title = "") const;

  struct Runtime;

 private:
  PipelineMesh mesh_;
  Schedule schedule_;
  PipelineData data_;
  std::vector<PipelineStage> stages_;
  std::vector<TiedParameter> tied_;
  std::vector<Group> tied_groups_;  // per tied parameter: the ranks holding it (undefined if none here)
  bool tied_checked_ = false;
  PipelineStats stats_;
  std::vector<TimelineEntry> entries_;
  double step_start_ = 0;  // steady-clock seconds
};

}  // namespace dtensor::parallel
