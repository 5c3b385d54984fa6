// Tensor parallelism: parallel equivalence of GPT training under Megatron's plan
// (TP = 2, 3, 4, sequence parallel, loss parallel, DP x TP) with one rank, exact
// communication per step, the styles on their own, and bad plans.
#include <numeric>

#include "dtensor/data.h"
#include "dtensor/models/gpt.h"
#include "dtensor/models/gpt_parallel.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/ddp.h"
#include "dtensor/parallel/tensor_parallel.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace dtensor::parallel;
using namespace dtensor::models;

namespace {

struct Layout {
  Shape mesh;                      // {tp} or {dp, tp}
  bool sequence_parallel = false;
  bool loss_parallel = true;
};

// 10 AdamW steps on the synthetic task, global batch 8; the batch is sharded over
// dp (with DDP) and replicated over tp.
dtensor::testing::TrainingRun train(const models::GPTConfig& config, const Layout& layout, int steps = 10) {
  dtensor::testing::TrainingRun result;
  const bool two_d = layout.mesh.size() == 2;
  const int world = static_cast<int>(shape_numel(layout.mesh));
  launch(world, [&](Group g) {
    DeviceMesh mesh = two_d ? DeviceMesh(g, layout.mesh, {"dp", "tp"}) : DeviceMesh(g, layout.mesh, {"tp"});
    const int64_t dp = two_d ? layout.mesh[0] : 1;
    models::GPT model(mesh, config, 42);
    if (mesh["tp"].size() > 1) {
      parallelize_module(model, mesh["tp"],
                         gpt_tp_plan(config, {.sequence_parallel = layout.sequence_parallel,
                                              .loss_parallel = layout.loss_parallel}));
    }
    std::optional<DistributedDataParallel> ddp;
    if (two_d) ddp.emplace(model, DDPOptions{.dp_dim = "dp"});
    AdamW optimizer(model.parameters(), 1e-2);
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    DistributedSampler sampler(data.size(), 8, two_d ? mesh.coordinate(0) : 0, dp, 5);
    const Placements batch_layout = two_d ? Placements{Shard(0), Replicate()} : Placements{Replicate()};
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      const TokenBatch batch = data.get_batch(sampler.batch_at(step));
      const DistTensor ids = DistTensor::from_local(batch.inputs, mesh, batch_layout, Shape{8, config.block_size});
      const DistTensor targets =
          DistTensor::from_local(batch.targets, mesh, batch_layout, Shape{8, config.block_size});
      const DistTensor loss = model.loss(ids, targets);
      loss.backward();
      if (ddp) ddp->wait_for_gradients();
      optimizer.step();
      optimizer.zero_grad();
      losses.push_back(loss.full_tensor().item<double>());
    }
    const auto params = model.state_dict();
    if (g.rank() == 0) {
      result.losses = losses;
      result.params = params;
    }
  });
  return result;
}

// What a CommDebugMode saw, kept after it closed.
struct Snapshot {
  Snapshot() = default;
  explicit Snapshot(const CommDebugMode& comm)
      : counts(comm.counts()), all_reduce_bytes(comm.bytes("all_reduce")), total(comm.total_count()),
        text(comm.to_string()) {}
  int64_t count(const std::string& kind) const { return counts.count(kind) ? counts.at(kind) : 0; }
  int64_t bytes(const std::string&) const { return all_reduce_bytes; }
  int64_t total_count() const { return total; }
  const std::string& to_string() const { return text; }
  std::map<std::string, int64_t> counts;
  int64_t all_reduce_bytes = 0, total = 0;
  std::string text;
};

}  // namespace

TEST(TensorParallel, GptTrainingMatchesOneRank) {
  const models::GPTConfig config = dtensor::testing::tiny_gpt(2, 4);
  const dtensor::testing::TrainingRun one = train(config, {.mesh = {1}});
  ASSERT_LT(one.losses.back(), one.losses.front()) << "the loss should fall";
  dtensor::testing::expect_equivalent(train(config, {.mesh = {2}}), one, "TP=2");
  dtensor::testing::expect_equivalent(train(config, {.mesh = {4}}), one, "TP=4");
  dtensor::testing::expect_equivalent(train(config, {.mesh = {2}, .sequence_parallel = true}), one,
                                      "TP=2 sequence parallel");
  dtensor::testing::expect_equivalent(train(config, {.mesh = {2}, .loss_parallel = false}), one,
                                      "TP=2 gathered logits");
  dtensor::testing::expect_equivalent(train(config, {.mesh = {2, 2}}), one, "DP=2 x TP=2");
  dtensor::testing::expect_equivalent(train(config, {.mesh = {2, 2}, .sequence_parallel = true}), one,
                                      "DP=2 x TP=2 SP");
}

// Degree 3: the heads divide, the MLP hidden dim (40 -> 14, 14, 12) and the
// vocabulary (16 -> 6, 6, 4) do not; an untied head and SwiGLU with dropout.
TEST(TensorParallel, UnevenHiddenAndVocabularyOverThreeRanks) {
  models::GPTConfig config = dtensor::testing::tiny_gpt(2, 4);
  config.heads = 3;
  config.dim = 18;
  config.mlp_hidden = 40;
  config.tie_weights = false;
  config.activation = nn::Activation::SwiGlu;
  config.dropout = 0.1;
  const dtensor::testing::TrainingRun one = train(config, {.mesh = {1}}, 6);
  dtensor::testing::expect_equivalent(train(config, {.mesh = {3}}, 6), one, "TP=3");
  dtensor::testing::expect_equivalent(train(config, {.mesh = {3}, .sequence_parallel = true}, 6), one,
                                      "TP=3 sequence parallel");
}

// Megatron's communication, exactly: without sequence parallelism an all-reduce of
// the [B, T, D] activation per attention and per MLP in each direction, one for the
// vocab-parallel embedding (forward) and one for the head's input gradient
// (backward); the loss reduces three [N] statistics (max, sum of exponentials, the
// target logit) and never the logits.
namespace {

// Counts one training step's collectives (forward and backward separately) under
// gpt_tp_plan on 2 ranks and checks them against Megatron's: per block one
// all-reduce each way (with sequence parallel, a reduce-scatter and an all-gather).
void expect_megatron_communication(const models::GPTConfig& config, int64_t batch) {
  const int64_t activation_bytes = batch * config.block_size * config.dim * 4, rows = batch * config.block_size;
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    launch(2, [&](Group g) {
      DeviceMesh mesh(g, {2}, {"tp"});
      models::GPT model(mesh, config, 1);
      parallelize_module(model, mesh, gpt_tp_plan(config, {.sequence_parallel = sp}));
      SyntheticLanguage data(config.vocab, config.block_size, batch, 3);
      std::vector<int64_t> indices(static_cast<size_t>(batch));
      std::iota(indices.begin(), indices.end(), 0);
      const TokenBatch tokens = data.get_batch(indices);
      const DistTensor ids = distribute(tokens.inputs, mesh, {Replicate()});
      const DistTensor targets = distribute(tokens.targets, mesh, {Replicate()});
      for (int step = 0; step < 2; ++step) {  // the second step runs on cached decisions
        DistTensor loss;
        Snapshot forward;
        {
          CommDebugMode comm;  // modes nest: closed before backward's opens
          loss = model.loss(ids, targets);
          forward = Snapshot(comm);
        }
        CommDebugMode backward;
        loss.backward();
        const int64_t layers = config.layers;
        if (!sp) {
          EXPECT_EQ(forward.count("all_reduce"), 2 * layers + 1 + 3) << forward.to_string();
          EXPECT_EQ(forward.total_count(), 2 * layers + 1 + 3) << forward.to_string();
          EXPECT_EQ(forward.bytes("all_reduce"), (2 * layers + 1) * activation_bytes + 3 * rows * 4);
          EXPECT_EQ(backward.count("all_reduce"), 2 * layers + 1) << backward.to_string();
          EXPECT_EQ(backward.total_count(), 2 * layers + 1) << backward.to_string();
        } else {
          // Each all-reduce becomes a reduce-scatter and an all-gather (half the
          // activation from each rank); the head's input is gathered once.
          EXPECT_EQ(forward.count("reduce_scatter"), 2 * layers + 1) << forward.to_string();
          EXPECT_EQ(forward.count("all_gather"), 2 * layers + 1) << forward.to_string();
          EXPECT_EQ(forward.count("all_reduce"), 3) << forward.to_string();
          EXPECT_EQ(forward.total_count(), 4 * layers + 5) << forward.to_string();
          EXPECT_EQ(backward.count("reduce_scatter"), 2 * layers + 1) << backward.to_string();
          // The gathers' mirror, plus the position embedding's gradient (its
          // weight is replicated, its rows meet sequence shards).
          EXPECT_EQ(backward.count("all_gather"), 2 * layers + 2) << backward.to_string();
          EXPECT_EQ(backward.total_count(), 4 * layers + 3) << backward.to_string();
        }
        model.zero_grad();
      }
    });
  }
}

}  // namespace

TEST(TensorParallel, CommunicationPerStepIsMegatrons) {
  expect_megatron_communication(dtensor::testing::tiny_gpt(2, 4), 8);
}

// Larger activations, with biases: the row-parallel Linears keep their input in place
// and leave the output Partial for the style to all-reduce, rather than move the
// activation and gather the weight (cheaper in forward bytes, paid back twice in
// backward), and backward resolves its Partials where Megatron does.
TEST(TensorParallel, CommunicationPerStepIsMegatronsAtTrainingSizes) {
  models::GPTConfig config;
  config.vocab = 2048;  // a table larger than the activations, as in real models
  config.block_size = 64;
  config.layers = 2;
  config.heads = 8;
  config.dim = 128;
  expect_megatron_communication(config, 16);
}

TEST(TensorParallel, StylesPlaceParametersAndMoveInputsAndOutputs) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"tp"});
    nn::MLP mlp(mesh, 8, 12, nn::Activation::Gelu, /*bias=*/true, 3, 0.02);
    parallelize_module(mlp, mesh, {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}});
    std::map<std::string, Placements> placed;
    for (const auto& [name, p] : mlp.named_parameters()) placed[name] = p.placements();
    EXPECT_EQ(placed.at("up.weight"), Placements{Shard(0)});
    EXPECT_EQ(placed.at("up.bias"), Placements{Shard(0)});
    EXPECT_EQ(placed.at("down.weight"), Placements{Shard(1)});
    EXPECT_EQ(placed.at("down.bias"), Placements{Replicate()});
    const Tensor xf = Tensor::randn({5, 8}, 4);
    const DistTensor x = distribute(xf, mesh, {Replicate()});
    CommDebugMode comm;
    const DistTensor y = mlp(x);
    EXPECT_EQ(y.placements(), Placements{Replicate()});
    EXPECT_EQ(comm.count("all_reduce"), 1) << comm.to_string();
    EXPECT_EQ(comm.total_count(), 1) << comm.to_string();
    // An input that arrives sharded is moved to what the first layer needs.
    comm.reset();
    EXPECT_TRUE(allclose(mlp(distribute(xf, mesh, {Shard(0)})).full_tensor(), y.full_tensor(), 1e-5, 1e-6));
    EXPECT_EQ(comm.count("all_gather"), 1) << comm.to_string();
    // The reference: the same MLP on one rank.
    launch(1, [&](Group one) {
      nn::MLP reference(DeviceMesh(one, {1}), 8, 12, nn::Activation::Gelu, true, 3, 0.02);
      EXPECT_TRUE(allclose(y.full_tensor(), reference(distribute(xf, DeviceMesh(one, {1}), {Replicate()})).full_tensor(),
                           1e-5, 1e-6));
    });
  });
}

// A sharded parameter holds its shard's bytes: the replicated weight it came from is
// freed (a shard viewing it would keep all of it alive on every rank).
TEST(TensorParallel, ShardedParametersHoldOnlyTheirShardsBytes) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"tp"});
    const int64_t before = memory_stats().live_bytes;
    nn::MLP mlp(mesh, 64, 256, nn::Activation::Gelu, /*bias=*/false, 3, 0.02);
    const int64_t whole = memory_stats().live_bytes - before;
    EXPECT_EQ(whole, 2 * 64 * 256 * 4);
    parallelize_module(mlp, mesh, {{"up", ColwiseParallel{}}, {"down", RowwiseParallel{}}});
    EXPECT_EQ(memory_stats().live_bytes - before, whole / 2);
    for (const auto& [name, p] : mlp.named_parameters()) {
      EXPECT_EQ(p.to_local().storage()->bytes(), p.to_local().nbytes()) << name;
    }
  });
}

TEST(TensorParallel, SequenceParallelAndPrepareModuleStyles) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"tp"});
    nn::LayerNorm norm(mesh, 6);
    parallelize_module(norm, mesh, {{"", SequenceParallel{}}, {"", PrepareModuleOutput{}}});
    const DistTensor x = distribute(Tensor::randn({2, 4, 6}, 1), mesh, {Replicate()});
    CommDebugMode comm;
    const DistTensor y = norm(x);  // chunked over the sequence (no communication), normed, gathered
    EXPECT_EQ(y.placements(), Placements{Replicate()});
    EXPECT_EQ(comm.count("all_gather"), 1) << comm.to_string();
    EXPECT_EQ(comm.total_count(), 1) << comm.to_string();
    // input_layouts states what must arrive.
    nn::Linear layer(mesh, 6, 4, false, 2);
    parallelize_module(layer, mesh, {{"", ColwiseParallel{.input_layouts = Shard(1)}}});
    EXPECT_THROW_MSG(layer(x), std::invalid_argument,
                     "ColwiseParallel on '': the input is R on mesh dim 0, the style says S(1)");
  });
}

// Model code written for local shapes, PyTorch style: the column-parallel layer
// hands on this rank's piece of the hidden activation (use_local_output), a local
// op runs on it, and the row-parallel layer lifts it back (one small all-gather of
// the pieces' sizes, then Megatron's all-reduce). Forward and gradients against one
// rank.
class LocalShapesMlp : public nn::Module {
 public:
  explicit LocalShapesMlp(const DeviceMesh& mesh) {
    up_ = register_module("up", std::make_shared<nn::Linear>(mesh, 6, 10, true, 1));
    down_ = register_module("down", std::make_shared<nn::Linear>(mesh, 10, 6, true, 2));
  }
  DistTensor forward(const DistTensor& x) override {
    hidden = (*up_)(x);
    return (*down_)(gelu(hidden));
  }
  DistTensor hidden;

 private:
  std::shared_ptr<nn::Linear> up_, down_;
};

TEST(TensorParallel, UseLocalOutputHandsOnThisRanksPiece) {
  const Tensor xf = Tensor::randn({4, 6}, 3);
  std::map<std::string, Tensor> want_grads;
  Tensor want;
  launch(1, [&](Group one) {
    DeviceMesh mesh(one, {1});
    LocalShapesMlp mlp(mesh);
    const DistTensor y = mlp(distribute(xf, mesh, {Replicate()}));
    sum(mul(y, y)).backward();
    want = y.full_tensor();
    for (const auto& [name, p] : mlp.named_parameters()) want_grads[name] = p.grad().full_tensor();
  });
  launch(2, [&](Group g) {
    DeviceMesh mesh(g, {2}, {"tp"});
    LocalShapesMlp mlp(mesh);
    parallelize_module(mlp, mesh, {{"up", ColwiseParallel{.use_local_output = true}}, {"down", RowwiseParallel{}}});
    CommDebugMode comm;
    const DistTensor y = mlp(distribute(xf, mesh, {Replicate()}));
    EXPECT_EQ(mlp.hidden.mesh(), local_mesh());
    EXPECT_EQ(mlp.hidden.shape(), (Shape{4, 5}));  // this rank's 5 of the 10 hidden features
    EXPECT_EQ(comm.count("all_reduce"), 1) << comm.to_string();
    EXPECT_EQ(comm.count("all_gather"), 1) << comm.to_string();
    EXPECT_TRUE(allclose(y.full_tensor(), want, 1e-5, 1e-6));
    sum(mul(y, y)).backward();
    for (const auto& [name, p] : mlp.named_parameters()) {
      EXPECT_TRUE(allclose(p.grad().full_tensor(), want_grads.at(name), 1e-5, 1e-6)) << name;
    }
  });
}

TEST(TensorParallel, BadPlansAreClearErrors) {
  launch(4, [](Group g) {
    DeviceMesh mesh(g, {4}, {"tp"});
    models::GPTConfig config = dtensor::testing::tiny_gpt(2, 4);
    config.heads = 2;
    {
      models::GPT model(mesh, config, 1);
      EXPECT_THROW_MSG(parallelize_module(model, mesh, {{"blocks.*.attn.qq", ColwiseParallel{}}}),
                       std::invalid_argument, "[parallelize_module] no module matches 'blocks.*.attn.qq' (modules: tokens");
    }
    {
      models::GPT model(mesh, config, 1);
      EXPECT_THROW_MSG(parallelize_module(model, mesh, {{"blocks.0.norm1", ColwiseParallel{}}}), std::invalid_argument,
                       "[ColwiseParallel] 'blocks.0.norm1' is LayerNorm; the style fits Linear and Embedding");
    }
    {
      models::GPT model(mesh, config, 1);
      EXPECT_THROW_MSG(parallelize_module(model, mesh, {{"blocks.*.attn.q", SequenceParallel{}}}),
                       std::invalid_argument, "[SequenceParallel] 'blocks.0.attn.q' is Linear");
    }
    {
      models::GPT model(mesh, config, 1);
      EXPECT_THROW_MSG(
          parallelize_module(model, mesh, {{"blocks.0.attn.q", ColwiseParallel{}}, {"blocks.*.attn.q", RowwiseParallel{}}}),
          std::invalid_argument, "'blocks.0.attn.q' gets two styles that place its parameters");
    }
    {
      models::GPT model(mesh, config, 1);  // 2 heads over 4 ranks
      EXPECT_THROW_MSG(parallelize_module(model, mesh, gpt_tp_plan(config)), std::invalid_argument,
                       "'blocks.0.attn' has 2 attention heads, which the tensor-parallel degree 4 does not divide "
                       "(2 = 4 x 0 + 2)");
    }
    {
      models::GPT model(mesh, dtensor::testing::tiny_gpt(2, 4), 1);
      parallelize_module(model, mesh, gpt_tp_plan(dtensor::testing::tiny_gpt(2, 4)));
      EXPECT_THROW_MSG(parallelize_module(model, mesh, gpt_tp_plan(dtensor::testing::tiny_gpt(2, 4))),
                       std::invalid_argument, "is the module parallelized already?");
    }
    {
      // A tp mesh that is not the module's mesh nor one of its dims.
      models::GPT model(mesh, dtensor::testing::tiny_gpt(2, 4), 1);
      DeviceMesh two_d(g, {2, 2}, {"dp", "tp"});
      EXPECT_THROW_MSG(parallelize_module(model, two_d["tp"], gpt_tp_plan(dtensor::testing::tiny_gpt(2, 4))),
                       std::invalid_argument, "is neither the module's mesh tp=4 nor one of its dims");
      EXPECT_THROW_MSG(parallelize_module(model, two_d, gpt_tp_plan(dtensor::testing::tiny_gpt(2, 4))),
                       std::invalid_argument, "expected a 1-D tensor-parallel mesh, got dp=2,tp=2");
    }
  });
}
