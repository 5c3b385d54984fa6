// A user's own model (a residual MLP with LayerNorm, not GPT) under the parallel
// modules and their orders: tensor parallel then FSDP or DDP trains as one rank; the
// orders that cannot work (a data-parallel wrapper before tensor parallelism, DDP
// before FSDP, an optimizer built before its parameters were re-laid out) throw
// errors naming the module path and the right order, where before they trained
// silently wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "dtensor/dtensor.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

namespace dtensor {
namespace {

// x + fc2(gelu(fc1(norm(x)))).
class ResidualBlock : public nn::Module {
 public:
  ResidualBlock(const DeviceMesh& mesh, int64_t dim, int64_t hidden, uint64_t seed) {
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(mesh, dim));
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(mesh, dim, hidden, true, nn::derive_seed(seed, 0), 0.3));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(mesh, hidden, dim, true, nn::derive_seed(seed, 1), 0.3));
  }
  DistTensor forward(const DistTensor& x) override { return x + (*fc2_)(gelu((*fc1_)((*norm_)(x)))); }

 private:
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// in -> dim, two residual blocks, norm, dim -> out.
class ResidualMLP : public nn::Module {
 public:
  ResidualMLP(const DeviceMesh& mesh, uint64_t seed) {
    in_ = register_module("input", std::make_shared<nn::Linear>(mesh, 6, 8, true, nn::derive_seed(seed, 0), 0.3));
    for (int i = 0; i < 2; ++i) {
      blocks_.push_back(register_module("blocks." + std::to_string(i),
                                        std::make_shared<ResidualBlock>(mesh, 8, 12, nn::derive_seed(seed, 10 + i))));
    }
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(mesh, 8));
    out_ = register_module("output", std::make_shared<nn::Linear>(mesh, 8, 3, true, nn::derive_seed(seed, 1), 0.3));
  }
  DistTensor forward(const DistTensor& x) override {
    DistTensor h = (*in_)(x);
    for (const auto& b : blocks_) h = (*b)(h);
    return (*out_)((*norm_)(h));
  }

 private:
  std::shared_ptr<nn::Linear> in_, out_;
  std::vector<std::shared_ptr<ResidualBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> norm_;
};

// Megatron's pairing inside each block: fc1 column parallel, fc2 row parallel.
parallel::ParallelizePlan block_plan() {
  return {{"blocks.*.fc1", parallel::ColwiseParallel{}}, {"blocks.*.fc2", parallel::RowwiseParallel{}}};
}

// The wrappers a run applies, in order, to the model on a (dp, tp) mesh; returns the
// gradient sync (or null) and keeps what must outlive training in `keep`.
using Layout = std::function<parallel::GradientSync*(ResidualMLP&, const DeviceMesh&, std::shared_ptr<void>& keep)>;

// Mean squared error of the model on 8 fixed rows per step, the rows sharded over dp.
dtensor::testing::TrainingRun train(int world, Shape mesh_shape, const Layout& layout, int steps = 4) {
  dtensor::testing::TrainingRun result;
  launch(world, [&](Group g) {
    DeviceMesh mesh(g, mesh_shape, {"dp", "tp"});
    ResidualMLP model(mesh, 7);
    std::shared_ptr<void> keep;
    parallel::GradientSync* sync = layout(model, mesh, keep);
    SGD optimizer(model.parameters(), 0.2, 0.9);
    parallel::Trainer trainer(optimizer, {.sync = sync});
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      const Tensor x = Tensor::randn({8, 6}, 100 + static_cast<uint64_t>(step));
      const Tensor y = Tensor::randn({8, 3}, 200 + static_cast<uint64_t>(step));
      const Placements rows{Shard(0), Replicate()};
      losses.push_back(trainer
                           .step(step,
                                 [&](int64_t) {
                                   const DistTensor diff = model(distribute(x, mesh, rows)) - distribute(y, mesh, rows);
                                   return mean(diff * diff);
                                 })
                           .stats.loss);
    }
    const auto params = model.state_dict();
    if (g.rank() == 0) result = {losses, params};
  });
  return result;
}

parallel::GradientSync* nothing(ResidualMLP&, const DeviceMesh&, std::shared_ptr<void>&) { return nullptr; }

parallel::GradientSync* tensor_parallel(ResidualMLP& m, const DeviceMesh& mesh, std::shared_ptr<void>&) {
  parallel::parallelize_module(m, mesh["tp"], block_plan());
  return nullptr;
}

parallel::GradientSync* fsdp(ResidualMLP& m, const DeviceMesh& mesh, std::shared_ptr<void>& keep) {
  for (const char* block : {"blocks.0", "blocks.1"}) parallel::fully_shard(m.submodule(block), mesh);
  auto root = std::make_shared<parallel::FSDPModule>(parallel::fully_shard(m, mesh));
  keep = root;
  return root.get();
}

parallel::GradientSync* ddp(ResidualMLP& m, const DeviceMesh&, std::shared_ptr<void>& keep) {
  auto d = std::make_shared<parallel::DistributedDataParallel>(m, parallel::DDPOptions{.dp_dim = "dp"});
  keep = d;
  return d.get();
}

const dtensor::testing::TrainingRun& one_rank() {
  static const dtensor::testing::TrainingRun run = train(1, {1, 1}, nothing);
  return run;
}

TEST(Composition, OwnModelTrainsAsOneRankUnderEveryModuleAndGoodOrder) {
  ASSERT_LT(one_rank().losses.back(), one_rank().losses.front());
  dtensor::testing::expect_equivalent(train(2, {1, 2}, tensor_parallel), one_rank(), "TP");
  dtensor::testing::expect_equivalent(train(2, {2, 1}, fsdp), one_rank(), "FSDP");
  dtensor::testing::expect_equivalent(train(2, {2, 1}, ddp), one_rank(), "DDP");
  dtensor::testing::expect_equivalent(train(4, {2, 2},
                                            [](ResidualMLP& m, const DeviceMesh& mesh, std::shared_ptr<void>& keep) {
                                              tensor_parallel(m, mesh, keep);
                                              return fsdp(m, mesh, keep);
                                            }),
                                      one_rank(), "TP then FSDP");
  dtensor::testing::expect_equivalent(train(4, {2, 2},
                                            [](ResidualMLP& m, const DeviceMesh& mesh, std::shared_ptr<void>& keep) {
                                              tensor_parallel(m, mesh, keep);
                                              return ddp(m, mesh, keep);
                                            }),
                                      one_rank(), "TP then DDP");
}

// Each wrong order on a 2x2 mesh, caught where it is made.
TEST(Composition, OrdersThatCannotWorkAreClearErrors) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2}, {"dp", "tp"});
    std::shared_ptr<void> keep;
    {
      ResidualMLP m(mesh, 7);
      fsdp(m, mesh, keep);
      EXPECT_THROW_MSG(tensor_parallel(m, mesh, keep), std::invalid_argument,
                       "[parallelize_module] the root module is already wrapped by fully_shard over dp; apply "
                       "parallelize_module (tensor parallel) first");
      EXPECT_THROW_MSG(
          parallel::parallelize_module(m.submodule("blocks.1"), mesh["tp"], {{"fc1", parallel::ColwiseParallel{}}}),
          std::invalid_argument, "module 'blocks.1' is already wrapped by fully_shard over dp");
    }
    {
      ResidualMLP m(mesh, 7);
      ddp(m, mesh, keep);
      EXPECT_THROW_MSG(tensor_parallel(m, mesh, keep), std::invalid_argument,
                       "the root module is already wrapped by DistributedDataParallel over dp");
      EXPECT_THROW_MSG(parallel::fully_shard(m.submodule("blocks.0"), mesh), std::invalid_argument,
                       "the root module is already wrapped by DistributedDataParallel over dp; FSDP synchronises");
    }
    {
      ResidualMLP m(mesh, 7);
      fsdp(m, mesh, keep);
      EXPECT_THROW_MSG(parallel::DistributedDataParallel(m, {.dp_dim = "dp"}), std::invalid_argument,
                       "is already wrapped by fully_shard over dp; FSDP synchronises its gradients over that dim");
    }
  });
}

// An optimizer built before parallelize_module or fully_shard holds tensors no
// forward reads any more: its first step fails naming the parameter's path.
TEST(Composition, OptimizerBuiltBeforeTheLayoutChangedFailsAtItsFirstStep) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2}, {"dp", "tp"});
    for (bool sharded : {false, true}) {
      ResidualMLP m(mesh, 7);
      SGD optimizer(m.parameters(), 0.1);
      std::shared_ptr<void> keep;
      if (sharded) {
        fsdp(m, mesh, keep);
      } else {
        tensor_parallel(m, mesh, keep);
      }
      const DistTensor x = distribute(Tensor::randn({4, 6}, 1), mesh, {Shard(0), Replicate()});
      sum(m(x)).backward();
      EXPECT_THROW_MSG(optimizer.step(), std::invalid_argument,
                       sharded ? "'input.weight' was sharded by fully_shard over dp, so no forward reads this tensor"
                               : "'blocks.0.fc1.weight' was re-laid out by parallelize_module over tp");
      // Built afterwards from model.parameters(), it trains.
      SGD fresh(m.parameters(), 0.1);
      EXPECT_NO_THROW(fresh.step());
    }
  });
}

// The same model as an nn::Sequential (the same names and seeds, so the same values).
std::shared_ptr<nn::Sequential> sequential_mlp(const DeviceMesh& mesh) {
  auto model = std::make_shared<nn::Sequential>();
  model->append("input", std::make_shared<nn::Linear>(mesh, 6, 8, true, nn::derive_seed(7, 0), 0.3));
  for (int i = 0; i < 2; ++i) {
    model->append("blocks." + std::to_string(i),
                  std::make_shared<ResidualBlock>(mesh, 8, 12, nn::derive_seed(7, 10 + i)));
  }
  model->append("norm", std::make_shared<nn::LayerNorm>(mesh, 8));
  model->append("output", std::make_shared<nn::Linear>(mesh, 8, 3, true, nn::derive_seed(7, 1), 0.3));
  return model;
}

// Two pipeline ranks (times `dp` data-parallel ranks with DDP per stage), 2 micro-batches of 4 rows.
dtensor::testing::TrainingRun train_pipeline(parallel::ScheduleKind kind, std::vector<std::string> split_before,
                                             int virtual_stages = 1, int dp = 1) {
  dtensor::testing::TrainingRun result;
  launch(2 * dp, [&](Group g) {
    DeviceMesh mesh(g, {2, dp}, {"pp", "dp"});
    parallel::PipelineMesh pp(mesh);
    parallel::SequentialPipeline split(
        pp, sequential_mlp(pp.stage_mesh()),
        {.schedule = kind, .micro_batches = 2, .virtual_stages = virtual_stages, .split_before = split_before});
    std::vector<std::unique_ptr<parallel::DistributedDataParallel>> ddps;
    std::vector<parallel::GradientSync*> syncs;
    for (const auto& stage : split.stages()) {
      if (dp == 1) break;
      ddps.push_back(std::make_unique<parallel::DistributedDataParallel>(*stage, parallel::DDPOptions{.dp_dim = "dp"}));
      syncs.push_back(ddps.back().get());
    }
    const DeviceMesh& stage_mesh = pp.stage_mesh();
    auto rows = [&](uint64_t seed, int64_t width, int64_t micro) {
      return distribute(Tensor::randn({8, width}, seed).narrow(0, 4 * micro, 4).contiguous(), stage_mesh,
                        Placements(static_cast<size_t>(stage_mesh.ndim()), Shard(0)));
    };
    parallel::PipelineData data;
    data.inputs = [&](int64_t step, int64_t micro) { return rows(100 + static_cast<uint64_t>(step), 6, micro); };
    data.loss = [&](int64_t step, int64_t micro, const DistTensor& out) {
      const DistTensor diff = out - rows(200 + static_cast<uint64_t>(step), 3, micro);
      return mean(diff * diff);
    };
    std::unique_ptr<parallel::Pipeline> pipe = split.make_pipeline(syncs, data);
    SGD optimizer(split.parameters(), 0.2, 0.9);
    parallel::Trainer trainer(optimizer);
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) losses.push_back(trainer.step(step, *pipe).stats.loss);
    // Each pipeline rank reports its stages' parameters (from dp coordinate 0).
    std::map<std::string, Tensor> params;
    for (const auto& stage : split.stages()) {
      for (auto& [name, t] : stage->state_dict()) params[name] = t;
    }
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (mesh.coordinate(1) == 0) {
      if (result.losses.empty()) result.losses = losses;
      for (auto& [name, t] : params) result.params[name] = t;
    }
  });
  return result;
}

TEST(Composition, OwnSequentialModelPipelinesAsOneRankUnderEverySchedule) {
  using parallel::ScheduleKind;
  dtensor::testing::expect_equivalent(train_pipeline(ScheduleKind::GPipe, {"blocks.1"}), one_rank(), "GPipe");
  dtensor::testing::expect_equivalent(train_pipeline(ScheduleKind::OneFOneB, {"blocks.1"}), one_rank(), "1F1B");
  dtensor::testing::expect_equivalent(train_pipeline(ScheduleKind::ZeroBubble, {"norm"}), one_rank(), "zero bubble");
  dtensor::testing::expect_equivalent(
      train_pipeline(ScheduleKind::Interleaved1F1B, {"blocks.0", "blocks.1", "norm"}, 2), one_rank(),
      "interleaved, 4 stages on 2 ranks");
  dtensor::testing::expect_equivalent(train_pipeline(ScheduleKind::OneFOneB, {}), one_rank(),
                                      "1F1B, split balanced by parameters");
  dtensor::testing::expect_equivalent(train_pipeline(ScheduleKind::OneFOneB, {"blocks.1"}, 1, 2), one_rank(),
                                      "1F1B x DDP over dp=2");
}

// A head that reuses the input layer's weight (a tied embedding and head): x @ W maps
// the width back to the input's, under another name in the last stage ("head.tied.weight").
class TiedHead : public nn::Module {
 public:
  explicit TiedHead(std::shared_ptr<nn::Linear> input) : input_(register_module("tied", std::move(input))) {}
  DistTensor forward(const DistTensor& x) override { return matmul(x, input_->weight()); }

 private:
  std::shared_ptr<nn::Linear> input_;
};

std::shared_ptr<nn::Sequential> tied_mlp(const DeviceMesh& mesh) {
  auto model = std::make_shared<nn::Sequential>();
  auto input = model->append("input", std::make_shared<nn::Linear>(mesh, 6, 8, true, nn::derive_seed(7, 0), 0.3));
  model->append("blocks.0", std::make_shared<ResidualBlock>(mesh, 8, 12, nn::derive_seed(7, 10)));
  model->append("norm", std::make_shared<nn::LayerNorm>(mesh, 8));
  model->append("head", std::make_shared<TiedHead>(input));
  return model;
}

// The tied model on one rank and as two pipeline stages: the weight's two gradients
// are summed across the ranks, so the copies stay equal and equal one rank's.
TEST(Composition, ParameterSharedByTwoStagesKeepsItsNameAndStaysTied) {
  auto run = [](int world) {
    std::vector<double> losses;
    std::map<std::string, Tensor> params;
    std::mutex mu;
    launch(world, [&](Group g) {
      DeviceMesh mesh(g, {world}, {"pp"});
      parallel::PipelineMesh pp(mesh);
      const DeviceMesh& stage_mesh = pp.stage_mesh();
      auto rows = [&](uint64_t seed, int64_t micro) {
        return distribute(Tensor::randn({8, 6}, seed).narrow(0, 4 * micro, 4).contiguous(), stage_mesh, {Replicate()});
      };
      std::shared_ptr<nn::Sequential> model = tied_mlp(stage_mesh);
      parallel::SequentialPipeline split(
          pp, model,
          {.schedule = parallel::ScheduleKind::OneFOneB,
           .micro_batches = 2,
           .split_before = world == 1 ? std::vector<std::string>{} : std::vector<std::string>{"norm"}});
      if (world == 2) {
        // The last stage holds the head's module under the model's name for it too.
        EXPECT_EQ(split.tied().size(), 2u) << "the weight and the (unused) bias";
        bool weight = false;
        for (const parallel::TiedParameter& t : split.tied()) {
          weight |= t.name == "input.weight" && t.names.empty() && t.stages == std::vector<int>{0, 1};
        }
        EXPECT_TRUE(weight);
        const auto names = split.named_parameters();
        const bool holds_input =
            std::any_of(names.begin(), names.end(), [](const auto& n) { return n.first == "input.weight"; });
        EXPECT_TRUE(holds_input);
        if (pp.coordinate() == 1) {
          EXPECT_EQ(split.stages()[0]->named_parameters().front().first, "input.weight") << "shared first";
          EXPECT_EQ(split.stages()[0]->entries().front().first, "norm") << "not an entry: forward does not run it";
        }
      }
      parallel::PipelineData data;
      data.inputs = [&](int64_t step, int64_t micro) { return rows(100 + static_cast<uint64_t>(step), micro); };
      data.loss = [&](int64_t step, int64_t micro, const DistTensor& out) {
        const DistTensor diff = out - rows(200 + static_cast<uint64_t>(step), micro);
        return mean(diff * diff);
      };
      auto pipe = split.make_pipeline({}, data);
      SGD optimizer(split.parameters(), 0.2, 0.9);
      parallel::Trainer trainer(optimizer, {.clip_grad_norm = 5.0});
      std::vector<double> mine;
      for (int step = 0; step < 4; ++step) mine.push_back(trainer.step(step, *pipe).stats.loss);
      std::lock_guard<std::mutex> lock(mu);
      losses = mine;
      for (auto& [name, t] : split.state_dict()) params[name + (pp.coordinate() == 1 ? "@last" : "")] = t;
    });
    return std::make_pair(losses, params);
  };
  const auto [one_losses, one_params] = run(1);
  const auto [losses, params] = run(2);
  ASSERT_LT(one_losses.back(), one_losses.front());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], one_losses[i], 1e-5 * std::fabs(one_losses[i]));
  EXPECT_TRUE(allclose(params.at("input.weight"), one_params.at("input.weight"), 1e-5, 1e-6));
  EXPECT_TRUE(allclose(params.at("input.weight@last"), one_params.at("input.weight"), 1e-5, 1e-6))
      << "the last stage's copy";
  EXPECT_TRUE(allclose(params.at("blocks.0.fc1.weight"), one_params.at("blocks.0.fc1.weight"), 1e-5, 1e-6));
  EXPECT_EQ(one_params.count("head.tied.weight"), 0u) << "the whole model lists a shared module once";
}

TEST(Composition, SequentialSplitErrorsNameTheChildren) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"pp"});
    parallel::PipelineMesh pp(mesh);
    EXPECT_THROW_MSG(parallel::SequentialPipeline(pp, sequential_mlp(pp.stage_mesh()), {.split_before = {"blocks.7"}}),
                     std::invalid_argument,
                     "no child named 'blocks.7' (children: input, blocks.0, blocks.1, norm, output)");
    EXPECT_THROW_MSG(
        parallel::SequentialPipeline(pp, sequential_mlp(pp.stage_mesh()), {.split_before = {"blocks.0", "norm"}}),
        std::invalid_argument, "2 stages need 1 split points, got 2");
    nn::Sequential seq;
    seq.append("a", std::make_shared<nn::LayerNorm>(pp.stage_mesh(), 4));
    EXPECT_THROW_MSG(seq.append("a", std::make_shared<nn::LayerNorm>(pp.stage_mesh(), 4)), std::invalid_argument,
                     "a child named 'a' exists already");
  });
}

TEST(Composition, CommDebugModeNamesGroupsByMeshDim) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {2, 2}, {"dp", "tp"});
    EXPECT_EQ(mesh.group(0).name(), "dp");
    EXPECT_EQ(mesh.group(1).name(), "tp");
    ResidualMLP m(mesh, 7);
    std::shared_ptr<void> keep;
    tensor_parallel(m, mesh, keep);
    CommDebugMode comm;
    m(distribute(Tensor::randn({4, 6}, 1), mesh, {Shard(0), Replicate()}));
    // One all-reduce per row-parallel fc2 in forward, on the tp dim.
    EXPECT_EQ(comm.count("all_reduce", mesh.group(1)), 2) << comm.to_string();
    EXPECT_NE(comm.to_string().find("all_reduce tp: 2 calls"), std::string::npos) << comm.to_string();
  });
}

TEST(Composition, ModuleErrorsNameThePathOfTheInnermostModule) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1, 1}, {"dp", "tp"});
    ResidualMLP m(mesh, 7);
    EXPECT_EQ(m.submodule("blocks.1.fc2").path(), "blocks.1.fc2");
    EXPECT_EQ(m.path(), "");
    const DistTensor wrong = distribute(Tensor::randn({4, 5}, 1), mesh, {Replicate(), Replicate()});
    EXPECT_THROW_MSG(m(wrong), std::invalid_argument, "(in module 'input')");
    try {
      m(wrong);
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("(in module", what.find("(in module") + 1), std::string::npos) << "added once: " << what;
    }
  });
}

TEST(Composition, DistTensorArithmeticWithPlainTensorsBothWays) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    const Tensor a = Tensor::randn({4, 3}, 1), b = Tensor::rand({4, 3}, 2) + 1.0;
    const DistTensor d = distribute(a, mesh, {Shard(0)});
    EXPECT_THROW_MSG(d - b, std::invalid_argument, "[sub] expected DistTensor operands, got a plain Tensor");
    // Inside the scope a plain Tensor stands for the same value on every rank, as with + and *.
    ImplicitReplication replicate;
    EXPECT_TRUE(allclose((d - b).full_tensor(), a - b));
    EXPECT_TRUE(allclose((d / b).full_tensor(), a / b));
    EXPECT_TRUE(allclose((b - d).full_tensor(), b - a));
    EXPECT_TRUE(allclose((b / (d * d + 1.0)).full_tensor(), b / (a * a + 1.0)));
    EXPECT_TRUE(allclose((b + d).full_tensor(), b + a));
    EXPECT_TRUE(allclose((b * d).full_tensor(), b * a));
    EXPECT_TRUE(allclose((2.0 - d).full_tensor(), a * -1.0 + 2.0));
    EXPECT_TRUE(allclose((3.0 * d + 1.0).full_tensor(), a * 3.0 + 1.0));
  });
}

}  // namespace
}  // namespace dtensor
