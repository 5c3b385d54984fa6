// DistTensor on the mpi backend (one process per rank): a subset of the
// redistribution and op suites, each checked against the full tensor. Run by CTest
// under mpirun -np 2 and 4.
#include <gtest/gtest.h>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

// Every pair of layouts from {S(0), S(1), R, P(sum)} on `mesh`.
void redistribute_all_pairs(const DeviceMesh& mesh, const Shape& shape) {
  std::vector<Placements> layouts{{}};
  for (int m = 0; m < mesh.ndim(); ++m) {
    std::vector<Placements> next;
    for (const Placements& prefix : layouts) {
      for (const Placement& p : {Shard(0), Shard(1), Replicate(), Partial()}) {
        Placements l = prefix;
        l.push_back(p);
        next.push_back(l);
      }
    }
    layouts = next;
  }
  const Tensor full = Tensor::randn(shape, 3);
  for (const Placements& from : layouts) {
    for (const Placements& to : layouts) {
      const DistTensor d = distribute(full, mesh, from).redistribute(to);
      ASSERT_EQ(d.to_local().shape(), local_shape(shape, mesh.shape(), to, mesh.coordinate()));
      ASSERT_TRUE(allclose(d.full_tensor(), full, 1e-5, 1e-5))
          << placements_to_string(from) << " -> " << placements_to_string(to);
    }
  }
}

}  // namespace

TEST(DistMpi, RedistributeOneDimMesh) {
  Group world = init("mpi");
  DeviceMesh mesh(world, {world.size()});
  redistribute_all_pairs(mesh, {2 * world.size() + 1, 3});  // uneven
  redistribute_all_pairs(mesh, {1, 2});                     // empty shards
}

TEST(DistMpi, RedistributeTwoDimMesh) {
  Group world = init("mpi");
  if (world.size() != 4) GTEST_SKIP() << "needs 4 processes for a 2x2 mesh, have " << world.size();
  DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
  redistribute_all_pairs(mesh, {5, 3});
}

TEST(DistMpi, TensorParallelMlpForwardAndBackward) {
  Group world = init("mpi");
  DeviceMesh mesh(world, {world.size()}, {"tp"});
  const Tensor xf = Tensor::randn({4, 6}, 1), w1f = Tensor::randn({6, 8}, 2), w2f = Tensor::randn({8, 6}, 3);
  DistTensor x = distribute(xf, mesh, {Replicate()});
  DistTensor w1 = distribute(w1f, mesh, {Shard(1)}).set_requires_grad();
  DistTensor w2 = distribute(w2f, mesh, {Shard(0)}).set_requires_grad();
  DistTensor y = matmul(gelu(matmul(x, w1)), w2);
  EXPECT_TRUE(y.placements()[0].is_partial());
  const Tensor expected = matmul(gelu(matmul(xf, w1f)), w2f);
  EXPECT_TRUE(allclose(y.full_tensor(), expected, 1e-4, 1e-5));
  sum(y).backward();
  EXPECT_TRUE(w1.grad().placements()[0].is_shard(1));
  EXPECT_TRUE(w2.grad().placements()[0].is_shard(0));
  // d(sum y)/d w2 = gelu(x w1)^T @ ones.
  const Tensor gw2 = matmul(gelu(matmul(xf, w1f)).t(), Tensor::ones({4, 6}));
  EXPECT_TRUE(allclose(w2.grad().full_tensor(), gw2, 1e-4, 1e-4));
}

// Megatron tensor parallelism (and DP x TP on 4 processes) trains a GPT to the same
// losses and parameters as one rank (threads backend, in this process).
std::pair<std::vector<double>, std::map<std::string, Tensor>> train_gpt_steps(const DeviceMesh& mesh, bool sp,
                                                                              bool plan = false) {
  models::GPTConfig config;
  config.vocab = 16;
  config.block_size = 8;
  config.layers = 2;
  config.heads = 4;
  config.dim = 16;
  config.bias = false;
  models::GPT model(mesh, config, 42);
  const bool two_d = mesh.ndim() == 2;
  if (mesh["tp"].size() > 1) {
    parallel::parallelize_module(model, mesh["tp"], models::gpt_tp_plan(config, {.sequence_parallel = sp}));
  }
  std::optional<parallel::DistributedDataParallel> ddp;
  if (two_d) ddp.emplace(model, parallel::DDPOptions{.dp_dim = "dp"});
  AdamW optimizer(model.parameters(), 1e-2);
  SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
  const int64_t dp = two_d ? mesh.size(0) : 1;
  DistributedSampler sampler(data.size(), 8, two_d ? mesh.coordinate(0) : 0, dp, 5);
  const Placements layout = two_d ? Placements{Shard(0), Replicate()} : Placements{Replicate()};
  std::vector<double> losses;
  StepPlanner planner;
  for (int step = 0; step < 5; ++step) {
    const TokenBatch batch = data.get_batch(sampler.batch_at(step));
    const DistTensor ids = DistTensor::from_local(batch.inputs, mesh, layout, Shape{8, 8});
    const DistTensor targets = DistTensor::from_local(batch.targets, mesh, layout, Shape{8, 8});
    DistTensor loss;
    {
      std::optional<PlannedStep> scope;
      if (plan) scope.emplace(planner);
      loss = model.loss(ids, targets);
      loss.backward();
      if (ddp) ddp->wait_for_gradients();
      optimizer.step();
      optimizer.zero_grad();
    }
    if (plan && step > 0)
      EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Replayed) << planner.last_report().to_string();
    losses.push_back(loss.full_tensor().item<double>());
  }
  return {losses, model.state_dict()};
}

// The hand-placed MLP (no styles, no redistribute) under a whole-step plan: Megatron's
// one all-reduce per step in every process, the values of one rank.
TEST(DistMpi, PlannedHandPlacedMlpRunsMegatronsAllReduce) {
  Group world = init("mpi");
  // Weights larger than the activations, as in real models (with smaller weights a
  // plan gathers them instead, which costs less).
  const Tensor xf = Tensor::randn({16, 8}, 1), tf = Tensor::randn({16, 8}, 2), w1f = Tensor::randn({64, 8}, 3),
               w2f = Tensor::randn({8, 64}, 4), b2f = Tensor::randn({8}, 5);
  auto train = [&](const DeviceMesh& mesh, bool plan) {
    const bool split = mesh.size() > 1;
    DistTensor w1 = distribute(w1f, mesh, {split ? Placement(Shard(0)) : Placement(Replicate())}).set_requires_grad();
    DistTensor w2 = distribute(w2f, mesh, {split ? Placement(Shard(1)) : Placement(Replicate())}).set_requires_grad();
    DistTensor b2 = distribute(b2f, mesh, {Replicate()}).set_requires_grad();
    const DistTensor x = distribute(xf, mesh, {Replicate()}), t = distribute(tf, mesh, {Replicate()});
    AdamW optimizer({w1, w2, b2}, {.lr = 1e-2});
    StepPlanner planner;
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
      CommDebugMode comm;
      DistTensor loss;
      {
        std::optional<PlannedStep> scope;
        if (plan) scope.emplace(planner);
        loss = mean(square(linear(gelu(linear(x, w1)), w2, b2) - t));
        loss.backward();
        optimizer.step();
        optimizer.zero_grad();
      }
      if (plan && step > 0) {
        EXPECT_EQ(comm.count("all_reduce"), 1) << comm.to_string();
        EXPECT_EQ(comm.total_count(), 1) << comm.to_string();
      }
      losses.push_back(loss.full_tensor().item<double>());
    }
    return std::make_pair(losses, w2.full_tensor());
  };
  std::pair<std::vector<double>, Tensor> reference;
  launch(1, [&](Group one) { reference = train(DeviceMesh(one, {1}), false); });
  const auto [losses, w2] = train(DeviceMesh(world, {world.size()}, {"tp"}), true);
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], reference.first[i], 1e-5 * (1 + reference.first[i]));
  EXPECT_TRUE(allclose(w2, reference.second, 1e-4, 1e-5));
}

TEST(DistMpi, GptTensorParallelMatchesOneRank) {
  Group world = init("mpi");
  std::pair<std::vector<double>, std::map<std::string, Tensor>> reference;
  launch(1, [&](Group one) { reference = train_gpt_steps(DeviceMesh(one, {1}, {"tp"}), false); });
  std::vector<DeviceMesh> meshes{DeviceMesh(world, {world.size()}, {"tp"})};
  if (world.size() == 4) meshes.emplace_back(world, Shape{2, 2}, std::vector<std::string>{"dp", "tp"});
  for (const DeviceMesh& mesh : meshes) {
    for (auto [sp, plan] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
      // plan: the same steps under a whole-step plan (dtensor/step_plan.h).
      const auto [losses, params] = train_gpt_steps(mesh, sp, plan);
      for (size_t i = 0; i < losses.size(); ++i) {
        EXPECT_NEAR(losses[i], reference.first[i], 1e-5 * reference.first[i]) << mesh.to_string() << " step " << i;
      }
      for (const auto& [name, t] : reference.second) {
        EXPECT_TRUE(allclose(params.at(name), t, 1e-5, 1e-6)) << mesh.to_string() << " " << name;
      }
    }
  }
}

namespace {

// `steps` SGD steps of a small GPT with an odd vocabulary (uneven shards) on `mesh`
// (FSDP over its "dp" dim, HSDP with a "replicate" dim; none: one rank). Returns the
// losses and the full parameters.
std::pair<std::vector<double>, std::map<std::string, Tensor>> train_fsdp_gpt_steps(
    const DeviceMesh& mesh, std::optional<parallel::FSDPOptions> fsdp, int steps) {
  models::GPTConfig c;
  c.vocab = 17;
  c.block_size = 6;
  c.layers = 2;
  c.heads = 2;
  c.dim = 10;
  c.bias = false;
  models::GPT model(mesh, c, 3);
  std::optional<parallel::FSDPModule> root;
  if (fsdp) {
    for (auto& [name, m] : model.named_modules()) {
      if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, *fsdp);
    }
    root = parallel::fully_shard(model, mesh, *fsdp);
  }
  SGD optimizer(model.parameters(), 0.5, 0.9);
  parallel::Trainer trainer(optimizer, {.grad_accum = 2, .clip_grad_norm = 1.0, .sync = root ? &*root : nullptr});
  SyntheticLanguage data(c.vocab, c.block_size, 64, 1);
  DistributedSampler sampler(data.size(), 8, mesh.linear_index(), mesh.size(), 2, true, 2);
  const Placements batch(mesh.ndim(), Shard(0));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    losses.push_back(trainer.step(step, [&](int64_t micro) {
      const TokenBatch b = data.get_batch(sampler.micro_batch_at(step, micro));
      return model.loss(DistTensor::from_local(b.inputs, mesh, batch, Shape{4, c.block_size}),
                        DistTensor::from_local(b.targets, mesh, batch, Shape{4, c.block_size}));
    }).stats.loss);
  }
  return {losses, model.state_dict()};
}

}  // namespace

TEST(DistMpi, FsdpStagesAndHsdpMatchOneRank) {
  Group world = init("mpi");
  std::pair<std::vector<double>, std::map<std::string, Tensor>> reference;
  launch(1, [&](Group one) { reference = train_fsdp_gpt_steps(DeviceMesh(one, {1}, {"dp"}), std::nullopt, 4); });
  std::vector<std::pair<std::string, DeviceMesh>> meshes{{"dp", DeviceMesh(world, {world.size()}, {"dp"})}};
  if (world.size() == 4) meshes.emplace_back("hsdp", DeviceMesh(world, {2, 2}, {"replicate", "dp"}));
  for (const auto& [what, mesh] : meshes) {
    for (int stage : {1, 2, 3}) {
      parallel::FSDPOptions options{.stage = stage, .replicate_dim = what == "hsdp" ? "replicate" : ""};
      const auto [losses, params] = train_fsdp_gpt_steps(mesh, options, 4);
      for (size_t i = 0; i < losses.size(); ++i) {
        EXPECT_NEAR(losses[i], reference.first[i], 1e-5 * reference.first[i]) << what << " stage " << stage;
      }
      for (const auto& [name, t] : reference.second) {
        EXPECT_TRUE(allclose(params.at(name), t, 1e-5, 1e-6)) << what << " stage " << stage << " " << name;
      }
    }
  }
}

// Across meshes between processes: the first half of the ranks hands a tensor to
// the second half (a pipeline stage's activations), values and gradient; and the
// whole world to itself in another shape.
TEST(DistMpi, RedistributeAcrossMeshes) {
  Group world = init("mpi");
  const int half = world.size() / 2;
  std::vector<int> first, second;
  for (int r = 0; r < world.size(); ++r) (r < half ? first : second).push_back(r);
  const DeviceMesh front = DeviceMesh::from_ranks(world, first, {half}, {"front"});
  const DeviceMesh back = DeviceMesh::from_ranks(world, second, {static_cast<int64_t>(second.size())}, {"back"});
  const Tensor full = Tensor::randn({5, 3}, 7), weight = Tensor::randn({5, 3}, 8);
  for (const Placement& from : {Shard(0), Replicate()}) {
    for (const Placement& to : {Shard(1), Replicate(), Partial()}) {
      DistTensor x = distribute(full, front, {from});
      x.set_requires_grad();
      const DistTensor y = x.redistribute(back, {to});
      if (back.is_member()) {
        EXPECT_TRUE(allclose(y.full_tensor(), full, 1e-6, 1e-6)) << from.to_string() << " -> " << to.to_string();
        sum(mul(y, distribute(weight, back, {Replicate()}))).backward();
      } else {
        y.backward();
      }
      if (front.is_member()) EXPECT_TRUE(allclose(x.grad().full_tensor(), weight, 1e-6, 1e-6));
    }
  }
  if (world.size() == 4) {
    const DeviceMesh line(world, {4}), square(world, {2, 2});
    const DistTensor u = distribute(full, line, {Shard(0)}).redistribute(square, {Shard(1), Shard(0)});
    EXPECT_TRUE(allclose(u.full_tensor(), full, 0, 0));
  }
}

// local_map and a user op with its own sharding rule, on processes.
TEST(DistMpi, LocalMapAndCustomOp) {
  Group world = init("mpi");
  DeviceMesh mesh(world, {world.size()});
  const Tensor xf = add(Tensor::rand({7, 3}, 1), 0.5);
  DistTensor x = distribute(xf, mesh, {Shard(1)});
  x.set_requires_grad();
  const std::vector<DistTensor> out = local_map(
      [](const std::vector<DistTensor>& p) { return std::vector<DistTensor>{div(p[0], sum(p[0], {1}, true))}; },
      {{Shard(0)}}, {{Shard(0)}}, {x});
  EXPECT_TRUE(allclose(out[0].full_tensor(), div(xf, sum(xf, {1}, true)), 1e-6, 1e-6));
  sum(out[0]).backward();
  EXPECT_EQ(x.grad().shape(), (Shape{7, 3}));
  static const CustomOp scaled{"mpi.scaled", ShardingRule::parse("ab->ab"),
                               [](const std::vector<Tensor>& l) { return mul(l[0], 3.0); }};
  EXPECT_TRUE(allclose(scaled({x}).full_tensor(), mul(xf, 3.0), 1e-6, 1e-6));
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  Group world = init("mpi");
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world.rank() != 0) delete listeners.Release(listeners.default_result_printer());
  const int failed = RUN_ALL_TESTS();
  // Every process exits with the same status: failed if any rank failed.
  Tensor any_failed = Tensor::full({1}, failed != 0 ? 1.0 : 0.0);
  all_reduce_(world, any_failed, ReduceOp::Max);
  return any_failed.item<float>() > 0 ? 1 : 0;
}
