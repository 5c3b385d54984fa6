// FSDP (ZeRO stages 1-3, HSDP, FSDP over tensor parallel): the flat layout, parallel
// equivalence with one rank, collective counts and bytes, memory against the ZeRO
// formulas, state dicts, and the errors for bad input.
#include "dtensor/parallel/fsdp.h"

#include <cmath>
#include <set>

#include "dtensor/data.h"
#include "dtensor/models/gpt.h"
#include "dtensor/models/gpt_parallel.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/ddp.h"
#include "dtensor/parallel/tensor_parallel.h"
#include "dtensor/parallel/trainer.h"
#include "parallel/flat_layout.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

using namespace dtensor;
using parallel::detail::FlatLayout;

namespace {

// ---- the flat layout ------------------------------------------------------------------

TEST(FsdpFlatLayout, WorkedExampleOfTheHeader) {
  // 5x2 and 3x1 on 2 ranks: chunk rows 3 and 2, slots of 6 and 2, R = 8.
  const FlatLayout rank1({{5, 2}, {3, 1}}, 2, 1);
  EXPECT_EQ(rank1.region_numel(), 8);
  EXPECT_EQ(rank1.unsharded_numel(), 13);
  EXPECT_EQ(rank1.slots()[0].chunk_rows, 3);
  EXPECT_EQ(rank1.slots()[1].slot_offset, 6);
  EXPECT_EQ(rank1.shard_shape(0), (Shape{2, 2}));
  EXPECT_EQ(rank1.shard_shape(1), (Shape{1, 1}));
}

// Every rank's region, filled from full tensors, gathers back to them; gradients
// packed rank-major reduce to each rank's shard (sum over ranks = N x the gradient).
TEST(FsdpFlatLayout, ScatterGatherAndPackRoundTripForUnevenAndEmptyShards) {
  const std::vector<Shape> shapes{{5, 2}, {3}, {1, 4}, {0, 3}, {7, 1, 2}, {9}};
  for (int64_t n = 1; n <= 5; ++n) {
    std::vector<Tensor> full;
    for (size_t i = 0; i < shapes.size(); ++i) full.push_back(Tensor::randn(shapes[i], 10 + i));
    std::vector<FlatLayout> layouts;
    for (int64_t r = 0; r < n; ++r) layouts.emplace_back(shapes, n, r);
    const int64_t region = layouts[0].region_numel();
    Tensor rank_major = Tensor::zeros({n * region});
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(layouts[r].region_numel(), region) << "every rank's region has one layout";
      layouts[r].scatter_into_region(full, rank_major.narrow(0, r * region, region));
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Range rows = chunk_range(shapes[i][0], n, r);
        EXPECT_TRUE(allclose(layouts[r].shard_view(rank_major.narrow(0, r * region, region), i),
                             full[i].narrow(0, rows.offset, rows.length), 0, 0))
            << "n " << n << " rank " << r << " param " << i;
      }
    }
    Tensor unsharded = Tensor::full({layouts[0].unsharded_numel()}, -1.0);
    layouts[0].unpack(rank_major, unsharded);
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_TRUE(allclose(layouts[0].unsharded_view(unsharded, i), full[i], 0, 0)) << "n " << n << " param " << i;
    }
    // Pack twice with accumulation over a buffer whose padding was zeroed.
    Tensor packed = Tensor::full({n * region}, 7.0);
    layouts[0].zero_padding(packed);
    for (size_t i = 0; i < shapes.size(); ++i) layouts[0].pack(i, full[i], packed, false);
    for (size_t i = 0; i < shapes.size(); ++i) layouts[0].pack(i, full[i], packed, true);
    for (int64_t r = 0; r < n; ++r) {
      const Tensor mine = packed.narrow(0, r * region, region);
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Range rows = chunk_range(shapes[i][0], n, r);
        EXPECT_TRUE(allclose(layouts[r].shard_view(mine, i), mul(full[i].narrow(0, rows.offset, rows.length), 2.0),
                             1e-6, 0));
      }
    }
    // Padding stayed zero: the packed sum equals twice the sum of the parameters.
    double total = 0;
    for (const Tensor& t : full) total += 2 * sum(t.to(DType::F64)).item<double>();
    EXPECT_NEAR(sum(packed.to(DType::F64)).item<double>(), total, 1e-9);
  }
}

// ---- training ---------------------------------------------------------------------------

// Odd sizes: vocab 17 and width 18 split unevenly over 2 and 4 ranks (the token
// embedding has 17 rows: 9,8 and 5,5,5,2), and 3 positions leave rank 3 of 4 an
// empty shard.
models::GPTConfig odd_config() {
  models::GPTConfig c;
  c.vocab = 17;
  c.block_size = 3;
  c.layers = 2;
  c.heads = 2;
  c.dim = 18;
  c.mlp_hidden = 30;
  // No biases (test_train.cpp says why: the key bias has a zero gradient whose noise
  // AdamW amplifies differently on every layout).
  c.bias = false;
  return c;
}

struct Setup {
  int world = 1;
  std::vector<int64_t> mesh_shape;            // default {world}
  std::vector<std::string> mesh_names;        // default {"dp"}
  std::optional<parallel::FSDPOptions> fsdp;  // none: one rank or DDP
  bool ddp = false;
  bool tensor_parallel = false;  // hand-built TP layouts on the "tp" dim before FSDP
  std::optional<models::GPTPlanOptions> tp_plan;  // parallelize_module with gpt_tp_plan on "tp" before FSDP
  int accum = 1;
  double clip = 0;
  int steps = 10;
  bool checkpoint = false;
  bool sgd = false;  // SGD with momentum (scale-sensitive, unlike Adam) instead of AdamW
  // A one-step delayed update (parallel::DelayedUpdate) after these warm-up steps;
  // with fsdp it runs through the trainer, without (one rank) by hand as the reference.
  std::optional<int64_t> delayed_warmup;
};

struct TrainRun : dtensor::testing::TrainingRun {
  parallel::FSDPStats stats;
  std::map<std::string, std::string> placements;  // of rank 0's parameters
  std::set<std::string> param_devices;            // where the optimizer's parameters live
  parallel::DelayedUpdateStats delayed;
};

// Megatron layouts by hand (the tensor-parallel module comes with its own issue):
// q, k, v and the MLP's first linear column-parallel (weight rows on tp), the output
// projections row-parallel (weight columns on tp).
void shard_tensor_parallel(nn::Module& model, const DeviceMesh& mesh) {
  const int tp = mesh.dim_index("tp");
  for (auto& [name, p] : model.named_parameters()) {
    const bool column = name.ends_with("q.weight") || name.ends_with("k.weight") || name.ends_with("v.weight") ||
                        name.ends_with("up.weight");
    const bool row = name.ends_with("out.weight") || name.ends_with("down.weight");
    if (!column && !row) continue;
    Placements placements(mesh.ndim(), Replicate());
    placements[tp] = Shard(column ? 0 : 1);
    model.set_parameter(name, distribute(p.full_tensor(), mesh, placements));
  }
}

TrainRun train(const Setup& s) {
  TrainRun result;
  const models::GPTConfig config = [&] {
    models::GPTConfig c = odd_config();
    c.checkpoint_activations = s.checkpoint;
    return c;
  }();
  const int64_t global_batch = 8;
  launch(s.world, [&](Group g) {
    const Shape shape = s.mesh_shape.empty() ? Shape{s.world} : Shape(s.mesh_shape);
    const std::vector<std::string> names = s.mesh_names.empty() ? std::vector<std::string>{"dp"} : s.mesh_names;
    DeviceMesh mesh(g, shape, names);
    // The batch is split over every data-parallel dim (dp and, for HSDP, replicate).
    Placements batch(mesh.ndim(), Replicate());
    int64_t dp_size = 1, dp_rank = 0;
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (names[d] == "tp") continue;
      batch[d] = Shard(0);
      dp_rank = dp_rank * mesh.size(d) + mesh.coordinate(d);
      dp_size *= mesh.size(d);
    }
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    DistributedSampler sampler(data.size(), global_batch, dp_rank, dp_size, 5, true, s.accum);
    models::GPT model(mesh, config, 42);
    if (s.tensor_parallel) shard_tensor_parallel(model, mesh);
    if (s.tp_plan) parallel::parallelize_module(model, mesh["tp"], models::gpt_tp_plan(config, *s.tp_plan));
    std::optional<parallel::DistributedDataParallel> ddp;
    std::optional<parallel::FSDPModule> root;
    if (s.ddp) ddp.emplace(model, parallel::DDPOptions{.bucket_cap_mb = 0.001});
    if (s.fsdp) {
      for (auto& [name, m] : model.named_modules()) {
        if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, *s.fsdp);
      }
      root = parallel::fully_shard(model, mesh, *s.fsdp);
    }
    std::unique_ptr<Optimizer> optimizer;
    if (s.sgd) {
      optimizer = std::make_unique<SGD>(model.parameters(), 0.5, 0.9);
    } else {
      optimizer = std::make_unique<AdamW>(model.parameters(), 1e-2);
    }
    parallel::GradientSync* sync = ddp ? static_cast<parallel::GradientSync*>(&*ddp)
                                       : root ? static_cast<parallel::GradientSync*>(&*root) : nullptr;
    std::optional<parallel::DelayedUpdate> delayed;
    if (s.delayed_warmup && root) delayed.emplace(*optimizer, model, parallel::DelayedUpdateOptions{*s.delayed_warmup});
    parallel::Trainer trainer(*optimizer, {.grad_accum = s.accum,
                                           .clip_grad_norm = s.clip,
                                           .sync = sync,
                                           .delayed_update = delayed ? &*delayed : nullptr});
    const Shape micro{global_batch / s.accum, config.block_size};
    const auto loss_of = [&](int64_t step, int64_t m) {
      const TokenBatch b = data.get_batch(sampler.micro_batch_at(step, m));
      return model.loss(DistTensor::from_local(b.inputs, mesh, batch, micro),
                        DistTensor::from_local(b.targets, mesh, batch, micro));
    };
    std::vector<double> losses;
    std::vector<DistTensor> pending;  // the reference's delayed gradients
    for (int step = 0; step < s.steps; ++step) {
      if (s.delayed_warmup && !root) {
        // The definition: step k's gradients update the parameters after step k + 1's
        // forward and backward.
        double step_loss = 0;
        for (int64_t m = 0; m < s.accum; ++m) {
          const DistTensor loss = div(loss_of(step, m), static_cast<double>(s.accum));
          loss.backward();
          step_loss += loss.full_tensor().item<double>();
        }
        losses.push_back(step_loss);
        if (s.clip > 0) clip_grad_norm(optimizer->params(), s.clip);
        std::vector<DistTensor> grads;
        for (const DistTensor& p : optimizer->params()) grads.push_back(p.grad());
        if (step < *s.delayed_warmup) {
          optimizer->step(grads);
        } else {
          if (!pending.empty()) optimizer->step(pending);
          pending = grads;
        }
        optimizer->zero_grad();
        continue;
      }
      const parallel::StepReport report = trainer.step(step, [&](int64_t m) { return loss_of(step, m); });
      losses.push_back(report.stats.loss);
    }
    if (!pending.empty()) optimizer->step(pending);
    if (delayed) delayed->finish();
    const auto params = model.state_dict();
    if (g.rank() == 0) {
      result.losses = losses;
      result.params = params;
      if (root) result.stats = root->stats();
      if (delayed) result.delayed = delayed->stats();
      for (auto& [name, p] : model.named_parameters()) {
        result.placements[name] = placements_to_string(p.placements());
        result.param_devices.insert(p.device().to_string());
      }
    }
  });
  return result;
}

const TrainRun& one_rank() {
  static const TrainRun run = train({});
  return run;
}

parallel::FSDPOptions stage(int s) { return {.stage = s}; }

TEST(Fsdp, StagesOneTwoThreeMatchOneRankAtDp2AndDp4) {
  const TrainRun& one = one_rank();
  ASSERT_LT(one.losses.back(), one.losses.front()) << "the loss should fall";
  for (int world : {2, 4}) {
    for (int s : {1, 2, 3}) {
      const TrainRun run = train({.world = world, .fsdp = stage(s)});
      dtensor::testing::expect_equivalent(run, one, "stage " + std::to_string(s) + " DP=" + std::to_string(world));
      EXPECT_EQ(run.placements.at("tokens.weight"), "S(0)");
      EXPECT_EQ(run.placements.at("blocks.0.mlp.up.weight"), "S(0)");
    }
  }
}

// SGD's update is proportional to the gradient (Adam's is nearly scale-free), so a
// gradient counted twice or halved anywhere shows.
TEST(Fsdp, SgdTrainingMatchesOneRankForEveryStageAndLayout) {
  const TrainRun one = train({.steps = 6, .sgd = true});
  ASSERT_LT(one.losses.back(), one.losses.front());
  for (int world : {2, 4}) {
    for (int s : {1, 2, 3}) {
      dtensor::testing::expect_equivalent(train({.world = world, .fsdp = stage(s), .steps = 6, .sgd = true}), one,
                                          "SGD stage " + std::to_string(s) + " DP=" + std::to_string(world));
    }
  }
  parallel::FSDPOptions hsdp = stage(3);
  hsdp.replicate_dim = "replicate";
  dtensor::testing::expect_equivalent(
      train(
          {.world = 4, .mesh_shape = {2, 2}, .mesh_names = {"replicate", "dp"}, .fsdp = hsdp, .steps = 6, .sgd = true}),
      one, "SGD HSDP 2x2");
  dtensor::testing::expect_equivalent(train({.world = 4,
                                             .mesh_shape = {2, 2},
                                             .mesh_names = {"dp", "tp"},
                                             .fsdp = stage(3),
                                             .tensor_parallel = true,
                                             .steps = 6,
                                             .sgd = true}),
                                      one, "SGD FSDP over TP 2x2");
  dtensor::testing::expect_equivalent(train({.world = 2, .fsdp = stage(1), .accum = 2, .steps = 6, .sgd = true}),
                                      train({.accum = 2, .steps = 6, .sgd = true}), "SGD stage 1 accumulation");
}

TEST(Fsdp, ReshardAfterForwardOffAndPrefetchDepthsMatchOneRank) {
  parallel::FSDPOptions keep = stage(3);
  keep.reshard_after_forward = false;
  const TrainRun kept = train({.world = 2, .fsdp = keep});
  dtensor::testing::expect_equivalent(kept, one_rank(), "reshard_after_forward off");
  parallel::FSDPOptions no_prefetch = stage(3);
  no_prefetch.prefetch = 0;
  const TrainRun plain = train({.world = 2, .fsdp = no_prefetch});
  dtensor::testing::expect_equivalent(plain, one_rank(), "prefetch off");
  EXPECT_EQ(plain.stats.prefetched_all_gathers, 0);
  // With prefetch every module but the first of each pass gathers ahead from step 2 on;
  // at depth 2 too (a module already gathering is not gathered twice).
  const TrainRun prefetched = train({.world = 2, .fsdp = stage(3)});
  EXPECT_GT(prefetched.stats.prefetched_all_gathers, 0);
  EXPECT_EQ(prefetched.stats.all_gathers, plain.stats.all_gathers);
  parallel::FSDPOptions deep = stage(3);
  deep.prefetch = 2;
  const TrainRun two = train({.world = 2, .fsdp = deep});
  dtensor::testing::expect_equivalent(two, one_rank(), "prefetch 2");
  EXPECT_EQ(two.stats.all_gathers, plain.stats.all_gathers);
  EXPECT_EQ(two.stats.prefetched_all_gathers, prefetched.stats.prefetched_all_gathers);
}

// ZeRO-Offload on the CPU: the shards, their gradients and AdamW's state on cpu:1
// (the host stand-in), the device copies on cpu:0. The same arithmetic as plain FSDP,
// so the same losses step for step, at both stages, in FP32 and in mixed precision,
// with accumulation and clipping.
TEST(FsdpOffload, TrainsStepForStepAsPlainFsdp) {
  const parallel::MixedPrecisionPolicy bf16{.param_dtype = DType::BF16, .reduce_dtype = DType::BF16};
  for (int s : {2, 3}) {
    for (const bool mixed : {false, true}) {
      parallel::FSDPOptions plain = stage(s);
      if (mixed) plain.mixed_precision = bf16;
      parallel::FSDPOptions offload = plain;
      offload.offload = parallel::OffloadPolicy{};
      const std::string what = "offload stage " + std::to_string(s) + (mixed ? " BF16" : " F32");
      const TrainRun want = train({.world = 2, .fsdp = plain, .accum = 2, .clip = 0.5});
      const TrainRun got = train({.world = 2, .fsdp = offload, .accum = 2, .clip = 0.5});
      ASSERT_EQ(got.losses.size(), want.losses.size());
      for (size_t i = 0; i < want.losses.size(); ++i) {
        EXPECT_NEAR(got.losses[i], want.losses[i], 1e-6 * std::abs(want.losses[i])) << what << " step " << i;
      }
      dtensor::testing::expect_equivalent(got, want, what);
      EXPECT_EQ(got.param_devices, (std::set<std::string>{"cpu:1"})) << what;
      EXPECT_EQ(want.param_devices, (std::set<std::string>{"cpu"})) << what;
    }
  }
  // And against one rank, as every FSDP layout.
  parallel::FSDPOptions offload = stage(3);
  offload.offload = parallel::OffloadPolicy{};
  dtensor::testing::expect_equivalent(train({.world = 2, .fsdp = offload}), one_rank(), "offload stage 3 DP=2");
}

TEST(FsdpOffload, DelayedUpdateIsOneStepStaleAfterItsWarmup) {
  const int64_t warmup = 3;
  const TrainRun want = train({.steps = 8, .delayed_warmup = warmup});  // one rank, by hand
  const TrainRun undelayed = one_rank();
  for (int s : {2, 3}) {
    parallel::FSDPOptions offload = stage(s);
    offload.offload = parallel::OffloadPolicy{};
    const std::string what = "delayed update, offload stage " + std::to_string(s);
    const TrainRun got = train({.world = 2, .fsdp = offload, .steps = 8, .delayed_warmup = warmup});
    dtensor::testing::expect_equivalent(got, want, what);
    EXPECT_EQ(got.delayed.steps, 8) << what;
    EXPECT_EQ(got.delayed.delayed_steps, 8 - warmup) << what;
    // The delay is there: the same as undelayed training until the first step that
    // reads stale parameters (step warmup + 1), different after.
    for (int64_t i = 0; i <= warmup; ++i) {
      EXPECT_NEAR(got.losses[static_cast<size_t>(i)], undelayed.losses[static_cast<size_t>(i)],
                  1e-5 * undelayed.losses[static_cast<size_t>(i)])
          << what << " step " << i;
    }
    EXPECT_GT(std::abs(got.losses[warmup + 1] - undelayed.losses[warmup + 1]), 1e-4) << what;
  }
}

TEST(FsdpOffload, DelayedUpdateWithAccumulationAndClippingAndBf16) {
  const int64_t warmup = 2;
  const TrainRun want = train({.accum = 2, .clip = 0.5, .steps = 6, .delayed_warmup = warmup});
  parallel::FSDPOptions offload = stage(3);
  offload.offload = parallel::OffloadPolicy{};
  const TrainRun got =
      train({.world = 2, .fsdp = offload, .accum = 2, .clip = 0.5, .steps = 6, .delayed_warmup = warmup});
  dtensor::testing::expect_equivalent(got, want, "delayed update, accumulation 2, clipping 0.5");
  // BF16 gathers and reductions: against the same run on 4 ranks (the one-rank reference
  // computes in F32).
  offload.mixed_precision = {.param_dtype = DType::BF16, .reduce_dtype = DType::BF16};
  const TrainRun two = train({.world = 2, .fsdp = offload, .steps = 6, .delayed_warmup = warmup});
  const TrainRun four = train({.world = 4, .fsdp = offload, .steps = 6, .delayed_warmup = warmup});
  ASSERT_EQ(two.losses.size(), four.losses.size());
  for (size_t i = 0; i < two.losses.size(); ++i) {
    EXPECT_NEAR(two.losses[i], four.losses[i], 2e-2 * two.losses[i]) << "BF16 step " << i;
  }
  EXPECT_EQ(four.delayed.delayed_steps, 6 - warmup);
}

TEST(FsdpOffload, DelayedUpdateLandsBeforeAnythingReadsTheShards) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"dp"});
    models::GPTConfig c = odd_config();
    models::GPT model(mesh, c, 42);
    const parallel::FSDPOptions offload{.offload = parallel::OffloadPolicy{}};
    for (auto& [name, m] : model.named_modules()) {
      if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, offload);
    }
    parallel::FSDPModule root = parallel::fully_shard(model, mesh, offload);
    AdamW optimizer(model.parameters(), 1e-2);
    parallel::DelayedUpdate delayed(optimizer, model, {.warmup_steps = 0});
    const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
    const auto forward = [&] { return model(distribute(ids, mesh, {Replicate()})).full_tensor(); };
    model.loss(distribute(ids, mesh, {Replicate()}), distribute(ids, mesh, {Replicate()})).backward();
    delayed.step();
    optimizer.zero_grad();
    EXPECT_TRUE(delayed.in_flight());
    // The sharded state dict waits for the update and reads the updated shards.
    const std::map<std::string, DistTensor> state = root.state_dict({.full = false});
    EXPECT_FALSE(delayed.in_flight());
    EXPECT_EQ(optimizer.state(0).step, 1);
    // A forward now gathers the updated parameters, as after finish().
    Tensor after_gate;
    {
      NoGradGuard no_grad;
      after_gate = forward();
    }
    delayed.finish();
    {
      NoGradGuard no_grad;
      EXPECT_TRUE(allclose(forward(), after_gate, 0, 0));
    }
    // The optimizer's own methods wait for the step through its lock.
    model.loss(distribute(ids, mesh, {Replicate()}), distribute(ids, mesh, {Replicate()})).backward();
    delayed.step();
    optimizer.zero_grad();
    EXPECT_EQ(optimizer.step_counts().at("0.step"), 2);
    EXPECT_EQ(optimizer.state_dict().count("0.exp_avg"), 1u);
    delayed.finish();
    EXPECT_EQ(delayed.stats().delayed_steps, 2);
  });
}

TEST(FsdpOffload, DelayedUpdateBadInputIsAClearError) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"dp"});
    models::GPTConfig c = odd_config();
    models::GPT plain(mesh, c, 42);
    AdamW plain_optimizer(plain.parameters(), 1e-2);
    EXPECT_THROW_MSG(parallel::DelayedUpdate(plain_optimizer, plain), std::invalid_argument,
                     "[DelayedUpdate] module '' holds no fully_shard'ed module");
    parallel::fully_shard(plain, mesh);
    AdamW sharded_optimizer(plain.parameters(), 1e-2);
    EXPECT_THROW_MSG(parallel::DelayedUpdate(sharded_optimizer, plain), std::invalid_argument,
                     "parameter 0 of the optimizer (shape [17, 18]) is not an offloaded FSDP shard of the model");
    models::GPT model(mesh, c, 42);
    parallel::fully_shard(model, mesh, {.offload = parallel::OffloadPolicy{}});
    AdamW optimizer(model.parameters(), 1e-2);
    EXPECT_THROW_MSG(parallel::DelayedUpdate(optimizer, model, {.warmup_steps = -1}), std::invalid_argument,
                     "option warmup_steps: expected 0 or more, got -1");
    parallel::DelayedUpdate delayed(optimizer, model);
    EXPECT_THROW_MSG(parallel::DelayedUpdate(optimizer, model), std::invalid_argument,
                     "the model's FSDP modules already have a DelayedUpdate");
    AdamW other(model.parameters(), 1e-2);
    EXPECT_THROW_MSG(parallel::Trainer(other, {.delayed_update = &delayed}), std::invalid_argument,
                     "option delayed_update steps another optimizer than the trainer's");
    EXPECT_THROW_MSG(optimizer.step(std::vector<DistTensor>{}), std::invalid_argument,
                     "step: expected one gradient per parameter");
  });
}

TEST(Fsdp, ClippingAndGradientAccumulationMatchOneRank) {
  const TrainRun one = train({.accum = 2, .clip = 0.5});
  for (int s : {1, 2, 3}) {
    dtensor::testing::expect_equivalent(train({.world = 2, .fsdp = stage(s), .accum = 2, .clip = 0.5}), one,
                                        "stage " + std::to_string(s) + " accumulation + clipping");
  }
  dtensor::testing::expect_equivalent(train({.world = 4, .fsdp = stage(3), .accum = 2, .clip = 0.5}), one,
                                      "DP=4 accumulation");
}

TEST(Fsdp, ActivationCheckpointingMatchesOneRank) {
  dtensor::testing::expect_equivalent(train({.world = 2, .fsdp = stage(3), .steps = 4, .checkpoint = true}),
                                      train({.steps = 4}), "stage 3 with checkpointing");
}

TEST(Fsdp, HybridShardingTwoByTwoMatchesOneRank) {
  parallel::FSDPOptions hsdp = stage(3);
  hsdp.replicate_dim = "replicate";
  const TrainRun run = train({.world = 4, .mesh_shape = {2, 2}, .mesh_names = {"replicate", "dp"}, .fsdp = hsdp, .clip = 0.5});
  dtensor::testing::expect_equivalent(run, train({.clip = 0.5}), "HSDP 2x2");
  EXPECT_EQ(run.placements.at("tokens.weight"), "R,S(0)");
  EXPECT_GT(run.stats.replica_all_reduces, 0);
}

TEST(Fsdp, OverTensorParallelTwoByTwoMatchesOneRank) {
  const TrainRun one = train({.clip = 0.5});
  const TrainRun run = train({.world = 4, .mesh_shape = {2, 2}, .mesh_names = {"dp", "tp"}, .fsdp = stage(3),
                         .tensor_parallel = true, .clip = 0.5});
  dtensor::testing::expect_equivalent(run, one, "FSDP over TP 2x2 (full_tensor of every parameter)");
  // dp splits each tp piece of a column-parallel weight: the nested order.
  EXPECT_EQ(run.placements.at("blocks.0.attn.q.weight"), "S(0,order=1),S(0)");
  EXPECT_EQ(run.placements.at("blocks.0.attn.out.weight"), "S(0),S(1)");
  EXPECT_EQ(run.placements.at("tokens.weight"), "S(0),R");
  const TrainRun accumulated = train({.world = 4, .mesh_shape = {2, 2}, .mesh_names = {"dp", "tp"}, .fsdp = stage(2),
                                 .tensor_parallel = true, .accum = 2, .clip = 0.5});
  dtensor::testing::expect_equivalent(accumulated, train({.accum = 2, .clip = 0.5}), "stage 2 over TP, accumulation");
}

// The 2-D composition with the tensor-parallel module: Megatron's plan on tp
// (heads, MLP hidden and vocabulary sharded; sequence parallel too), then FSDP on dp.
TEST(Fsdp, OverParallelizeModuleTwoByTwoMatchesOneRank) {
  // Heads and the MLP hidden must divide by tp = 2: 2 heads of 9, hidden 30.
  const TrainRun one = train({.clip = 0.5, .sgd = true});
  for (bool sp : {false, true}) {
    for (int s : {2, 3}) {
      const TrainRun run = train({.world = 4,
                                  .mesh_shape = {2, 2},
                                  .mesh_names = {"dp", "tp"},
                                  .fsdp = stage(s),
                                  .tp_plan = models::GPTPlanOptions{.sequence_parallel = sp},
                                  .clip = 0.5,
                                  .sgd = true});
      dtensor::testing::expect_equivalent(run, one,
                                          std::string("FSDP stage ") + std::to_string(s) + " over gpt_tp_plan" +
                                              (sp ? " with sequence parallelism" : ""));
      EXPECT_EQ(run.placements.at("blocks.0.attn.q.weight"), "S(0,order=1),S(0)");
      EXPECT_EQ(run.placements.at("tokens.weight"), "S(0,order=1),S(0)") << "vocab-parallel embedding";
    }
  }
}

TEST(Fsdp, DdpAcceptsParametersShardedOverDp) {
  // A weight the user sharded over dp: its gradient comes back sharded from the
  // all-gather's backward, so DDP reduces only the others; training matches one rank.
  auto run = [](int world) {
    TrainRun result;
    launch(world, [&](Group g) {
      DeviceMesh mesh(g, {world}, {"dp"});
      models::GPT model(mesh, odd_config(), 42);
      model.set_parameter("blocks.0.mlp.up.weight",
                          distribute(model.submodule("blocks.0.mlp.up").named_parameters()[0].second.full_tensor(), mesh,
                                     {Shard(0)}));
      parallel::DistributedDataParallel ddp(model, {.bucket_cap_mb = 0.001});
      SGD optimizer(model.parameters(), 0.5, 0.9);
      parallel::Trainer trainer(optimizer, {.sync = &ddp});
      SyntheticLanguage data(17, 3, 64, 3);
      DistributedSampler sampler(data.size(), 8, mesh.coordinate(0), world, 5);
      std::vector<double> losses;
      for (int step = 0; step < 5; ++step) {
        losses.push_back(trainer.step(step, [&](int64_t) {
          const TokenBatch b = data.get_batch(sampler.batch_at(step));
          return model.loss(DistTensor::from_local(b.inputs, mesh, {Shard(0)}, Shape{8, 3}),
                            DistTensor::from_local(b.targets, mesh, {Shard(0)}, Shape{8, 3}));
        }).stats.loss);
      }
      const auto params = model.state_dict();
      if (g.rank() == 0) result = {losses, params, {}, {}};
    });
    return result;
  };
  dtensor::testing::expect_equivalent(run(2), run(1), "DDP with one weight sharded over dp");
}

// ---- communication --------------------------------------------------------------------

// Even sizes (no padding): dim 16, vocab 32, 4 heads on 2 ranks.
models::GPTConfig even_config() {
  models::GPTConfig c;
  c.vocab = 32;
  c.block_size = 8;
  c.layers = 2;
  c.heads = 4;
  c.dim = 16;
  c.bias = false;
  return c;
}

// Three linear layers whose backward communicates nothing of its own (the GPT's
// position embedding all-reduces its gradient inside the embedding's backward), so
// every byte below is gradient or parameter traffic. Sizes divide by 2 and 4.
class Stack : public nn::Module {
 public:
  explicit Stack(const DeviceMesh& mesh) {
    for (int i = 0; i < 3; ++i) {
      layers_.push_back(register_module("layers." + std::to_string(i),
                                        std::make_shared<nn::Linear>(mesh, 16, i == 2 ? 4 : 16, true, i + 1, 0.3)));
    }
  }
  DistTensor forward(const DistTensor& x) override {
    DistTensor h = x;
    for (const auto& layer : layers_) h = tanh((*layer)(h));
    return h;
  }

 private:
  std::vector<std::shared_ptr<nn::Linear>> layers_;
};

struct StepComm {
  int64_t forward_all_gathers = 0, backward_all_gathers = 0, reduce_scatters = 0, all_reduces = 0;
  double moved_bytes = 0;  // per rank: what the algorithms send (nccl-tests' bus bytes)
  int64_t param_bytes = 0;
};

// The data-parallel collectives of one training step after a warm-up step (the
// prefetch order is recorded in the first), on `model` built by make(mesh).
template <class Block, class Make, class LossOf>
StepComm step_comm(int world, std::optional<int> fsdp_stage, int accum, Make make, LossOf loss_of) {
  StepComm out;
  launch(world, [&](Group g) {
    DeviceMesh mesh(g, {world}, {"dp"});
    auto model = make(mesh);
    std::optional<parallel::DistributedDataParallel> ddp;
    std::optional<parallel::FSDPModule> root;
    if (fsdp_stage) {
      for (auto& [name, m] : model->named_modules()) {
        if (dynamic_cast<Block*>(m)) parallel::fully_shard(*m, mesh, stage(*fsdp_stage));
      }
      root = parallel::fully_shard(*model, mesh, stage(*fsdp_stage));
    } else {
      ddp.emplace(*model, parallel::DDPOptions{.bucket_cap_mb = 1000});
    }
    parallel::GradientSync* sync = ddp ? static_cast<parallel::GradientSync*>(&*ddp) : &*root;
    AdamW optimizer(model->parameters(), 1e-3);
    parallel::Trainer trainer(optimizer, {.grad_accum = accum, .sync = sync});
    trainer.step(0, [&](int64_t m) { return loss_of(*model, mesh, 0, m, accum); });
    StepComm mine;
    const Group& dp = mesh.group(0);
    CommDebugMode all;
    trainer.step(1, [&](int64_t m) {
      CommDebugMode forward;
      DistTensor loss = loss_of(*model, mesh, 1, m, accum);
      mine.forward_all_gathers += forward.count("all_gather", dp);
      return loss;
    });
    mine.backward_all_gathers = all.count("all_gather", dp) - mine.forward_all_gathers;
    mine.reduce_scatters = all.count("reduce_scatter", dp);
    // The step's report all-reduces the F64 loss (8 bytes) and all-gathers the I64 peak
    // memory of cpu and cpu:1 (16 bytes): not gradient traffic.
    mine.all_reduces = all.count("all_reduce", dp) - 1;
    const double n = world;
    // Input bytes -> bytes the algorithm sends per rank: all-gather (n-1) x input,
    // reduce-scatter (n-1)/n x input, all-reduce 2 (n-1)/n x input.
    mine.moved_bytes = (n - 1) * (all.bytes("all_gather") - 16) + (n - 1) / n * all.bytes("reduce_scatter") +
                       2 * (n - 1) / n * (all.bytes("all_reduce") - 8);
    mine.param_bytes = model->num_parameters() * 4;
    if (g.rank() == 0) out = mine;
  });
  return out;
}

StepComm gpt_step_comm(int world, std::optional<int> fsdp_stage, int accum = 1) {
  return step_comm<nn::TransformerBlock>(
      world, fsdp_stage, accum,
      [](const DeviceMesh& mesh) { return std::make_shared<models::GPT>(mesh, even_config(), 1); },
      [](models::GPT& model, const DeviceMesh& mesh, int64_t step, int64_t micro, int accum) {
        const models::GPTConfig c = even_config();
        SyntheticLanguage data(c.vocab, c.block_size, 64, 1);
        DistributedSampler sampler(data.size(), 8, mesh.coordinate(0), mesh.size(), 1, true, accum);
        const TokenBatch b = data.get_batch(sampler.micro_batch_at(step, micro));
        const Shape shape{8 / accum, c.block_size};
        return model.loss(DistTensor::from_local(b.inputs, mesh, {Shard(0)}, shape),
                          DistTensor::from_local(b.targets, mesh, {Shard(0)}, shape));
      });
}

StepComm stack_step_comm(int world, std::optional<int> fsdp_stage) {
  return step_comm<nn::Linear>(
      world, fsdp_stage, 1, [](const DeviceMesh& mesh) { return std::make_shared<Stack>(mesh); },
      [](Stack& model, const DeviceMesh& mesh, int64_t step, int64_t, int) {
        const DistTensor x = distribute(Tensor::randn({8, 16}, 100 + step), mesh, {Shard(0)});
        return mean(square(model(x)));
      });
}

TEST(FsdpComm, OneAllGatherPerModulePassAndOneReduceScatterPerModule) {
  // 3 modules: the two blocks and the root (embeddings, final norm).
  const StepComm zero3 = gpt_step_comm(2, 3);
  EXPECT_EQ(zero3.forward_all_gathers, 3);
  EXPECT_EQ(zero3.backward_all_gathers, 2) << "the root is not resharded after forward";
  EXPECT_EQ(zero3.reduce_scatters, 3);
  for (int s : {1, 2}) {
    const StepComm z = gpt_step_comm(2, s);
    EXPECT_EQ(z.forward_all_gathers, 3) << "stage " << s;
    EXPECT_EQ(z.backward_all_gathers, 0) << "stage " << s;
    EXPECT_EQ(z.reduce_scatters, 3) << "stage " << s;
  }
  // Gradient accumulation: the same collectives per step, none between micro-batches.
  const StepComm accumulated = gpt_step_comm(2, 3, 2);
  EXPECT_EQ(accumulated.forward_all_gathers, 3);
  EXPECT_EQ(accumulated.backward_all_gathers, 2);
  EXPECT_EQ(accumulated.reduce_scatters, 3);
}

TEST(FsdpComm, DdpMovesTwiceAndZeroThreeThriceTheParameterBytes) {
  for (int n : {2, 4}) {
    const double ring = (n - 1.0) / n;  // the ring factor of every collective
    const StepComm ddp = stack_step_comm(n, std::nullopt);
    const double p = static_cast<double>(ddp.param_bytes);
    EXPECT_EQ(ddp.all_reduces, 1) << "one bucket";
    EXPECT_DOUBLE_EQ(ddp.moved_bytes, 2 * ring * p) << "DDP: 2x parameter bytes (all-reduce)";
    const StepComm zero2 = stack_step_comm(n, 2);
    EXPECT_EQ(zero2.all_reduces, 0);
    EXPECT_DOUBLE_EQ(zero2.moved_bytes, 2 * ring * p) << "ZeRO-2: reduce-scatter + all-gather";
    const StepComm zero3 = stack_step_comm(n, 3);
    EXPECT_EQ(zero3.forward_all_gathers, 3);
    EXPECT_EQ(zero3.backward_all_gathers, 3) << "the root holds no parameters: every layer regathers";
    EXPECT_DOUBLE_EQ(zero3.moved_bytes, 3 * ring * p) << "ZeRO-3: one more all-gather, 1.5x DDP";
  }
}

// ---- memory ---------------------------------------------------------------------------

// The GPT the memory tests measure: vocab 64, 16 positions, 4 heads of width 16.
models::GPTConfig memory_config(int64_t layers) {
  models::GPTConfig c;
  c.vocab = 64;
  c.block_size = 16;
  c.layers = layers;
  c.heads = 4;
  c.dim = 64;
  return c;
}

// Bytes per rank held after an optimizer step (parameters, gradients, optimizer state)
// with mixed-precision AdamW: BF16 compute and reduction, FP32 shards; with `offload`
// those on the device (cpu:0) and, in *host_out, those on the host (cpu:1).
double resident_bytes(int world, int s, int64_t* params_out, bool offload = false, double* host_out = nullptr) {
  double bytes = 0;
  launch(world, [&](Group g) {
    DeviceMesh mesh(g, {world}, {"dp"});
    models::GPTConfig c = memory_config(2);
    c.bias = false;
    const int64_t before = memory_stats().live_bytes, host_before = memory_stats(Device::cpu(1)).live_bytes;
    int64_t measured = 0, host = 0;
    {
      models::GPT model(mesh, c, 1);
      parallel::FSDPOptions o{.stage = s, .mixed_precision = {.param_dtype = DType::BF16, .reduce_dtype = DType::BF16}};
      if (offload) o.offload = parallel::OffloadPolicy{};
      for (auto& [name, m] : model.named_modules()) {
        if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, o);
      }
      parallel::FSDPModule root = parallel::fully_shard(model, mesh, o);
      AdamW optimizer(model.parameters(), 1e-3);
      SyntheticLanguage data(c.vocab, c.block_size, 64, 1);
      DistributedSampler sampler(data.size(), 8, mesh.coordinate(0), world, 1);
      const TokenBatch b = data.get_batch(sampler.batch_at(0));
      model.loss(DistTensor::from_local(b.inputs, mesh, {Shard(0)}, Shape{8, 16}),
                 DistTensor::from_local(b.targets, mesh, {Shard(0)}, Shape{8, 16}))
          .backward();
      optimizer.step();
      measured = memory_stats().live_bytes - before;
      host = memory_stats(Device::cpu(1)).live_bytes - host_before;
      if (g.rank() == 0) *params_out = model.num_parameters();
    }
    if (g.rank() == 0) {
      bytes = static_cast<double>(measured);
      if (host_out) *host_out = static_cast<double>(host);
    }
  });
  return bytes;
}

TEST(FsdpMemory, ResidentBytesMatchTheZeroFormulasWithinTenPercent) {
  for (int n : {2, 4}) {
    for (int s : {1, 2, 3}) {
      int64_t p = 0;
      const double measured = resident_bytes(n, s, &p);
      const double P = static_cast<double>(p), N = n;
      const double formula = s == 1 ? 4 * P + 12 * P / N : s == 2 ? 2 * P + 14 * P / N : 16 * P / N;
      // The issue asks for 10%; the buffers are exactly the formula plus padding and the batch.
      EXPECT_NEAR(measured / formula, 1.0, 0.02)
          << "stage " << s << " N=" << n << ": measured " << measured << " bytes, ZeRO formula " << formula
          << " (P = " << p << ")";
    }
  }
}

// ZeRO-Offload's arithmetic in BF16 training: the device keeps its shard in BF16
// (2P/N; stage 2 keeps the gathered BF16 parameters instead, 2P), the host the FP32
// master, AdamW's two moments and the BF16 gradient (14P/N).
TEST(FsdpMemory, OffloadSplitsTheStateBetweenDeviceAndHostAsZeroOffload) {
  for (int n : {2, 4}) {
    for (int s : {2, 3}) {
      int64_t p = 0;
      double host = 0;
      const double device = resident_bytes(n, s, &p, true, &host);
      const double P = static_cast<double>(p), N = n;
      const double device_formula = s == 2 ? 2 * P : 2 * P / N, host_formula = 14 * P / N;
      const std::string what = "stage " + std::to_string(s) + " N=" + std::to_string(n);
      EXPECT_NEAR(device / device_formula, 1.0, 0.02)
          << what << ": device " << device << " bytes, formula " << device_formula;
      EXPECT_NEAR(host / host_formula, 1.0, 0.02) << what << ": host " << host << " bytes, formula " << host_formula;
    }
  }
}

// The peak live bytes of one training step above those held before it (the third
// step: the prefetch order is recorded in the first), per rank, with every block a
// unit or (layer_units) each block's attention and MLP their own, and the bytes of
// the largest unit's gathered parameters in *unit_bytes.
int64_t step_peak_bytes(int world, const parallel::FSDPOptions& o, bool layer_units, int64_t* unit_bytes) {
  int64_t peak = 0;
  launch(world, [&](Group g) {
    DeviceMesh mesh(g, {world}, {"dp"});
    const models::GPTConfig c = memory_config(4);
    models::GPT model(mesh, c, 1);
    int64_t largest = 0;
    for (auto& [name, m] : model.named_modules()) {
      auto* block = dynamic_cast<nn::TransformerBlock*>(m);
      if (!block) continue;
      if (layer_units) {
        parallel::fully_shard(block->attention(), mesh, o);
        parallel::fully_shard(block->feed_forward(), mesh, o);
        largest = std::max({largest, block->attention().num_parameters(), block->feed_forward().num_parameters()});
      } else {
        largest = std::max(largest, block->num_parameters());
      }
      parallel::fully_shard(*m, mesh, o);
    }
    parallel::FSDPModule root = parallel::fully_shard(model, mesh, o);
    AdamW optimizer(model.parameters(), 1e-3);
    SyntheticLanguage data(c.vocab, c.block_size, 64, 1);
    DistributedSampler sampler(data.size(), 8, mesh.coordinate(0), world, 1);
    int64_t measured = 0;
    for (int step = 0; step < 3; ++step) {
      const TokenBatch b = data.get_batch(sampler.batch_at(step));
      const int64_t before = memory_stats().live_bytes;
      reset_peak_memory();
      model
          .loss(DistTensor::from_local(b.inputs, mesh, {Shard(0)}, Shape{8, 16}),
                DistTensor::from_local(b.targets, mesh, {Shard(0)}, Shape{8, 16}))
          .backward();
      optimizer.step();
      optimizer.zero_grad();
      measured = memory_stats().peak_bytes - before;
    }
    if (g.rank() == 0) {
      peak = measured;
      *unit_bytes = largest * 4;
    }
  });
  return peak;
}

TEST(FsdpMemory, GatheredWorkingSetFollowsPrefetchDepthAndUnitSize) {
  int64_t block = 0, layer = 0;
  const int64_t p0 = step_peak_bytes(2, {.stage = 3, .prefetch = 0}, false, &block);
  const int64_t p1 = step_peak_bytes(2, {.stage = 3, .prefetch = 1}, false, &block);
  const int64_t p2 = step_peak_bytes(2, {.stage = 3, .prefetch = 2}, false, &block);
  const int64_t l1 = step_peak_bytes(2, {.stage = 3, .prefetch = 1}, true, &layer);
  // Each unit prefetched holds one copy of its gathered parameters (the all-gather's
  // output; the unsharded buffer comes back when the gather is unpacked), not two.
  const double b = static_cast<double>(block);
  EXPECT_NEAR(static_cast<double>(p1 - p0), b, 0.01 * b) << "prefetch 1 against 0";
  EXPECT_NEAR(static_cast<double>(p2 - p1), b, 0.01 * b) << "prefetch 2 against 1";
  // Smaller units: the backward working set (the gathered unit, the next one's gather,
  // its gradients and their packed copy) shrinks with the largest unit.
  EXPECT_GE(p1 - l1, 2 * (block - layer)) << "layer units: peak " << l1 << " against " << p1 << " with block units";
}

// ---- state dicts -----------------------------------------------------------------------

TEST(Fsdp, StateDictFullAndShardedRoundTrip) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"dp"});
    models::GPT reference(mesh, odd_config(), 42);
    const auto expected = reference.state_dict();
    models::GPT model(mesh, odd_config(), 42);
    for (auto& [name, m] : model.named_modules()) {
      if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh);
    }
    parallel::FSDPModule root = parallel::fully_shard(model, mesh);
    const auto full = root.state_dict();
    const auto sharded = root.state_dict({.full = false});
    ASSERT_EQ(full.size(), expected.size());
    for (const auto& [name, t] : expected) {
      EXPECT_TRUE(allclose(full.at(name).to_local(), t, 0, 0)) << name;
      EXPECT_EQ(placements_to_string(sharded.at(name).placements()), "S(0)") << name;
      const Range rows = chunk_range(t.size(0), 2, g.rank());
      EXPECT_TRUE(allclose(sharded.at(name).to_local(), t.narrow(0, rows.offset, rows.length), 0, 0)) << name;
    }
    // A sharded dict loads into another sharded model, which then computes the same.
    models::GPT other(mesh, odd_config(), 7);
    parallel::FSDPModule other_root = parallel::fully_shard(other, mesh);
    other_root.load_state_dict(sharded);
    const DistTensor ids = distribute(Tensor::arange(12).reshape({4, 3}).to(DType::I64), mesh, {Shard(0)});
    NoGradGuard no_grad;
    EXPECT_TRUE(allclose(other(ids).full_tensor(), reference(ids).full_tensor(), 1e-5, 1e-6));
  });
}

// ---- bad input -------------------------------------------------------------------------

TEST(FsdpErrors, BadInputIsAClearErrorNamingTheModuleAndOption) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"dp"});
    models::GPT model(mesh, odd_config(), 1);
    nn::Module& block = model.submodule("blocks.0");
    EXPECT_THROW_MSG(parallel::fully_shard(block, mesh, {.stage = 4}), std::invalid_argument,
                     "module 'blocks.0' ('norm1.weight' and 7 more parameters): option stage must be 1, 2 or 3, got 4");
    EXPECT_THROW_MSG(parallel::fully_shard(block, mesh, {.shard_dim = "fsdp"}), std::invalid_argument,
                     "option shard_dim 'fsdp' is not a dim of mesh dp=2");
    EXPECT_THROW_MSG(parallel::fully_shard(block, mesh, {.stage = 2, .reshard_after_forward = true}),
                     std::invalid_argument, "option reshard_after_forward needs stage 3");
    EXPECT_THROW_MSG(parallel::fully_shard(block, mesh, {.prefetch = -1}), std::invalid_argument,
                     "option prefetch is a number of modules, expected 0 or more, got -1");
    EXPECT_THROW_MSG(parallel::fully_shard(block, mesh, {.stage = 1, .offload = parallel::OffloadPolicy{}}),
                     std::invalid_argument, "option offload needs stage 2 or 3");
    EXPECT_THROW_MSG(parallel::fully_shard(block, mesh, {.offload = parallel::OffloadPolicy{.host = Device::cpu()}}),
                     std::invalid_argument, "option offload's host is cpu, the device the parameters compute on");
    parallel::fully_shard(block, mesh);
    EXPECT_THROW_MSG(parallel::fully_shard(block, mesh), std::invalid_argument,
                     "fully_shard was already applied to this module");
    // A mesh of another world (a split of this one): the parameters live elsewhere.
    Group alone = g.split(g.rank());
    DeviceMesh other(alone, {1}, {"dp"});
    EXPECT_THROW_MSG(parallel::fully_shard(model.submodule("blocks.1"), other), std::invalid_argument,
                     "lives on mesh dp=2, the mesh given is dp=1 over another world");
    // Parameters on different meshes (the root holds the final norm and blocks.1).
    DeviceMesh two_d(g, {2, 1}, {"dp", "tp"});
    model.set_parameter("norm.weight", distribute(Tensor::ones({18}), two_d, {Replicate(), Replicate()}));
    EXPECT_THROW_MSG(parallel::fully_shard(model, mesh), std::invalid_argument,
                     "the parameters live on different meshes: 'tokens.weight' on dp=2, 'norm.weight' on dp=2,tp=1");
    EXPECT_THROW_MSG(parallel::fully_shard(model.submodule("blocks.1"), two_d), std::invalid_argument,
                     "parameter 'norm1.weight' lives on mesh dp=2, the mesh given is dp=2,tp=1");
    // The root over an already sharded child is fine; a child after its parent is not.
    models::GPT second(mesh, odd_config(), 1);
    parallel::fully_shard(second, mesh);
    EXPECT_THROW_MSG(parallel::fully_shard(second.submodule("blocks.0"), mesh), std::invalid_argument,
                     "expected Replicate on mesh dim 'dp'");
  });
}

}  // namespace

// ---- weight streaming (ZeRO-Inference) ---------------------------------------------------

// Token ids [2, block_size] and the largest difference of two tensors.
Tensor streaming_ids(const models::GPTConfig& c) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * c.block_size; ++i) ids.push_back((i * 7 + 3) % c.vocab);
  return Tensor::from_vector(ids, {2, c.block_size});
}

double max_abs_diff(const Tensor& a, const Tensor& b) { return amax(abs(sub(a, b))).item<double>(); }

std::vector<nn::Module*> blocks_of(nn::Module& model) {
  std::vector<nn::Module*> units;
  for (auto& [name, m] : model.named_modules()) {
    if (dynamic_cast<nn::TransformerBlock*>(m)) units.push_back(m);
  }
  return units;
}

// Inference with the blocks streamed from cpu:1 gives the logits of the same model kept
// on the device, bit for bit, and holds at most 1 + prefetch blocks' weights on the
// device beside the rest of the model and the activations.
TEST(WeightStreaming, SameLogitsWithOnePlusPrefetchBlocksOnTheDevice) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1}, {"dp"});
    const models::GPTConfig c = memory_config(4);
    const Tensor ids = streaming_ids(c);
    NoGradGuard no_grad;
    // The plain model: its logits, and the activations' peak above its weights.
    Tensor want;
    int64_t activations = 0;
    {
      models::GPT model(mesh, c, 3);
      const int64_t before = memory_stats().live_bytes;
      reset_peak_memory();
      want = model(distribute(ids, mesh, {Replicate()})).to_local().clone();
      activations = memory_stats().peak_bytes - before;
    }
    for (int prefetch : {0, 1, 2}) {
      const std::string what = "prefetch " + std::to_string(prefetch);
      models::GPT model(mesh, c, 3);
      const int64_t device_before = memory_stats().live_bytes, host_before = memory_stats(Device::cpu(1)).live_bytes;
      parallel::WeightStream stream = parallel::stream_weights(model, blocks_of(model), {.prefetch = prefetch});
      EXPECT_EQ(stream.host(), Device::cpu(1));
      EXPECT_EQ(stream.unit_names(), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "blocks.3"}));
      // The blocks' weights moved: off the device, onto the host, byte for byte.
      EXPECT_EQ(device_before - memory_stats().live_bytes, stream.host_bytes()) << what;
      EXPECT_EQ(memory_stats(Device::cpu(1)).live_bytes - host_before, stream.host_bytes()) << what;
      EXPECT_EQ(stream.host_bytes(), 4 * stream.largest_unit_bytes()) << what;
      for (int pass = 0; pass < 2; ++pass) {  // the first records the order prefetching follows
        const int64_t before = memory_stats().live_bytes;
        reset_peak_memory();
        const Tensor got = model(distribute(ids, mesh, {Replicate()})).to_local();
        const int64_t peak = memory_stats().peak_bytes - before;
        EXPECT_EQ(max_abs_diff(got, want), 0.0) << what << " pass " << pass;
        EXPECT_EQ(memory_stats().live_bytes - before, got.nbytes()) << what << ": every block freed after forward";
        const int64_t held = pass == 0 ? 1 : 1 + prefetch;
        EXPECT_LE(peak, activations + held * stream.largest_unit_bytes()) << what << " pass " << pass;
        EXPECT_GT(peak, activations + (held - 1) * stream.largest_unit_bytes()) << what << " pass " << pass;
      }
      EXPECT_EQ(stream.stats().fetches, 8) << what;
      EXPECT_EQ(stream.stats().prefetches, prefetch == 0 ? 0 : 3) << what;
      EXPECT_EQ(stream.stats().bytes_fetched, 2 * stream.host_bytes()) << what;
      // Back on the device for good: the same logits with gradients on, and no host copy.
      stream.detach();
      EXPECT_EQ(memory_stats(Device::cpu(1)).live_bytes, host_before) << what;
      GradModeGuard grad(true);
      EXPECT_EQ(max_abs_diff(model(distribute(ids, mesh, {Replicate()})).to_local(), want), 0.0) << what;
    }
  });
}

// Each rank streams its own shards: tensor parallel blocks give the unstreamed logits.
TEST(WeightStreaming, TensorParallelShardsStreamPerRank) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"tp"});
    const models::GPTConfig c = memory_config(4);
    const Tensor ids = streaming_ids(c);
    NoGradGuard no_grad;
    auto build = [&] {
      auto model = std::make_unique<models::GPT>(mesh, c, 3);
      parallel::parallelize_module(*model, mesh, models::gpt_tp_plan(c));
      return model;
    };
    const Tensor want = (*build())(distribute(ids, mesh, {Replicate()})).full_tensor();
    auto model = build();
    parallel::WeightStream stream = parallel::stream_weights(*model, blocks_of(*model));
    for (int pass = 0; pass < 2; ++pass) {
      EXPECT_EQ(max_abs_diff((*model)(distribute(ids, mesh, {Replicate()})).full_tensor(), want), 0.0);
    }
    EXPECT_EQ(stream.stats().prefetches, 3);
  });
}

TEST(WeightStreaming, BadInputIsAClearError) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"dp"});
    models::GPTConfig c = memory_config(4);
    c.tie_weights = true;
    models::GPT model(mesh, c, 1);
    nn::Module& block = model.submodule("blocks.0");
    EXPECT_THROW_MSG(parallel::stream_weights(model, {}), std::invalid_argument,
                     "[stream_weights] the root module: expected at least one unit");
    EXPECT_THROW_MSG(parallel::stream_weights(model, {&block}, {.prefetch = -1}), std::invalid_argument,
                     "option prefetch is a number of units, expected 0 or more, got -1");
    EXPECT_THROW_MSG(parallel::stream_weights(model, {&block, &block.submodule("attn")}), std::invalid_argument,
                     "module 'blocks.0.attn' is inside unit module 'blocks.0' (units are disjoint)");
    models::GPT other(mesh, c, 1);
    EXPECT_THROW_MSG(parallel::stream_weights(model, {&other.submodule("blocks.0")}), std::invalid_argument,
                     "module 'blocks.0' is not the root module or one of its sub-modules");
    EXPECT_THROW_MSG(parallel::stream_weights(model, {&block}, {.host = Device::cpu()}), std::invalid_argument,
                     "option host is cpu, the device the weights compute on");
    // The tied head reads the embedding's weight outside the embedding's forward.
    EXPECT_THROW_MSG(parallel::stream_weights(model, {&model.submodule("tokens")}), std::invalid_argument,
                     "module 'tokens' is also registered as 'embedding' in module 'head', outside the units");
    // Forward with gradients on would keep views of freed weights.
    parallel::WeightStream stream = parallel::stream_weights(model, {&block});
    const Tensor ids = streaming_ids(c);
    EXPECT_THROW_MSG(model(distribute(ids, mesh, {Replicate()})), std::invalid_argument,
                     "module 'blocks.0': forward with gradients enabled; streamed weights are freed after forward");
    models::GPT sharded(mesh, c, 1);
    parallel::fully_shard(sharded.submodule("blocks.0"), mesh);
    EXPECT_THROW_MSG(parallel::stream_weights(sharded, {&sharded.submodule("blocks.0")}), std::invalid_argument,
                     "is wrapped by fully_shard over dp; FSDP gathers its own parameters");
    EXPECT_THROW_MSG(parallel::WeightStream().stats(), std::invalid_argument, "this WeightStream handle is empty");
  });
}
