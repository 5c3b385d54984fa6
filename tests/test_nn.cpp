// nn modules: parameter naming, layout-independent initialisation, state dicts,
// hooks, train/eval, and the modules' own errors.
#include "dtensor/models/gpt.h"
#include "dtensor/ops.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {
models::GPTConfig small() {
  models::GPTConfig c;
  c.vocab = 11;
  c.block_size = 6;
  c.layers = 2;
  c.heads = 2;
  c.dim = 8;
  c.dropout = 0.1;
  return c;
}
}  // namespace

TEST(NN, ParametersAreNamedAndInitialisedTheSameOnAnyMesh) {
  std::map<std::string, Tensor> one_rank;
  launch(1, [&](Group g) { one_rank = models::GPT(DeviceMesh(g, {1}), small(), 3).state_dict(); });
  EXPECT_TRUE(one_rank.count("tokens.weight"));
  EXPECT_TRUE(one_rank.count("blocks.1.attn.q.weight"));
  EXPECT_TRUE(one_rank.count("blocks.0.mlp.down.bias"));
  EXPECT_FALSE(one_rank.count("head.weight"));  // tied to the token embedding
  EXPECT_EQ(one_rank.at("blocks.0.norm1.weight").to_vector<float>(), std::vector<float>(8, 1.0f));
  launch(4, [&](Group g) {
    models::GPT model(DeviceMesh(g, {2, 2}), small(), 3);
    const auto state = model.state_dict();
    ASSERT_EQ(state.size(), one_rank.size());
    for (const auto& [name, t] : one_rank) EXPECT_TRUE(allclose(state.at(name), t, 0, 0)) << name;
    int64_t total = 0;
    for (const auto& [_, t] : one_rank) total += t.numel();
    EXPECT_EQ(model.num_parameters(), total);
  });
  // A different seed gives a different model.
  launch(1, [&](Group g) {
    const auto other = models::GPT(DeviceMesh(g, {1}), small(), 4).state_dict();
    EXPECT_FALSE(allclose(other.at("tokens.weight"), one_rank.at("tokens.weight")));
  });
}

TEST(NN, StateDictRoundTripAndErrors) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    models::GPT a(mesh, small(), 1), b(mesh, small(), 2);
    b.load_state_dict(a.state_dict());
    for (const auto& [name, t] : a.state_dict()) EXPECT_TRUE(allclose(b.state_dict().at(name), t, 0, 0)) << name;
    auto state = a.state_dict();
    state.erase("tokens.weight");
    EXPECT_THROW_MSG(b.load_state_dict(state), std::invalid_argument, "[load_state_dict] missing parameter 'tokens.weight'");
    state = a.state_dict();
    state["bogus"] = Tensor::zeros({1});
    EXPECT_THROW_MSG(b.load_state_dict(state), std::invalid_argument, "unexpected parameter 'bogus'");
    state = a.state_dict();
    state["norm.weight"] = Tensor::zeros({3});
    EXPECT_THROW_MSG(b.load_state_dict(state), std::invalid_argument, "parameter 'norm.weight': expected shape [8], got [3]");
  });
}

TEST(NN, HooksTrainEvalAndBadInput) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    models::GPT model(mesh, small(), 1);
    int pre = 0, post = 0;
    Shape seen;
    model.register_forward_pre_hook([&](nn::Module&, const DistTensor& in) {
      ++pre;
      seen = in.shape();
    });
    model.register_forward_post_hook([&](nn::Module&, const DistTensor&, const DistTensor& out) {
      ++post;
      EXPECT_EQ(out.shape(), (Shape{2, 6, 11}));
    });
    const DistTensor ids = distribute(Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, {2, 6}), mesh, {Shard(0)});
    // Dropout draws a new mask per call in training, none in eval.
    const Tensor train1 = model(ids).full_tensor(), train2 = model(ids).full_tensor();
    EXPECT_FALSE(allclose(train1, train2));
    model.eval();
    EXPECT_FALSE(model.training());
    EXPECT_TRUE(allclose(model(ids).full_tensor(), model(ids).full_tensor(), 0, 0));
    EXPECT_EQ(pre, 4);
    EXPECT_EQ(post, 4);
    EXPECT_EQ(seen, (Shape{2, 6}));
    const DistTensor long_ids = distribute(Tensor::zeros({1, 7}, DType::I64), mesh, {Replicate()});
    EXPECT_THROW_MSG(model(long_ids), std::invalid_argument, "[GPT] sequence length 7 exceeds block_size 6");
    EXPECT_THROW_MSG(model(distribute(Tensor::zeros({1, 3}), mesh, {Replicate()})), std::invalid_argument,
                     "[GPT] expected token ids [B, T] of i64");
    models::GPTConfig bad = small();
    bad.dim = 9;
    EXPECT_THROW_MSG(models::GPT(mesh, bad, 1), std::invalid_argument,
                     "[SelfAttention] dim 9 must be a multiple of heads 2");
  });
}

TEST(NN, SetParameterAndSubmoduleResolveDottedChildNames) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    models::GPT model(mesh, small(), 1);
    auto parameter = [&](const std::string& wanted) {
      for (const auto& [name, p] : model.named_parameters()) {
        if (name == wanted) return p;
      }
      return DistTensor();
    };
    // Children registered as "blocks.0" hold dots themselves.
    const DistTensor sharded = parameter("blocks.1.attn.q.weight").redistribute({Shard(0)});
    model.set_parameter("blocks.1.attn.q.weight", sharded);
    for (const auto& [name, p] : model.named_parameters()) {
      const bool changed = name == "blocks.1.attn.q.weight";
      EXPECT_EQ(p.placements(), (Placements{changed ? Shard(0) : Replicate()})) << name;
      EXPECT_TRUE(p.requires_grad() && p.is_leaf()) << name;
    }
    nn::Module* found = nullptr;
    for (auto& [name, m] : model.named_modules()) {
      if (name == "blocks.1.attn.q") found = m;
    }
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(&model.submodule("blocks.1.attn.q"), found);
    EXPECT_EQ(&model.submodule(""), &model);
    EXPECT_THROW_MSG(model.set_parameter("blocks.1.attn.q.bogus", sharded), std::invalid_argument,
                     "[set_parameter] no parameter named 'blocks.1.attn.q.bogus'");
    EXPECT_THROW_MSG(model.set_parameter("blocks.7.attn.q.weight", sharded), std::invalid_argument,
                     "no parameter named 'blocks.7.attn.q.weight'");
    EXPECT_THROW_MSG(model.set_parameter("blocks.1.attn.q.bias", sharded), std::invalid_argument,
                     "parameter 'blocks.1.attn.q.bias' has shape [8], the new value [8, 8]");
    EXPECT_THROW_MSG(model.submodule("blocks.1.attention"), std::invalid_argument,
                     "[submodule] no module named 'blocks.1.attention'");
  });
}

TEST(NN, HooksReplaceInputAndOutputAndCanBeRemoved) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    nn::Linear layer(mesh, 4, 3, /*bias=*/false, 7);
    const DistTensor x = distribute(Tensor::randn({5, 4}, 1), mesh, {Replicate()});
    const Tensor plain = layer(x).full_tensor();
    // The pre-hook doubles the input, the post-hook adds one to the output and
    // sees the input forward got.
    nn::HookHandle pre = layer.register_forward_pre_hook(
        [](nn::Module&, const DistTensor& in) -> std::optional<DistTensor> { return mul(in, 2.0); });
    Tensor seen;
    nn::HookHandle post = layer.register_forward_post_hook(
        [&](nn::Module&, const DistTensor& in, const DistTensor& out) -> std::optional<DistTensor> {
          seen = in.full_tensor();
          return add(out, 1.0);
        });
    int observed = 0;
    layer.register_forward_post_hook([&](nn::Module&, const DistTensor&, const DistTensor&) { ++observed; });
    const Tensor hooked = layer(x).full_tensor();
    EXPECT_TRUE(allclose(hooked, add(mul(plain, 2.0), 1.0), 1e-6, 1e-6));
    EXPECT_TRUE(allclose(seen, mul(x.full_tensor(), 2.0), 0, 0));
    pre.remove();
    pre.remove();  // idempotent
    EXPECT_TRUE(allclose(layer(x).full_tensor(), add(plain, 1.0), 1e-6, 1e-6));
    post.remove();
    EXPECT_TRUE(allclose(layer(x).full_tensor(), plain, 0, 0));
    EXPECT_EQ(observed, 3);
  });
}

namespace dtensor {
namespace {

TEST(NN, ASharedModuleIsListedOnceAtItsFirstPath) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    auto embedding = std::make_shared<nn::Embedding>(mesh, 10, 4, 1);
    nn::Sequential model;
    model.append("tokens", embedding);
    model.append("head", std::make_shared<nn::TiedLinear>(embedding));
    const auto params = model.named_parameters();
    ASSERT_EQ(params.size(), 1u);
    EXPECT_EQ(params[0].first, "tokens.weight");
    std::vector<std::string> modules;
    for (const auto& [name, _] : model.named_modules()) modules.push_back(name);
    EXPECT_EQ(modules, (std::vector<std::string>{"", "tokens", "head"}));
    // ids -> embedding -> logits over the same table.
    const DistTensor ids = distribute(Tensor::from_vector<int64_t>({1, 2, 3}, {1, 3}), mesh, {Replicate()});
    const DistTensor logits = model(ids);
    EXPECT_EQ(logits.shape(), (Shape{1, 3, 10}));
    const Tensor w = embedding->weight().full_tensor();
    // ids 1, 2, 3 are rows 1..3 of the table.
    EXPECT_TRUE(allclose(logits.full_tensor().reshape({3, 10}),
                         matmul(w.narrow(0, 1, 3).contiguous(), w.t().contiguous()), 1e-6, 1e-6));
  });
}

TEST(NN, SequentialSharesAndCheckpointsChildren) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    auto build = [&](bool checkpointed) {
      auto model = std::make_shared<nn::Sequential>();
      model->share("unused", std::make_shared<nn::LayerNorm>(mesh, 4));
      model->append("fc1", std::make_shared<nn::Linear>(mesh, 4, 8, true, 1), checkpointed);
      model->append("fc2", std::make_shared<nn::Linear>(mesh, 8, 4, true, 2));
      return model;
    };
    const DistTensor x = distribute(Tensor::randn({3, 4}, 5), mesh, {Replicate()});
    auto plain = build(false), recomputed = build(true);
    EXPECT_EQ(plain->size(), 2u) << "a shared module is not an entry";
    EXPECT_EQ(plain->named_parameters().front().first, "unused.weight");
    EXPECT_TRUE(recomputed->checkpointed(0));
    EXPECT_TRUE(recomputed->slice(0, 1)->checkpointed(0)) << "a slice keeps it";
    sum((*plain)(x)).backward();
    sum((*recomputed)(x)).backward();
    const auto a = plain->named_parameters(), b = recomputed->named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].second.grad().defined()) continue;  // the shared LayerNorm never ran
      EXPECT_TRUE(allclose(a[i].second.grad().full_tensor(), b[i].second.grad().full_tensor(), 0, 0)) << a[i].first;
    }
    EXPECT_FALSE(a.front().second.grad().defined()) << "forward does not run a shared module";
    EXPECT_THROW_MSG(plain->append("unused", std::make_shared<nn::LayerNorm>(mesh, 4)), std::invalid_argument,
                     "a shared module named 'unused' exists already");
  });
}

TEST(NN, PositionalEmbeddingAddsTheTableAndChecksItsInput) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    nn::PositionalEmbedding positions(mesh, 5, 4, 3);
    nn::Embedding same_seed(mesh, 5, 4, 3);
    const Tensor x = Tensor::randn({2, 3, 4}, 9);
    const DistTensor y = positions(distribute(x, mesh, {Replicate()}));
    const Tensor table = same_seed.weight().full_tensor().narrow(0, 0, 3);
    EXPECT_TRUE(allclose(y.full_tensor(), add(x, table), 0, 0)) << "x + table[0:T], drawn as an Embedding's";
    EXPECT_THROW_MSG(positions(distribute(Tensor::randn({2, 6, 4}, 9), mesh, {Replicate()})), std::invalid_argument,
                     "sequence length 6 exceeds the 5 positions of the table");
    EXPECT_THROW_MSG(positions(distribute(Tensor::randn({2, 3, 5}, 9), mesh, {Replicate()})), std::invalid_argument,
                     "expected [B, T, 4], got [2, 3, 5]");
  });
}

}  // namespace
}  // namespace dtensor
