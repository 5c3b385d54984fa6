// Whole-step planning (dtensor/step_plan.h) held to its promises: a hand-placed model
// with no redistribute in its code communicates as Megatron does; on random programs
// and layouts the planned step never moves more than greedy dispatch and computes the
// same values; replay costs no planning; a step that changes records again; a layout
// the code reads stays as recorded.
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "dist_op_test_util.h"
#include "dtensor/cost_model.h"
#include "dtensor/data.h"
#include "dtensor/dispatch_trace.h"
#include "dtensor/models/gpt.h"
#include "dtensor/models/gpt_parallel.h"
#include "dtensor/nn/layers.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/tensor_parallel.h"
#include "dtensor/step_plan.h"
#include "parallel_equivalence.h"

namespace dtensor {
namespace {

// The bytes a rank puts on the wire under the ring algorithms (nccl-tests' bus
// factors), from CommDebugMode's input bytes, on groups of `n` ranks: an all-reduce
// sends 2(n-1)/n of its buffer, a reduce-scatter or all-to-all (n-1)/n, an
// all-gather n-1 times its input block.
double wire_bytes(const CommDebugMode& comm, int64_t n) {
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return 2 * f * static_cast<double>(comm.bytes("all_reduce")) +
         f * static_cast<double>(comm.bytes("reduce_scatter") + comm.bytes("all_to_all")) +
         static_cast<double>(n - 1) * static_cast<double>(comm.bytes("all_gather"));
}

// The seconds the cost model gives the collectives a step issued, on groups of `n`
// threads ranks (each call costs its latency hops plus its bytes over the bandwidth,
// so totals per kind suffice): what the planner minimises, measured after the fact.
double model_seconds(const CommDebugMode& comm, int64_t n) {
  const CostModel model = CostModel::for_backend("threads", n);
  double seconds = 0;
  auto add = [&](const char* kind, auto cost) {
    const int64_t calls = comm.count(kind);
    if (calls > 0) seconds += cost(comm.bytes(kind)) + static_cast<double>(calls - 1) * cost(0);
  };
  add("all_reduce", [&](int64_t b) { return model.all_reduce(b, n); });
  add("all_gather", [&](int64_t b) { return model.all_gather(b * n, n); });
  add("reduce_scatter", [&](int64_t b) { return model.reduce_scatter(b, n); });
  add("all_to_all", [&](int64_t b) { return model.all_to_all(b, n); });
  return seconds;
}

constexpr int64_t kBatch = 16, kIn = 8, kHidden = 32, kOut = 8;

struct MlpRun {
  std::vector<double> losses;
  std::vector<Tensor> params;                          // full, after the last step
  std::vector<std::map<std::string, int64_t>> counts;  // per step: collective kind -> calls
  std::vector<double> wire;                            // per step: bytes this rank sends
  std::vector<StepPlanReport> reports;
};

// The MLP as a new user writes it: nn::Linear layers whose parameters are
// placed as Megatron places them (the first weight [hidden, in] and its bias split on
// the hidden dim, the second weight [out, hidden] split on its input dim, its bias
// replicated), an MSE loss, AdamW, and no redistribute anywhere. On a 2-D mesh the
// batch is split over "dp" and the parameters are replicated there.
MlpRun train_mlp(const DeviceMesh& mesh, StepPlanner* planner, int steps) {
  const bool two_d = mesh.ndim() == 2;
  auto on_tp = [&](Placement p) { return two_d ? Placements{Replicate(), p} : Placements{p}; };
  const Tensor xf = Tensor::randn({kBatch, kIn}, 11), tf = Tensor::randn({kBatch, kOut}, 12);
  nn::Linear up(mesh, kIn, kHidden, true, 3), down(mesh, kHidden, kOut, true, 4);
  const Tensor b1 = Tensor::randn({kHidden}, 5), b2 = Tensor::randn({kOut}, 6);
  up.set_parameter("weight", distribute(up.weight().full_tensor(), mesh, on_tp(Shard(0))).set_requires_grad());
  up.set_parameter("bias", distribute(b1, mesh, on_tp(Shard(0))).set_requires_grad());
  down.set_parameter("weight", distribute(down.weight().full_tensor(), mesh, on_tp(Shard(1))).set_requires_grad());
  down.set_parameter("bias", distribute(b2, mesh, on_tp(Replicate())).set_requires_grad());
  const Placements batch = two_d ? Placements{Shard(0), Replicate()} : Placements{Replicate()};
  const DistTensor x = distribute(xf, mesh, batch), t = distribute(tf, mesh, batch);
  std::vector<DistTensor> params;
  for (nn::Module* m : {static_cast<nn::Module*>(&up), static_cast<nn::Module*>(&down)}) {
    for (const auto& [name, p] : m->named_parameters()) params.push_back(p);
  }
  AdamW optimizer(params, {.lr = 1e-2});
  MlpRun run;
  for (int step = 0; step < steps; ++step) {
    CommDebugMode comm;
    DistTensor loss;
    {
      std::optional<PlannedStep> scope;
      if (planner) scope.emplace(*planner);
      loss = mean(square(down.forward(gelu(up.forward(x))) - t));
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
    }
    run.counts.push_back(comm.counts());
    run.wire.push_back(wire_bytes(comm, mesh.size(mesh.ndim() - 1)));
    if (planner) run.reports.push_back(planner->last_report());
    run.losses.push_back(loss.full_tensor().item<double>());
  }
  for (const DistTensor& p : params) run.params.push_back(p.full_tensor());
  return run;
}

void expect_same_training(const MlpRun& a, const MlpRun& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s)
    EXPECT_NEAR(a.losses[s], b.losses[s], 1e-5 * (1 + std::abs(b.losses[s])));
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) EXPECT_TRUE(allclose(a.params[i], b.params[i], 1e-4, 1e-5)) << i;
}

std::string describe_counts(const std::map<std::string, int64_t>& counts) {
  std::string out;
  for (const auto& [kind, n] : counts) out += kind + " x" + std::to_string(n) + " ";
  return out;
}

// Megatron's MLP step: one all-reduce of the [batch, out] row-parallel output over tp
// (backward needs none: x does not require a gradient), and on dp x tp one all-reduce
// per parameter of its gradient shard over dp.
TEST(StepPlan, HandPlacedMlpCommunicatesAsMegatron) {
  MlpRun reference;
  launch(1, [&](Group world) { reference = train_mlp(DeviceMesh(world, {1}), nullptr, 4); });
  struct Case {
    int ranks;
    std::vector<int64_t> shape;
  };
  for (const Case& c : {Case{2, {2}}, Case{4, {4}}, Case{4, {2, 2}}}) {
    SCOPED_TRACE("mesh " + std::to_string(c.ranks) + " ranks, " + std::to_string(c.shape.size()) + "-D");
    launch(c.ranks, [&](Group world) {
      const bool two_d = c.shape.size() == 2;
      const DeviceMesh mesh = two_d ? DeviceMesh(world, c.shape, {"dp", "tp"}) : DeviceMesh(world, c.shape, {"tp"});
      const int64_t tp = c.shape.back(), dp = two_d ? c.shape[0] : 1;
      const MlpRun greedy = train_mlp(mesh, nullptr, 4);
      StepPlanner planner;
      const MlpRun planned = train_mlp(mesh, &planner, 4);
      expect_same_training(planned, reference);
      expect_same_training(greedy, reference);
      const double f = 2.0 * static_cast<double>(tp - 1) / static_cast<double>(tp);
      const double megatron =
          f * static_cast<double>(kBatch / dp * kOut * 4) +
          (two_d ? f * static_cast<double>((kHidden / tp * kIn + kHidden / tp + kOut * kHidden / tp + kOut) * 4) : 0.0);
      EXPECT_EQ(planned.reports[0].phase, StepPlanReport::Phase::Recorded);
      for (size_t s = 1; s < planned.counts.size(); ++s) {
        EXPECT_EQ(planned.reports[s].phase, StepPlanReport::Phase::Replayed) << planned.reports[s].to_string();
        if (!two_d) {  // exactly Megatron's one all-reduce
          const std::map<std::string, int64_t> megatron_calls{{"all_reduce", 1}};
          EXPECT_EQ(planned.counts[s], megatron_calls) << describe_counts(planned.counts[s]);
        }
        EXPECT_LE(planned.wire[s], 1.05 * megatron) << describe_counts(planned.counts[s]);
        EXPECT_GT(greedy.wire[s], 1.05 * megatron) << describe_counts(greedy.counts[s]);
      }
      if (world.rank() == 0) {
        EXPECT_LT(planned.reports[1].planned_seconds, planned.reports[1].greedy_seconds);
        EXPECT_GT(planned.reports[1].changed_ops, 0);
      }
    });
  }
}

// A GPT whose weights are placed as Megatron places them (the placements gpt_tp_plan's
// styles give), with none of the styles' input and output moves: planned, it moves no
// more bytes than greedy dispatch and no more than 1.05x the bytes of the styled model
// (Megatron's pattern, held exactly by
// TensorParallel.CommunicationPerStepIsMegatronsAtTrainingSizes).
struct GptStep {
  double wire = 0, seconds = 0;
  std::map<std::string, int64_t> counts;
  double loss = 0;
  StepPlanReport report;
};

GptStep gpt_step(const DeviceMesh& mesh, bool styled, StepPlanner* planner, int steps) {
  models::GPTConfig config;
  config.vocab = 2048;
  config.block_size = 64;
  config.layers = 2;
  config.heads = 8;
  config.dim = 128;
  const int64_t batch = 16;
  models::GPT model(mesh, config, 1);
  const DeviceMesh tp = mesh.ndim() == 2 ? mesh["tp"] : mesh;
  if (styled) {
    parallel::parallelize_module(model, tp, models::gpt_tp_plan(config));
  } else {
    models::GPT placed(mesh, config, 1);
    parallel::parallelize_module(placed, tp, models::gpt_tp_plan(config));
    std::map<std::string, Placements> layout;
    for (const auto& [name, p] : placed.named_parameters()) layout[name] = p.placements();
    for (const auto& [name, p] : model.named_parameters()) {
      model.set_parameter(name, distribute(p.full_tensor(), mesh, layout.at(name)).set_requires_grad());
    }
  }
  SyntheticLanguage data(config.vocab, config.block_size, batch, 3);
  std::vector<int64_t> indices(static_cast<size_t>(batch));
  std::iota(indices.begin(), indices.end(), 0);
  const TokenBatch tokens = data.get_batch(indices);
  const Placements rows = mesh.ndim() == 2 ? Placements{Shard(0), Replicate()} : Placements{Replicate()};
  const DistTensor ids = distribute(tokens.inputs, mesh, rows), targets = distribute(tokens.targets, mesh, rows);
  GptStep out;
  for (int step = 0; step < steps; ++step) {
    CommDebugMode comm;
    DistTensor loss;
    {
      std::optional<PlannedStep> scope;
      if (planner) scope.emplace(*planner);
      loss = model.loss(ids, targets);
      loss.backward();
      // As an optimizer does: each gradient in its parameter's layout.
      for (const auto& [name, p] : model.named_parameters()) {
        if (p.grad().defined()) p.set_grad(p.grad().redistribute(p.placements()));
      }
    }
    out.wire = wire_bytes(comm, mesh.size(mesh.ndim() - 1));
    out.seconds = model_seconds(comm, mesh.size(mesh.ndim() - 1));
    out.counts = comm.counts();
    out.loss = loss.full_tensor().item<double>();
    if (planner) out.report = planner->last_report();
    model.zero_grad();
  }
  return out;
}

TEST(StepPlan, HandPlacedGptMovesMegatronsBytes) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2}, std::vector<int64_t>{4}, std::vector<int64_t>{2, 2}}) {
    launch(static_cast<int>(shape_numel(shape)), [&](Group world) {
      const DeviceMesh mesh =
          shape.size() == 2 ? DeviceMesh(world, shape, {"dp", "tp"}) : DeviceMesh(world, shape, {"tp"});
      const GptStep megatron = gpt_step(mesh, true, nullptr, 1);
      const GptStep greedy = gpt_step(mesh, false, nullptr, 1);
      StepPlanner planner;
      const GptStep planned = gpt_step(mesh, false, &planner, 2);
      if (world.rank() == 0) {
        std::printf(
            "mesh %s: megatron %.0f B %.0f us (%s), greedy %.0f B %.0f us (%s), planned %.0f B %.0f us (%s); %s\n",
            mesh.to_string().c_str(), megatron.wire, megatron.seconds * 1e6, describe_counts(megatron.counts).c_str(),
            greedy.wire, greedy.seconds * 1e6, describe_counts(greedy.counts).c_str(), planned.wire,
            planned.seconds * 1e6, describe_counts(planned.counts).c_str(), planned.report.to_string().c_str());
      }
      EXPECT_EQ(planned.report.phase, StepPlanReport::Phase::Replayed) << planned.report.to_string();
      EXPECT_NEAR(planned.loss, megatron.loss, 1e-4);
      EXPECT_NEAR(greedy.loss, megatron.loss, 1e-4);
      EXPECT_LE(planned.wire, greedy.wire);
      EXPECT_LE(planned.wire, 1.05 * megatron.wire);
    });
  }
}

// A GPT under Megatron's tensor parallelism with sequence parallelism (the norms and
// residuals on sequence shards): the recorded step replays in every later step (its
// Linears' weight gradients take one path whatever the plan's layouts; a norm's weight
// gradient, replicated as its output is, is not taken for the output), and three
// planned steps of AdamW train as greedy's do.
TEST(StepPlan, SequenceParallelGptReplays) {
  launch(2, [](Group world) {
    const DeviceMesh mesh(world, {2}, {"tp"});
    models::GPTConfig config = testing::tiny_gpt(2, 4);  // train_gpt's model
    config.vocab = 32;
    config.block_size = 32;
    config.dim = 64;
    config.bias = true;
    const SyntheticLanguage data(config.vocab, config.block_size, 16, 3);
    std::vector<int64_t> rows(16);
    std::iota(rows.begin(), rows.end(), 0);
    const TokenBatch batch = data.get_batch(rows);
    std::vector<double> losses[2];
    for (int planned = 0; planned < 2; ++planned) {
      auto gpt = models::parallelize_gpt(mesh, config, 7, {.tp = {.sequence_parallel = true}});
      AdamW optimizer(gpt->parameters(), {.lr = 1e-2});
      StepPlanner planner;
      for (int step = 0; step < 4; ++step) {
        std::optional<PlannedStep> scope;
        if (planned == 1) scope.emplace(planner);
        DistTensor loss = gpt->model()->loss(gpt->distribute_batch(batch.inputs), gpt->distribute_batch(batch.targets));
        loss.backward();
        optimizer.step();
        optimizer.zero_grad();
        losses[planned].push_back(loss.full_tensor().item<double>());
        scope.reset();
        if (planned == 1) {
          EXPECT_EQ(planner.last_report().phase,
                    step == 0 ? StepPlanReport::Phase::Recorded : StepPlanReport::Phase::Replayed)
              << "step " << step << ": " << planner.last_report().to_string();
        }
      }
    }
    for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-4) << "step " << i;
  });
}

// Random programs over random layouts: matmuls, pointwise ops, broadcasts, reductions
// and transposes of a few [n, n] and [n] tensors, some of them parameters, summed into
// one loss. Planned and greedy steps compute the same loss and gradients, and the
// collectives the planned step issues cost no more under the model than greedy's (at
// these latency-bound sizes a plan may send more bytes in fewer calls). Every gradient
// is moved to its parameter's layout inside the step, as an optimizer does.
struct Program {
  struct Op {
    int kind;
    int a, b;
  };
  std::vector<Op> ops;
  std::vector<Placements> layouts;  // per input
  std::vector<bool> requires_grad;
};

constexpr int64_t kN = 8;
constexpr int kInputs = 4;

Program random_program(std::mt19937& rng, const DeviceMesh& mesh) {
  Program p;
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  for (int i = 0; i < kInputs; ++i) {
    Placements layout;
    for (int m = 0; m < mesh.ndim(); ++m) {
      const int c = pick(4);
      layout.push_back(c == 0   ? Placement(Replicate())
                       : c == 1 ? Placement(Shard(0))
                       : c == 2 ? Placement(Shard(1))
                                : Placement(Partial()));
    }
    p.layouts.push_back(layout);
    p.requires_grad.push_back(pick(3) != 0);
  }
  const int n_ops = 4 + pick(6);
  for (int i = 0; i < n_ops; ++i) {
    const int values = kInputs + i;
    p.ops.push_back({pick(8), pick(values), pick(values)});
  }
  return p;
}

struct ProgramResult {
  double loss = 0;
  std::vector<Tensor> grads;
  double seconds = 0;  // model_seconds of the last step
  StepPlanReport report;
};

ProgramResult run_program(const Program& p, const DeviceMesh& mesh, StepPlanner* planner, int steps) {
  std::vector<Tensor> full;
  for (int i = 0; i < kInputs; ++i) full.push_back(Tensor::randn({kN, kN}, 100 + static_cast<uint64_t>(i)));
  ProgramResult result;
  for (int step = 0; step < steps; ++step) {
    std::vector<DistTensor> values;
    for (int i = 0; i < kInputs; ++i) {
      DistTensor t = testing::make_input(full[static_cast<size_t>(i)], mesh, p.layouts[static_cast<size_t>(i)]);
      if (p.requires_grad[static_cast<size_t>(i)]) t.set_requires_grad();
      values.push_back(t);
    }
    const std::vector<DistTensor> leaves = values;
    CommDebugMode comm;
    DistTensor loss;
    {
      std::optional<PlannedStep> scope;
      if (planner) scope.emplace(*planner);
      for (const Program::Op& op : p.ops) {
        const DistTensor& a = values[static_cast<size_t>(op.a)];
        const DistTensor& b = values[static_cast<size_t>(op.b)];
        DistTensor out;
        switch (op.kind) {
          case 0: out = matmul(a, b); break;
          case 1: out = add(a, b); break;
          case 2: out = mul(a, b); break;
          case 3: out = gelu(a); break;
          case 4: out = transpose(a, 0, 1); break;
          case 5: out = add(a, sum(b, {0})); break;  // a broadcast [n] operand
          case 6: out = sub(a, mean(b, {1}, true)); break;
          default: out = tanh(mul(a, 0.5)); break;
        }
        values.push_back(out);
      }
      loss = mean(square(values.back()));
      for (size_t i = kInputs; i + 1 < values.size(); ++i) loss = add(loss, mean(values[i]));
      if (loss.requires_grad()) loss.backward();
      // As an optimizer does: each gradient in its parameter's layout.
      for (const DistTensor& leaf : leaves) {
        if (leaf.requires_grad() && leaf.grad().defined()) leaf.set_grad(leaf.grad().redistribute(leaf.placements()));
      }
    }
    result.seconds = model_seconds(comm, mesh.size(mesh.ndim() - 1));
    result.loss = loss.full_tensor().item<double>();
    result.grads.clear();
    for (const DistTensor& leaf : leaves) {
      if (leaf.requires_grad() && leaf.grad().defined()) result.grads.push_back(leaf.grad().full_tensor());
    }
    if (planner) result.report = planner->last_report();
  }
  return result;
}

TEST(StepPlan, RandomProgramsNeverMoveMoreThanGreedyAndComputeTheSame) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2}, std::vector<int64_t>{4}, std::vector<int64_t>{2, 2}}) {
    const int ranks = static_cast<int>(shape_numel(shape));
    launch(ranks, [&](Group world) {
      const DeviceMesh mesh(world, shape);
      std::mt19937 rng(static_cast<unsigned>(7 + shape.size() * 10 + shape[0]));
      int improved = 0;
      for (int trial = 0; trial < 40; ++trial) {
        const Program p = random_program(rng, mesh);
        const ProgramResult greedy = run_program(p, mesh, nullptr, 1);
        StepPlanner planner;
        const ProgramResult planned = run_program(p, mesh, &planner, 2);
        SCOPED_TRACE("trial " + std::to_string(trial) + ": " + planned.report.to_string());
        ASSERT_EQ(planned.report.phase, StepPlanReport::Phase::Replayed);
        EXPECT_LE(planned.report.planned_seconds, planned.report.greedy_seconds);
        // Within 1%: a move's predicted cost also has local copies, which the planner
        // may trade for a little communication that CommDebugMode sees.
        EXPECT_LE(planned.seconds, greedy.seconds * 1.01);
        improved += planned.seconds < greedy.seconds * (1 - 1e-9);
        EXPECT_NEAR(planned.loss, greedy.loss, 1e-4 * (1 + std::abs(greedy.loss)));
        ASSERT_EQ(planned.grads.size(), greedy.grads.size());
        for (size_t i = 0; i < greedy.grads.size(); ++i)
          EXPECT_TRUE(allclose(planned.grads[i], greedy.grads[i], 1e-4, 1e-4));
      }
      if (world.rank() == 0) EXPECT_GT(improved, 0);  // the search finds something somewhere
    });
  }
}

TEST(StepPlan, ReplayCostsNoPlanningAndAChangedStepRecordsAgain) {
  launch(2, [](Group world) {
    const DeviceMesh mesh(world, {2});
    const DistTensor w = distribute(Tensor::randn({8, 8}, 1), mesh, {Shard(1)}).set_requires_grad();
    auto step = [&](StepPlanner& planner, int64_t rows) {
      const DistTensor x = distribute(Tensor::randn({rows, 8}, 2), mesh, {Replicate()});
      PlannedStep scope(planner);
      mean(square(matmul(x, w))).backward();
    };
    StepPlanner planner;
    step(planner, 4);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Recorded);
    EXPECT_GT(planner.last_report().ops, 0);
    step(planner, 4);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Replayed);
    EXPECT_EQ(planner.last_report().planning_seconds, 0.0);
    step(planner, 6);  // other shapes: the replay ends, the rest is greedy
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Diverged);
    EXPECT_NE(planner.last_report().note.find("matmul"), std::string::npos) << planner.last_report().note;
    step(planner, 6);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Recorded);
    step(planner, 6);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Replayed);
    // A step that changes every time (record, diverge, record, diverge, with no replay
    // between): the planner stops planning.
    planner.reset();
    step(planner, 4);
    step(planner, 6);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Diverged);
    step(planner, 4);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Recorded);
    step(planner, 6);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Diverged);
    EXPECT_NE(planner.last_report().note.find("stays greedy"), std::string::npos) << planner.last_report().note;
    step(planner, 6);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Greedy);
    planner.reset();
    step(planner, 6);
    EXPECT_EQ(planner.last_report().phase, StepPlanReport::Phase::Recorded);
  });
}

// A layout the code reads (to_local) is the code's business: the op that made it keeps
// its recorded strategy, and describe() says why.
TEST(StepPlan, ALayoutReadWithToLocalIsKept) {
  launch(2, [](Group world) {
    const DeviceMesh mesh(world, {2});
    const DistTensor x = distribute(Tensor::randn({16, 8}, 1), mesh, {Replicate()});
    const DistTensor t = distribute(Tensor::randn({16, 8}, 2), mesh, {Replicate()});
    const DistTensor w1 = distribute(Tensor::randn({8, 32}, 3), mesh, {Shard(1)}).set_requires_grad();
    const DistTensor w2 = distribute(Tensor::randn({32, 8}, 4), mesh, {Shard(0)}).set_requires_grad();
    StepPlanner planner;
    std::vector<Placements> seen;
    for (int s = 0; s < 2; ++s) {
      PlannedStep scope(planner);
      const DistTensor d = sub(matmul(gelu(matmul(x, w1)), w2), t);
      seen.push_back(d.placements());
      const Tensor local = d.to_local();  // the code reads d's shard: d keeps its layout
      EXPECT_EQ(local.numel(), d.to_local().numel());
      mean(square(d)).backward();
    }
    EXPECT_EQ(seen[0], seen[1]);
    EXPECT_TRUE(seen[0][0].is_partial());  // the plan of the unread step all-reduces it (HandPlacedMlp)
    EXPECT_NE(planner.describe().find("kept: read with to_local()"), std::string::npos) << planner.describe();
  });
}

// A tensor the step returns is alive after it: its layout stays the recorded one. A
// shard read only in a replayed step, of a tensor whose layout the plan changed, is an
// error, never a silently different value.
TEST(StepPlan, TensorsThatOutliveTheStepKeepTheirLayoutAndLateReadsFailLoudly) {
  launch(2, [](Group world) {
    const DeviceMesh mesh(world, {2});
    const DistTensor x = distribute(Tensor::randn({16, 8}, 1), mesh, {Replicate()});
    const DistTensor t = distribute(Tensor::randn({16, 8}, 2), mesh, {Replicate()});
    const DistTensor w1 = distribute(Tensor::randn({8, 32}, 3), mesh, {Shard(1)}).set_requires_grad();
    const DistTensor w2 = distribute(Tensor::randn({32, 8}, 4), mesh, {Shard(0)}).set_requires_grad();
    auto forward = [&] { return sub(matmul(gelu(matmul(x, w1)), w2), t); };
    // The difference is kept past the step: it keeps greedy's Partial layout.
    StepPlanner keeps;
    std::vector<DistTensor> kept;
    for (int s = 0; s < 2; ++s) {
      PlannedStep scope(keeps);
      kept.push_back(forward());
      mean(square(kept.back())).backward();
    }
    EXPECT_EQ(kept[0].placements(), kept[1].placements());
    EXPECT_TRUE(kept[1].placements()[0].is_partial());
    EXPECT_NE(keeps.describe().find("kept: alive after the step"), std::string::npos) << keeps.describe();
    // Not kept, and read only in the replayed step: its layout is the plan's (R, not P).
    StepPlanner planner;
    {
      PlannedStep scope(planner);
      mean(square(forward())).backward();
    }
    PlannedStep scope(planner);
    const DistTensor d = forward();
    EXPECT_TRUE(d.placements()[0].is_replicate());
    try {
      (void)d.to_local();
      ADD_FAILURE() << "expected an error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("planned step chose"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(allclose(d.full_tensor(), kept[0].full_tensor(), 1e-5, 1e-5));  // through redistribute: fine
    mean(square(d)).backward();
  });
}

TEST(StepPlan, ModeFromTheEnvironmentAndMisuse) {
  ::setenv("DTENSOR_PLAN", "step", 1);
  EXPECT_EQ(plan_mode_from_env(), PlanMode::Step);
  ::setenv("DTENSOR_PLAN", "greedy", 1);
  EXPECT_EQ(plan_mode_from_env(), PlanMode::Greedy);
  ::setenv("DTENSOR_PLAN", "whole", 1);
  try {
    plan_mode_from_env();
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("DTENSOR_PLAN"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"whole\""), std::string::npos) << e.what();
  }
  ::unsetenv("DTENSOR_PLAN");
  EXPECT_EQ(plan_mode_from_env(), PlanMode::Greedy);
  StepPlanner a, b;
  PlannedStep outer(a);
  EXPECT_THROW(PlannedStep inner(b), std::invalid_argument);
  // One planner per rank: another thread cannot open a step on it while one is open.
  std::thread other([&] { EXPECT_THROW(PlannedStep elsewhere(a), std::invalid_argument); });
  other.join();
}

}  // namespace
}  // namespace dtensor
