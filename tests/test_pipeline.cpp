// Pipeline parallelism on the threads backend: GPT stages, splits,
// parallel equivalence of every schedule with one rank (PP = 2 and 4, PP x DP, PP x TP,
// PP x FSDP, the 3-D 16-rank layout), activation memory per schedule, the measured
// timeline, forward-only inference, and the errors for bad input.
#include "dtensor/parallel/pipeline.h"

#include <cmath>
#include <mutex>

#include "dtensor/autograd.h"
#include "dtensor/data.h"
#include "dtensor/models/gpt.h"
#include "dtensor/models/gpt_parallel.h"
#include "dtensor/models/gpt_pipeline.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/ddp.h"
#include "dtensor/parallel/fsdp.h"
#include "dtensor/parallel/tensor_parallel.h"
#include "dtensor/parallel/trainer.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace dtensor::parallel;
using namespace dtensor::models;

namespace {

constexpr uint64_t kModelSeed = 42;
// Micro-batches, stages and tensor parallelism sum gradients in other orders than one
// rank does: 1e-7 differences. AdamW divides each gradient by its running RMS, so an
// element whose gradient hovers near zero turns them into visible parameter
// differences, in proportion to the learning rate: at 1e-3 ten steps of every layout
// stay within 1e-5 of one rank (at 1e-2 a few elements of the 4- and 8-block models
// drift by 2-5e-6, one-stage tensor parallelism included). Clipping on: the norm
// crosses the stages.
constexpr double kLr = 1e-3, kClip = 1.0;

// `steps` AdamW steps of models::GPT on one rank with the whole global batch at once.
dtensor::testing::TrainingRun train_one_rank(const models::GPTConfig& config, int steps, int64_t batch) {
  dtensor::testing::TrainingRun result;
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    DistributedSampler sampler(data.size(), batch, 0, 1, 5);
    models::GPT model(mesh, config, kModelSeed);
    AdamW optimizer(model.parameters(), kLr);
    Trainer trainer(optimizer, {.clip_grad_norm = kClip});
    for (int step = 0; step < steps; ++step) {
      const TokenBatch b = data.get_batch(sampler.batch_at(step));
      const StepReport r = trainer.step(step, [&](int64_t) {
        return model.loss(distribute(b.inputs, mesh, {Replicate()}), distribute(b.targets, mesh, {Replicate()}));
      });
      result.losses.push_back(r.stats.loss);
    }
    result.params = model.state_dict();
  });
  return result;
}

struct Layout {
  int pp = 2, dp = 1, tp = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int micro_batches = 4;
  int virtual_stages = 1;
  int fsdp = 0;  // 0: DDP over dp (when dp > 1); else that ZeRO stage
  bool sequence_parallel = false;
  std::string what() const {
    return detail::concat("pp=", pp, ",dp=", dp, ",tp=", tp, " ", schedule_kind_name(schedule), " m=", micro_batches,
                          " v=", virtual_stages, fsdp ? " fsdp " + std::to_string(fsdp) : "",
                          sequence_parallel ? " sp" : "");
  }
};

// The same training pipelined over `layout`.
dtensor::testing::TrainingRun train_pipelined(const models::GPTConfig& config, const Layout& layout, int steps,
                                              int64_t batch) {
  dtensor::testing::TrainingRun result;
  std::mutex mutex;
  Shape shape{layout.pp};
  std::vector<std::string> names{"pp"};
  if (layout.dp > 1) {
    shape.push_back(layout.dp);
    names.push_back("dp");
  }
  if (layout.tp > 1) {
    shape.push_back(layout.tp);
    names.push_back("tp");
  }
  launch(layout.pp * layout.dp * layout.tp, [&](Group g) {
    DeviceMesh mesh(g, shape, names);
    PipelineMesh pp(mesh);
    const DeviceMesh& stage_mesh = pp.stage_mesh();
    GPTPipeline gpt(pp, config, kModelSeed,
                    {.schedule = layout.schedule, .micro_batches = layout.micro_batches,
                     .virtual_stages = layout.virtual_stages});
    std::vector<std::unique_ptr<DistributedDataParallel>> ddps;
    std::vector<FSDPModule> fsdps;
    fsdps.reserve(gpt.stages().size());  // syncs point into it
    std::vector<GradientSync*> syncs;
    for (const auto& stage : gpt.stages()) {
      if (layout.tp > 1) {
        parallelize_module(*stage, stage_mesh["tp"],
                           restrict_plan(gpt_tp_plan(config, {.sequence_parallel = layout.sequence_parallel}), *stage));
      }
      if (layout.fsdp > 0) {
        for (auto& [name, m] : stage->named_modules()) {
          if (dynamic_cast<nn::TransformerBlock*>(m)) fully_shard(*m, stage_mesh, {.stage = layout.fsdp});
        }
        fsdps.push_back(fully_shard(*stage, stage_mesh, {.stage = layout.fsdp}));
        syncs.push_back(&fsdps.back());
      } else if (layout.dp > 1) {
        ddps.push_back(std::make_unique<DistributedDataParallel>(*stage, DDPOptions{.dp_dim = "dp"}));
        syncs.push_back(ddps.back().get());
      }
    }
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    const int dp_rank = layout.dp > 1 ? static_cast<int>(stage_mesh.coordinate(stage_mesh.dim_index("dp"))) : 0;
    DistributedSampler sampler(data.size(), batch, dp_rank, layout.dp, 5);
    const std::vector<int64_t> rows = parallel::micro_batch_rows(batch / layout.dp, layout.micro_batches);
    std::vector<double> weights;
    for (int64_t r : rows) weights.push_back(static_cast<double>(r) / static_cast<double>(batch / layout.dp));
    Placements batch_layout;
    for (const std::string& n : stage_mesh.names()) batch_layout.push_back(n == "dp" ? Shard(0) : Replicate());
    auto micro = [&](int64_t step, int64_t m, bool targets) {
      const TokenBatch b = data.get_batch(sampler.batch_at(step));
      int64_t offset = 0;
      for (int64_t k = 0; k < m; ++k) offset += rows[static_cast<size_t>(k)];
      const Tensor local = (targets ? b.targets : b.inputs).narrow(0, offset, rows[static_cast<size_t>(m)]).contiguous();
      return DistTensor::from_local(local, stage_mesh, batch_layout,
                                    Shape{rows[static_cast<size_t>(m)] * layout.dp, config.block_size});
    };
    std::unique_ptr<Pipeline> pipe = gpt.make_pipeline(
        syncs, [&](int64_t step, int64_t m) { return micro(step, m, false); },
        [&](int64_t step, int64_t m) { return micro(step, m, true); }, weights);
    AdamW optimizer(gpt.parameters(), kLr);
    Trainer trainer(optimizer, {.clip_grad_norm = kClip});
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) losses.push_back(trainer.step(step, *pipe).stats.loss);
    const std::map<std::string, Tensor> params = gpt.state_dict();
    std::lock_guard<std::mutex> lock(mutex);
    if (g.rank() == 0) result.losses = losses;
    // Every rank checks that it reports the same loss as rank 0 below; the stage
    // mesh's first rank contributes its stages' parameters.
    if (stage_mesh.linear_index() == 0) {
      for (const auto& [name, t] : params) result.params.emplace(name, t);
    }
  });
  return result;
}

}  // namespace

// ---- GPT stages and splits ----------------------------------------------------------------------

TEST(GptStages, TogetherTheyAreTheGptWithTheSameSeed) {
  for (bool tied : {true, false}) {
    launch(3, [&](Group g) {
      DeviceMesh mesh(g, {3}, {"pp"});
      PipelineMesh pm(mesh);
      models::GPTConfig c = dtensor::testing::tiny_gpt(5);
      c.tie_weights = tied;
      GPTPipeline gpt(pm, c, kModelSeed,
                      {.schedule = ScheduleKind::ForwardOnly, .micro_batches = 1, .split = {{0, 2}, {2, 3}, {3, 5}}});
      // The whole model on this rank alone.
      const DeviceMesh one(g.split(g.rank()), {1});
      models::GPT model(one, c, kModelSeed);
      const std::map<std::string, Tensor> want = model.state_dict();
      const std::map<std::string, Tensor> mine = gpt.state_dict();
      for (const auto& [name, t] : mine) EXPECT_TRUE(allclose(t, want.at(name), 0, 0)) << name;
      // Every name once, and the tied embedding on the first and the last stage under its own name.
      const bool first = pm.coordinate() == 0, last = pm.coordinate() == 2;
      EXPECT_EQ(mine.count("tokens.weight") == 1, first || (last && tied));
      const int64_t held = all_reduce(g, Tensor::scalar(static_cast<int64_t>(mine.size()))).item<int64_t>();
      EXPECT_EQ(held, static_cast<int64_t>(want.size()) + (tied ? 1 : 0));
      EXPECT_EQ(gpt.num_parameters(), model.num_parameters());
      ASSERT_EQ(gpt.sequential().tied().size(), tied ? 1u : 0u);
      if (tied) EXPECT_EQ(gpt.sequential().tied()[0].stages, (std::vector<int>{0, 2}));
      // Chained stages compute the GPT's logits.
      SyntheticLanguage data(c.vocab, c.block_size, 8, 3);
      const TokenBatch b = data.get_batch({0, 1, 2});
      auto pipe = gpt.make_pipeline(
          {}, [&](int64_t, int64_t) { return distribute(b.inputs, pm.stage_mesh(), {Replicate()}); }, nullptr);
      const std::vector<DistTensor> out = pipe->forward(0);
      if (last) {
        const DistTensor ids = distribute(b.inputs, one, {Replicate()});
        EXPECT_TRUE(allclose(out.at(0).full_tensor(), model(ids).full_tensor(), 1e-6, 1e-7));
      }
    });
  }
}

TEST(GptStages, SplitsEvenBalancedAndExplicit) {
  EXPECT_EQ(split_layers_evenly(10, 4), (std::vector<StageLayers>{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  // Equal blocks and free embeddings and head: the even split.
  EXPECT_EQ(balance_layers(std::vector<double>(8, 1.0), 0, 0, 4), (std::vector<StageLayers>{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  // A head as costly as three blocks leaves the last stage one block.
  EXPECT_EQ(balance_layers(std::vector<double>(8, 1.0), 0, 3.0, 3), (std::vector<StageLayers>{{0, 3}, {3, 7}, {7, 8}}));
  // One costly block gets a stage of its own.
  EXPECT_EQ(balance_layers({1, 1, 6, 1, 1}, 0, 0, 3), (std::vector<StageLayers>{{0, 2}, {2, 3}, {3, 5}}));
  // A large vocabulary makes the head the costliest part of a GPT.
  models::GPTConfig big_vocab = dtensor::testing::tiny_gpt(8);
  big_vocab.vocab = 4096;
  const std::vector<StageLayers> split = balance_gpt(big_vocab, estimate_gpt_layer_costs(big_vocab), 4);
  EXPECT_LT(split.back().size(), split.front().size());
  EXPECT_THROW_MSG(split_layers_evenly(2, 3), std::invalid_argument,
                   "3 pipeline stages need at least 3 layers (one per stage), the model has 2");
  EXPECT_THROW_MSG(check_split({{0, 2}, {3, 4}}, 4, 2), std::invalid_argument,
                   "stage 1 holds layers [3, 4); expected a non-empty range starting at 2");
  EXPECT_THROW_MSG(check_split({{0, 2}, {2, 3}}, 4, 2), std::invalid_argument,
                   "the ranges cover layers [0, 3), the model has 4");
  EXPECT_THROW_MSG(check_split({{0, 4}}, 4, 2), std::invalid_argument, "expected 2 layer ranges (one per stage), got 1");
}

TEST(GptStages, MeasuredCostsArePositiveAndAgreedByEveryRank) {
  launch(2, [](Group g) {
    const GPTLayerCosts c = measure_gpt_layer_costs(g, dtensor::testing::tiny_gpt(2), 2, 1);
    EXPECT_GT(c.block, 0);
    EXPECT_GE(c.head, 0);
    const Tensor mine = Tensor::from_vector<double>({c.embedding, c.block, c.head}, {3});
    const Tensor most = all_reduce(g, mine, ReduceOp::Max);
    EXPECT_TRUE(allclose(mine, most, 0, 0)) << "every rank splits alike";
  });
}

// ---- parallel equivalence ------------------------------------------------------------------------

TEST(MicroBatchRows, AsEqualAsTheyCanBeFirstOnesLonger) {
  EXPECT_EQ(micro_batch_rows(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(micro_batch_rows(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(micro_batch_rows(5, 5), (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(micro_batch_rows(7, 1), (std::vector<int64_t>{7}));
  EXPECT_THROW_MSG(
      micro_batch_rows(3, 4), std::invalid_argument,
      "[micro_batch_rows] expected between 1 and 3 micro-batches of 3 rows (each at least one row), got 4");
  EXPECT_THROW_MSG(micro_batch_rows(3, 0), std::invalid_argument, "got 0");
}

TEST(PipelineEquivalence, EveryScheduleAtPp2AndPp4MatchesOneRank) {
  const int steps = 10;
  const int64_t batch = 8;
  for (int64_t layers : {4, 8}) {
    const models::GPTConfig config = dtensor::testing::tiny_gpt(layers);
    const dtensor::testing::TrainingRun one = train_one_rank(config, steps, batch);
    ASSERT_LT(one.losses.back(), one.losses.front()) << "the loss should fall";
    for (int pp : {2, 4}) {
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                                ScheduleKind::ZeroBubble}) {
        const int v = kind == ScheduleKind::Interleaved1F1B ? 2 : 1;
        if (pp * v > layers) continue;
        const Layout layout{.pp = pp, .schedule = kind, .micro_batches = 4, .virtual_stages = v};
        dtensor::testing::expect_equivalent(train_pipelined(config, layout, steps, batch), one, layout.what());
      }
    }
  }
}

TEST(PipelineEquivalence, UnequalMicroBatchesAndOneMicroBatch) {
  const models::GPTConfig config = dtensor::testing::tiny_gpt(4);
  const dtensor::testing::TrainingRun one = train_one_rank(config, 4, 10);
  // 10 rows in 4 micro-batches: 3, 3, 2, 2, each weighted by its rows.
  dtensor::testing::expect_equivalent(train_pipelined(config, {.pp = 2, .micro_batches = 4}, 4, 10), one,
                                      "1F1B 3,3,2,2");
  dtensor::testing::expect_equivalent(
      train_pipelined(config, {.pp = 2, .schedule = ScheduleKind::ZeroBubble, .micro_batches = 3}, 4, 10), one,
      "zero bubble 4,3,3");
  dtensor::testing::expect_equivalent(train_pipelined(config, {.pp = 4, .micro_batches = 1}, 4, 10), one, "1F1B m=1");
}

TEST(PipelineEquivalence, WithDataAndTensorParallelStages) {
  const models::GPTConfig config = dtensor::testing::tiny_gpt(4);
  const int steps = 10;
  const dtensor::testing::TrainingRun one = train_one_rank(config, steps, 8);
  dtensor::testing::expect_equivalent(train_pipelined(config, {.pp = 2, .dp = 2}, steps, 8), one, "pp=2,dp=2 DDP");
  dtensor::testing::expect_equivalent(
      train_pipelined(config, {.pp = 2, .dp = 2, .schedule = ScheduleKind::ZeroBubble}, steps, 8), one,
      "pp=2,dp=2 DDP zero bubble");
  dtensor::testing::expect_equivalent(train_pipelined(config, {.pp = 2, .tp = 2}, steps, 8), one, "pp=2,tp=2");
  dtensor::testing::expect_equivalent(train_pipelined(config, {.pp = 2, .tp = 2, .sequence_parallel = true}, steps, 8),
                                      one, "pp=2,tp=2 sequence parallel");
  for (int stage : {1, 3}) {
    dtensor::testing::expect_equivalent(train_pipelined(config, {.pp = 2, .dp = 2, .fsdp = stage}, steps, 8), one,
                                        "pp=2,dp=2 FSDP " + std::to_string(stage));
  }
  dtensor::testing::expect_equivalent(
      train_pipelined(config, {.pp = 2, .dp = 2, .schedule = ScheduleKind::ZeroBubble, .fsdp = 3}, steps, 8), one,
      "pp=2,dp=2 FSDP 3 zero bubble");
  dtensor::testing::expect_equivalent(
      train_pipelined(config, {.pp = 2, .dp = 2, .schedule = ScheduleKind::Interleaved1F1B, .virtual_stages = 2}, steps,
                      8),
      one, "pp=2,dp=2 interleaved DDP");
}

// The 3-D layout of 16 devices: TP = 2 inside, PP = 4, DP = 2 outside (16 threads on
// the machine's cores: a tiny model).
TEST(PipelineEquivalence, ThreeDSixteenRanksMatchesOneRank) {
  models::GPTConfig config = dtensor::testing::tiny_gpt(4);
  const int steps = 10;
  const dtensor::testing::TrainingRun one = train_one_rank(config, steps, 8);
  dtensor::testing::expect_equivalent(
      train_pipelined(config, {.pp = 4, .dp = 2, .tp = 2, .micro_batches = 2}, steps, 8), one, "pp=4,dp=2,tp=2 DDP");
  dtensor::testing::expect_equivalent(
      train_pipelined(config, {.pp = 4, .dp = 2, .tp = 2, .micro_batches = 2, .fsdp = 3}, steps, 8), one,
      "pp=4,dp=2,tp=2 FSDP 3");
}

// ---- memory, timeline, inference ----------------------------------------------------------------

namespace {

// One training step of a p-stage GPT; every pipeline rank's statistics, by rank.
std::vector<PipelineStats> one_step_stats(const models::GPTConfig& config, int pp, ScheduleKind kind, int micro_batches,
                                          std::vector<Timeline>* timelines = nullptr) {
  std::vector<PipelineStats> stats(static_cast<size_t>(pp));
  if (timelines) timelines->assign(static_cast<size_t>(pp), Timeline());
  launch(pp, [&](Group g) {
    DeviceMesh mesh(g, {pp}, {"pp"});
    PipelineMesh pm(mesh);
    GPTPipeline gpt(pm, config, kModelSeed, {.schedule = kind, .micro_batches = micro_batches});
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    auto tokens = [&](int64_t micro, bool targets) {
      const TokenBatch b = data.get_batch({2 * micro, 2 * micro + 1});
      return distribute(targets ? b.targets : b.inputs, pm.stage_mesh(), {Replicate()});
    };
    std::unique_ptr<Pipeline> pipe = gpt.make_pipeline(
        {}, [&](int64_t, int64_t m) { return tokens(m, false); }, [&](int64_t, int64_t m) { return tokens(m, true); });
    pipe->train_step(0);
    stats[static_cast<size_t>(g.rank())] = pipe->stats();
    const Timeline t = pipe->gather_timeline();
    if (timelines) (*timelines)[static_cast<size_t>(g.rank())] = t;
  });
  return stats;
}

}  // namespace

// Activations held after each action on the first stage of p = 4 with m = 8:
// GPipe keeps all eight micro-batches, 1F1B at most p = 4.
TEST(PipelineMemory, OneFOneBHoldsAtMostPMicroBatchesAndGPipeAllOfThem) {
  models::GPTConfig config = dtensor::testing::tiny_gpt(4);
  config.block_size = 32;  // activations well above the parameters' gradients
  const int p = 4, m = 8;
  const int64_t one = one_step_stats(config, p, ScheduleKind::GPipe, 1)[0].peak_held_bytes;
  const std::vector<PipelineStats> gpipe = one_step_stats(config, p, ScheduleKind::GPipe, m);
  const std::vector<PipelineStats> f1b1 = one_step_stats(config, p, ScheduleKind::OneFOneB, m);
  const std::vector<PipelineStats> zb = one_step_stats(config, p, ScheduleKind::ZeroBubble, m);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(gpipe[static_cast<size_t>(r)].peak_in_flight, m) << "rank " << r;
    EXPECT_EQ(f1b1[static_cast<size_t>(r)].peak_in_flight, p - r) << "rank " << r;
    EXPECT_LE(zb[static_cast<size_t>(r)].peak_in_flight, p) << "rank " << r;
  }
  const double gpipe_ratio = static_cast<double>(gpipe[0].peak_held_bytes) / static_cast<double>(one);
  const double f1b1_ratio = static_cast<double>(f1b1[0].peak_held_bytes) / static_cast<double>(one);
  EXPECT_GT(gpipe_ratio, m - 1.0) << gpipe[0].peak_held_bytes << " vs one micro-batch " << one;
  EXPECT_LE(gpipe_ratio, m + 0.5) << gpipe[0].peak_held_bytes << " vs one micro-batch " << one;
  EXPECT_GT(f1b1_ratio, p - 1.0) << f1b1[0].peak_held_bytes << " vs one micro-batch " << one;
  EXPECT_LE(f1b1_ratio, p + 0.5) << f1b1[0].peak_held_bytes << " vs one micro-batch " << one;
}

TEST(PipelineTimeline, AMeasuredStepHasEveryActionOnOneClock) {
  std::vector<Timeline> timelines;
  one_step_stats(dtensor::testing::tiny_gpt(2), 2, ScheduleKind::OneFOneB, 4, &timelines);
  const Schedule s = one_f_one_b(2, 4);
  for (const Timeline& t : timelines) {
    ASSERT_EQ(t.ranks, 2);
    for (int r = 0; r < 2; ++r) {
      // The compute actions in the schedule's order, each after the one before.
      std::vector<Action> want, got;
      for (const Action& a : s.actions[static_cast<size_t>(r)]) {
        if (a.is_compute()) want.push_back(a);
      }
      double last_end = 0;
      for (const TimelineEntry& e : t.entries[static_cast<size_t>(r)]) {
        EXPECT_LE(e.start, e.end);
        if (!e.action.is_compute()) continue;
        got.push_back(e.action);
        EXPECT_GE(e.start, last_end - 1e-9);
        last_end = e.end;
      }
      EXPECT_EQ(got, want) << "rank " << r;
    }
    EXPECT_GT(t.bubble_fraction(), 0.0);
    EXPECT_LT(t.bubble_fraction(), 1.0);
  }
  // Both ranks gathered the same picture.
  EXPECT_EQ(timelines[0].entries[1].size(), timelines[1].entries[1].size());
  const std::string dir = ::testing::TempDir();
  timelines[0].write_svg(dir + "/pipeline_measured.svg");
  timelines[0].write_chrome_trace(dir + "/pipeline_measured.json");
}

TEST(PipelineInference, ForwardOnlyGivesTheLogitsOfOneRank) {
  const models::GPTConfig config = dtensor::testing::tiny_gpt(4);
  SyntheticLanguage data(config.vocab, config.block_size, 16, 3);
  const TokenBatch batch = data.get_batch({0, 1, 2, 3, 4});
  Tensor want;
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    models::GPT model(mesh, config, kModelSeed);
    want = model(distribute(batch.inputs, mesh, {Replicate()})).full_tensor();
  });
  launch(2, [&](Group g) {
    DeviceMesh mesh(g, {2}, {"pp"});
    PipelineMesh pm(mesh);
    GPTPipeline gpt(pm, config, kModelSeed, {.schedule = ScheduleKind::ForwardOnly, .micro_batches = 2});
    // 5 rows in micro-batches of 3 and 2.
    auto ids = [&](int64_t, int64_t m) {
      const Tensor rows = batch.inputs.narrow(0, m == 0 ? 0 : 3, m == 0 ? 3 : 2).contiguous();
      return distribute(rows, pm.stage_mesh(), {Replicate()});
    };
    std::unique_ptr<Pipeline> pipe = gpt.make_pipeline({}, ids, nullptr);
    const std::vector<DistTensor> out = pipe->forward(0);
    ASSERT_EQ(out.size(), 2u);
    if (pm.coordinate() == 1) {
      EXPECT_TRUE(allclose(out[0].full_tensor(), want.narrow(0, 0, 3), 1e-6, 1e-7));
      EXPECT_TRUE(allclose(out[1].full_tensor(), want.narrow(0, 3, 2), 1e-6, 1e-7));
      EXPECT_FALSE(out[0].requires_grad());
    } else {
      EXPECT_FALSE(out[0].defined());
    }
    EXPECT_EQ(pipe->stats().peak_in_flight, 0);
    EXPECT_THROW_MSG(pipe->train_step(0), std::invalid_argument, "the ForwardOnly schedule has no backward");
  });
}

// ---- bad input -----------------------------------------------------------------------------------

namespace {

// A linear stage that can fail on its n-th forward.
class LinearStage : public nn::Module {
 public:
  LinearStage(const DeviceMesh& mesh, int64_t in, int64_t out, int fail_at = -1) : fail_at_(fail_at) {
    linear_ = register_module("linear", std::make_shared<nn::Linear>(mesh, in, out, false, 1));
  }
  DistTensor forward(const DistTensor& x) override {
    if (calls_++ == fail_at_) throw std::runtime_error("[test] boom in forward " + std::to_string(fail_at_));
    return (*linear_)(x);
  }

 private:
  std::shared_ptr<nn::Linear> linear_;
  int fail_at_, calls_ = 0;
};

// Two linear stages on pp = 2 running 1F1B over 4 micro-batches: stage 1 takes
// `stage1_in` features (stage 0 makes 6), declares `declared` as its input, and fails
// on its forward number `fail_at`.
void two_linear_stages(int64_t stage1_in, std::vector<int64_t> declared, int fail_at = -1) {
  launch(2, [&](Group g) {
    DeviceMesh mesh(g, {2}, {"pp"});
    PipelineMesh pm(mesh);
    const int me = pm.coordinate();
    LinearStage module(pm.stage_mesh(), me == 0 ? 4 : stage1_in, me == 0 ? 6 : 2, me == 1 ? fail_at : -1);
    PipelineData data;
    data.inputs = [&](int64_t, int64_t m) { return randn({2, 4}, pm.stage_mesh(), {Replicate()}, 10 + m); };
    data.loss = [](int64_t, int64_t, const DistTensor& y) { return sum(y); };
    Pipeline pipe(pm, {{&module, me, nullptr, me == 1 ? declared : std::vector<int64_t>{}}}, one_f_one_b(2, 4), data);
    pipe.train_step(0);
  });
}

}  // namespace

TEST(PipelineErrors, AStageThatThrowsReleasesTheOthersWithItsError) {
  // Stage 1 fails on micro-batch 2 while stage 0 waits for its gradients: the error
  // comes back from launch (naming the stage and the action), nobody hangs.
  EXPECT_THROW_MSG(two_linear_stages(6, {}, 2), std::runtime_error, "[pipeline] stage 1, 1F2 (step 0, micro-batch 2): [test] boom");
  two_linear_stages(6, {-1, 6});  // the same pipeline without the failure runs
}

TEST(PipelineErrors, AStageOutputThatDoesNotFitTheNextStage) {
  EXPECT_THROW_MSG(two_linear_stages(5, {-1, 5}), std::invalid_argument,
                   "stage 1 takes inputs [*, 5]; stage 0 sent [2, 6] f32 for micro-batch 0");
  // Without a declared input the next stage's own check names the mismatch.
  EXPECT_THROW_MSG(two_linear_stages(5, {}), std::invalid_argument, "[pipeline] stage 1, 1F0");
}

TEST(PipelineErrors, BadMeshesSchedulesAndStagesAreClearErrors) {
  launch(2, [](Group g) {
    DeviceMesh dp(g, {2}, {"dp"});
    EXPECT_THROW_MSG(PipelineMesh{dp}, std::invalid_argument,
                     "[pipeline] the mesh dp=2 has no 'pp' dim: a pipeline runs its stages along it (e.g. pp=2,dp=2)");
    DeviceMesh mesh(g, {2}, {"pp"});
    PipelineMesh pm(mesh);
    EXPECT_EQ(pm.stage_mesh().to_string(), "stage=1");
    // More stages than blocks; a micro-batch count interleaving cannot use.
    EXPECT_THROW_MSG(
        GPTPipeline(pm, dtensor::testing::tiny_gpt(2), 1,
                    {.schedule = ScheduleKind::Interleaved1F1B, .virtual_stages = 2}),
        std::invalid_argument,
        "4 pipeline stages (pp=2 x 2 virtual) need at least 4 transformer blocks (one per stage), the model has 2");
    EXPECT_THROW_MSG(GPTPipeline(pm, dtensor::testing::tiny_gpt(4), 1,
                                 {.schedule = ScheduleKind::Interleaved1F1B, .micro_batches = 3, .virtual_stages = 2}),
                     std::invalid_argument, "the micro-batch count must be a multiple of the pipeline ranks");
    EXPECT_THROW_MSG(GPTPipeline(pm, dtensor::testing::tiny_gpt(4), 1, {.split = {{0, 3}, {3, 5}}}),
                     std::invalid_argument, "the ranges cover layers [0, 5), the model has 4");
    // Stages that do not fit the schedule or the mesh.
    LinearStage module(pm.stage_mesh(), 4, 4);
    PipelineData data;
    data.inputs = [&](int64_t, int64_t) { return randn({2, 4}, pm.stage_mesh(), {Replicate()}, 1); };
    data.loss = [](int64_t, int64_t, const DistTensor& y) { return sum(y); };
    const int me = pm.coordinate();
    EXPECT_THROW_MSG(Pipeline(pm, {{&module, 1 - me}}, one_f_one_b(2, 2), data), std::invalid_argument,
                     detail::concat("pipeline rank ", me, " runs stage ", me, " of 1F1B (2 stages on 2 ranks), got stages ", 1 - me));
    EXPECT_THROW_MSG(Pipeline(pm, {{&module, me}}, one_f_one_b(4, 2), data), std::invalid_argument,
                     "the schedule 1F1B runs on 4 pipeline ranks, the mesh pp=2 has pp=2");
    LinearStage elsewhere(DeviceMesh(g, {2}, {"x"}), 4, 4);
    EXPECT_THROW_MSG(Pipeline(pm, {{&elsewhere, me}}, one_f_one_b(2, 2), data), std::invalid_argument,
                     "stage " + std::to_string(me) + "'s parameters must live on its stage mesh");
    EXPECT_THROW_MSG(Pipeline(pm, {{&module, me}}, one_f_one_b(2, 2), data, {{"linear.weight", {0}}}),
                     std::invalid_argument, "tied parameter 'linear.weight' needs at least two stages");
    // A trainer step through a pipeline accumulates nothing of its own.
    Pipeline pipe(pm, {{&module, me}}, one_f_one_b(2, 2), data);
    AdamW optimizer(module.parameters(), 1e-3);
    Trainer trainer(optimizer, {.grad_accum = 2});
    EXPECT_THROW_MSG(trainer.step(0, pipe), std::invalid_argument, "a pipeline runs the micro-batches");
  });
}
