// Mixture of experts: nn::MoE against the same layer written densely (every expert on
// every token, weighted by the router's gates scattered to all experts), in outputs,
// gradients and auxiliary losses; capacity drops in GShard's priority; training
// under data parallel, expert parallel (the two all-to-alls counted) and tensor
// parallel inside the experts equal to one rank.
#include <gtest/gtest.h>

#include <cmath>

#include "dtensor/dtensor.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

namespace dtensor {
namespace {

nn::MoEConfig small(nn::Activation activation = nn::Activation::SwiGlu) {
  return {.dim = 8, .hidden = 12, .experts = 4, .top_k = 2, .activation = activation, .z_loss_coef = 0.001};
}

// The layer written densely on one rank: every expert on every token, weighted by the
// gates scattered to all experts ([N, E], zero where not chosen or dropped).
DistTensor dense_moe(nn::MoE& moe, const DistTensor& x, const Tensor& keep_mask) {
  const nn::MoEConfig& c = moe.config();
  const std::map<std::string, DistTensor> p = [&] {
    std::map<std::string, DistTensor> out;
    for (auto& [name, t] : moe.named_parameters()) out.emplace(name, t);
    return out;
  }();
  const DistTensor logits = linear(x, p.at("router_weight"));
  const DistTensor scores = c.gating == nn::Gating::Softmax ? softmax(logits, -1) : sigmoid(logits);
  // The top-k from the values (ties: lower index), as a mask [N, E].
  const Tensor s = scores.to_local().contiguous();
  const int64_t n = s.numel() / c.experts;
  std::vector<float> mask(static_cast<size_t>(n * c.experts), 0.0F);
  const std::vector<float> v = s.to_vector<float>();
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int64_t> order(static_cast<size_t>(c.experts));
    for (int64_t e = 0; e < c.experts; ++e) order[static_cast<size_t>(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return v[static_cast<size_t>(t * c.experts + a)] > v[static_cast<size_t>(t * c.experts + b)];
    });
    for (int64_t j = 0; j < c.top_k; ++j)
      mask[static_cast<size_t>(t * c.experts + order[static_cast<size_t>(j)])] = 1.0F;
  }
  const DeviceMesh& mesh = x.mesh();
  const Placements rep(1, Replicate());
  const DistTensor chosen = distribute(Tensor::from_vector(mask, s.shape()), mesh, rep);
  DistTensor gates = mul(scores, chosen);
  if (c.normalize_top_k) gates = div(gates, sum(gates, {-1}, true));
  gates = mul(gates, distribute(keep_mask.reshape(s.shape()), mesh, rep));
  DistTensor y = zeros(x.shape(), mesh, rep);
  for (int64_t e = 0; e < c.experts; ++e) {
    auto w = [&](const char* name) { return squeeze(slice(p.at(name), 0, e, e + 1), 0); };
    DistTensor h = linear(x, w("experts_up"));
    h = c.activation == nn::Activation::SwiGlu ? mul(silu(linear(x, w("experts_gate"))), h) : gelu(h, GeluApprox::Tanh);
    y = add(y, mul(linear(h, w("experts_down")), slice(gates, -1, e, e + 1)));
  }
  return y;
}

struct Grads {
  Tensor y;
  std::map<std::string, Tensor> grads;
  Tensor dx;
};

Grads run_one_rank(const nn::MoEConfig& config, bool dense, const Tensor& keep_mask) {
  Grads out;
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    nn::MoE moe(mesh, config, 5);
    const DistTensor x = distribute(Tensor::randn({2, 6, config.dim}, 9), mesh, {Replicate()}).set_requires_grad();
    const DistTensor w = distribute(Tensor::randn({2, 6, config.dim}, 10), mesh, {Replicate()});
    const DistTensor y = dense ? dense_moe(moe, x, keep_mask) : moe(x);
    sum(mul(y, w)).backward();
    out.y = y.full_tensor();
    out.dx = x.grad().full_tensor();
    for (auto& [name, p] : moe.named_parameters()) out.grads[name] = p.grad().full_tensor();
  });
  return out;
}

TEST(MoE, EqualsTheDenseLayer) {
  const Tensor all_kept = Tensor::ones({12, 4});
  for (const auto activation : {nn::Activation::SwiGlu, nn::Activation::Gelu}) {
    nn::MoEConfig c = small(activation);
    c.aux_loss_coef = 0;  // the dense layer has no auxiliary loss: compared below
    c.z_loss_coef = 0;
    const Grads got = run_one_rank(c, false, all_kept), want = run_one_rank(c, true, all_kept);
    EXPECT_TRUE(allclose(got.y, want.y, 1e-5, 1e-6)) << compare(got.y, want.y, 1e-5, 1e-6).to_string();
    EXPECT_TRUE(allclose(got.dx, want.dx, 1e-5, 1e-6));
    for (const auto& [name, g] : want.grads) {
      if (name == "router_weight") continue;  // the dense gates differ in what they route through: below
      EXPECT_TRUE(allclose(got.grads.at(name), g, 1e-5, 1e-6)) << name;
    }
    EXPECT_TRUE(allclose(got.grads.at("router_weight"), want.grads.at("router_weight"), 1e-4, 1e-6));
  }
}

// Capacity 0.5: each expert keeps ceil(0.5 * 12 * 2 / 4) = 3 assignments, first
// choices in token order before second choices.
TEST(MoE, CapacityDropsInGShardOrder) {
  nn::MoEConfig c = small();
  c.aux_loss_coef = 0;
  c.z_loss_coef = 0;
  c.capacity_factor = 0.5;
  // The keep mask the rule gives, computed from the routing of the dropless layer.
  Tensor keep = Tensor::zeros({12, 4});
  int64_t dropped = 0;
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    nn::MoE moe(mesh, c, 5);
    const DistTensor x = distribute(Tensor::randn({2, 6, c.dim}, 9), mesh, {Replicate()});
    const Tensor scores = softmax(linear(x, moe.named_parameters()[0].second), -1).to_local().reshape({12, 4});
    const std::vector<float> v = scores.contiguous().to_vector<float>();
    std::vector<std::array<int64_t, 2>> choice(12);
    for (int64_t t = 0; t < 12; ++t) {
      std::vector<int64_t> o{0, 1, 2, 3};
      std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return v[t * 4 + a] > v[t * 4 + b]; });
      choice[t] = {o[0], o[1]};
    }
    std::vector<int64_t> load(4, 0);
    for (int j = 0; j < 2; ++j) {
      for (int64_t t = 0; t < 12; ++t) {
        if (load[choice[t][j]] < 3) {
          ++load[choice[t][j]];
          keep.narrow(0, t, 1).narrow(1, choice[t][j], 1).fill_(1.0);
        } else {
          ++dropped;
        }
      }
    }
    (void)moe(x);
    EXPECT_EQ(moe.stats().dropped, dropped);
  });
  EXPECT_GT(dropped, 0) << "the case must drop something";
  const Grads got = run_one_rank(c, false, keep), want = run_one_rank(c, true, keep);
  EXPECT_TRUE(allclose(got.y, want.y, 1e-5, 1e-6));
  EXPECT_TRUE(allclose(got.dx, want.dx, 1e-5, 1e-6));
}

// The auxiliary losses reach the router through backward without being added to the
// loss, with the values of their formulas.
TEST(MoE, AuxiliaryLossesHaveTheirFormulasAndGradients) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    nn::MoEConfig c = small();
    c.aux_loss_coef = 0.1;
    c.z_loss_coef = 0.01;
    nn::MoE moe(mesh, c, 5);
    const DistTensor x = distribute(Tensor::randn({12, c.dim}, 9), mesh, {Replicate()});
    const DistTensor y = moe(x);
    const Tensor logits = linear(x.to_local(), moe.named_parameters()[0].second.to_local());
    const Tensor scores = softmax(logits, -1);
    std::vector<double> fraction(4, 0.0);
    const std::vector<int64_t> routed = moe.stats().tokens_per_expert;
    for (int e = 0; e < 4; ++e) fraction[e] = static_cast<double>(routed[e]) / (12.0 * 2);
    const Tensor p = mean(scores, {0});
    double balance = 0;
    for (int e = 0; e < 4; ++e) balance += fraction[e] * p.narrow(0, e, 1).item<double>();
    const Tensor lse = log(sum(exp(logits), {-1}));
    const double z = mean(mul(lse, lse)).item<double>();
    EXPECT_NEAR(moe.aux_loss().full_tensor().item<double>(), 0.1 * 4 * balance + 0.01 * z, 1e-6);
    // With the output's gradient zero, the router's gradient is the auxiliary losses' alone.
    backward(y, zeros(y.shape(), mesh, {Replicate()}));
    const Tensor router_grad = moe.named_parameters()[0].second.grad().full_tensor();
    EXPECT_GT(amax(abs(router_grad)).item<double>(), 0.0);
    // Scaled as the loss is (gradient accumulation, pipeline weights, fp16).
    moe.zero_grad();
    {
      const nn::AuxLossScale quarter(0.25);
      backward(moe(x), zeros(y.shape(), mesh, {Replicate()}));
    }
    EXPECT_TRUE(allclose(moe.named_parameters()[0].second.grad().full_tensor(), mul(router_grad, 0.25), 1e-5, 1e-8));
  });
}

// Ten AdamW steps of x -> x + MoE(x) with a mean-square loss, on `shape`/`names`:
// DDP over the first dim (and the other token dims), or FSDP ZeRO-3 over it.
testing::TrainingRun train(const Shape& shape, const std::vector<std::string>& names, nn::MoEConfig config,
                           const std::string& ep = "", const std::string& tp = "", bool fsdp = false) {
  return testing::train_on_ranks(static_cast<int>(shape_numel(shape)), [&](Group g) {
    DeviceMesh mesh(g, shape, names);
    nn::Sequential model;
    model.append("moe", std::make_shared<nn::MoE>(mesh, config, 5));
    if (!ep.empty()) parallel::parallelize_module(model, mesh[ep], {{"moe", parallel::ExpertParallel{}}});
    if (!tp.empty()) parallel::parallelize_module(model, mesh[tp], {{"moe", parallel::ExpertParallel{.hidden = true}}});
    // Tokens: the batch over every mesh dim but tp.
    Placements layout;
    std::vector<std::string> token_dims;
    for (const std::string& n : names) {
      layout.push_back(n == tp ? Placement(Replicate()) : Placement(Shard(0)));
      if (n != tp && n != names[0]) token_dims.push_back(n);
    }
    std::unique_ptr<parallel::DistributedDataParallel> ddp;
    if (fsdp) {
      parallel::fully_shard(model, mesh, {.stage = 3, .shard_dim = names[0]});
    } else if (names[0] != tp) {
      ddp = std::make_unique<parallel::DistributedDataParallel>(
          model, parallel::DDPOptions{.dp_dim = names[0], .token_dims = token_dims});
    }
    AdamW optimizer(model.parameters(), {.lr = 1e-2});
    std::vector<double> losses;
    for (int64_t step = 0; step < 10; ++step) {
      const DistTensor x =
          distribute(Tensor::randn({8, 3, config.dim}, 20 + static_cast<uint64_t>(step)), mesh, layout);
      const DistTensor y = add(x, model(x));
      const DistTensor loss = mean(mul(y, y));
      loss.backward();
      if (ddp) ddp->wait_for_gradients();
      optimizer.step();
      optimizer.zero_grad();
      losses.push_back(loss.full_tensor().item<double>());
    }
    return testing::TrainingRun{.losses = losses, .params = model.state_dict()};
  });
}

TEST(MoE, TrainsAsOneRankUnderDataExpertAndTensorParallel) {
  for (const int64_t k : {1, 2}) {
    for (const double capacity : {0.0, 0.75}) {
      nn::MoEConfig c = small();
      c.top_k = k;
      c.capacity_factor = capacity;
      c.shared_expert = capacity > 0;
      const std::string what = "top-" + std::to_string(k) + (capacity > 0 ? " capacity 0.75, shared" : " dropless");
      const testing::TrainingRun one = train({1}, {"dp"}, c);
      testing::expect_equivalent(train({2}, {"dp"}, c), one, "DP=2 " + what);
      testing::expect_equivalent(train({2}, {"ep"}, c, "ep"), one, "EP=2 " + what);
      testing::expect_equivalent(train({4}, {"ep"}, c, "ep"), one, "EP=4 " + what);
      testing::expect_equivalent(train({2, 2}, {"dp", "ep"}, c, "ep"), one, "DP=2 x EP=2 " + what);
      testing::expect_equivalent(train({2, 2}, {"dp", "tp"}, c, "", "tp"), one, "DP=2 x TP=2 experts " + what);
      testing::expect_equivalent(train({4}, {"dp"}, c, "", "", true), one, "FSDP=4 " + what);
    }
  }
}

// Expert parallel: two all-to-alls in forward (dispatch, combine) and two in backward,
// and one all-gather of the per-expert counts; the experts' gradients stay on their
// ranks (DDP reduces only the router's).
TEST(MoE, ExpertParallelRunsTwoAllToAllsEachWay) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"ep"});
    nn::MoEConfig c = small();
    nn::Sequential model;
    auto moe = std::make_shared<nn::MoE>(mesh, c, 5);
    model.append("moe", moe);
    parallel::parallelize_module(model, mesh["ep"], {{"moe", parallel::ExpertParallel{}}});
    const DistTensor x = distribute(Tensor::randn({8, c.dim}, 3), mesh, {Shard(0)}).set_requires_grad();
    CommDebugMode forward;
    const DistTensor y = model(x);
    EXPECT_EQ(forward.count("all_to_all"), 2) << forward.to_string();
    EXPECT_EQ(forward.count("all_gather"), 1) << forward.to_string();
    const DistTensor loss = sum(y);
    CommDebugMode backward;
    loss.backward();
    EXPECT_EQ(backward.count("all_to_all"), 2) << backward.to_string();
    for (auto& [name, p] : moe->named_parameters()) {
      if (name.rfind("experts_", 0) == 0) EXPECT_EQ(p.grad().placements(), (Placements{Shard(0)})) << name;
    }
  });
}

TEST(MoE, BadInputIsAnError) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"ep"});
    EXPECT_THROW_MSG(nn::MoE(mesh, {.experts = 4, .top_k = 5}, 1), std::invalid_argument, "1 <= top_k <= experts");
    nn::MoE moe(mesh, small(), 1);
    EXPECT_THROW_MSG(moe(distribute(Tensor::randn({4, 6}, 1), mesh, {Shard(0)})), std::invalid_argument,
                     "expected input [..., 8], got [4, 6]");
    nn::Sequential model;
    model.append("moe", std::make_shared<nn::MoE>(mesh, small(), 1));
    parallel::parallelize_module(model, mesh["ep"], {{"moe", parallel::ExpertParallel{}}});
    EXPECT_THROW_MSG(model(distribute(Tensor::randn({4, 8}, 1), mesh, {Replicate()})), std::invalid_argument,
                     "needs the tokens sharded over it too");
    nn::Sequential not_moe;
    not_moe.append("lin", std::make_shared<nn::Linear>(mesh, 8, 8, false, 1));
    EXPECT_THROW_MSG(parallel::parallelize_module(not_moe, mesh["ep"], {{"lin", parallel::ExpertParallel{}}}),
                     std::invalid_argument, "the style fits nn::MoE");
  });
}

}  // namespace
}  // namespace dtensor
