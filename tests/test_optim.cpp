// Optimizers against hand-written double-precision references of PyTorch's update
// formulas, sharded state, gradient layouts, clipping across meshes, LR schedules.
#include <cmath>

#include "backend/kernels.h"
#include "backend/optim_math.h"
#include "dtensor/comm_debug.h"
#include "dtensor/data.h"
#include "dtensor/ops.h"
#include "dtensor/optim.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

std::vector<double> values(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }
std::vector<double> values(const DistTensor& t) { return values(t.full_tensor()); }

// The gradient of step k: the same global tensor for every layout.
Tensor step_grad(const Shape& shape, int k) { return Tensor::randn(shape, 100 + static_cast<uint64_t>(k)); }

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " at " << i;
  }
}

// torch.optim.SGD in double.
struct SgdReference {
  SGDOptions o;
  std::vector<double> p, buf;
  void step(const std::vector<double>& g) {
    const bool first = buf.empty();
    if (first) buf.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = first ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
};

// torch.optim.AdamW in double.
struct AdamWReference {
  AdamWOptions o;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<double>& g) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      p[i] -= o.lr / (1 - std::pow(o.beta1, t)) * m[i] / denom;
    }
  }
};

DistTensor make_param(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  DistTensor p = distribute(full, mesh, placements);
  p.set_requires_grad();
  return p;
}

}  // namespace

TEST(Optim, SgdMatchesReferenceForEveryOptionCombination) {
  const Shape shape{4, 3};
  std::vector<SGDOptions> cases(4);
  cases[0].lr = 0.1;
  cases[1] = {0.05, 0.9, 0.1, 0.0, false, false};
  cases[2] = {0.05, 0.9, 0.0, 0.01, true, false};
  cases[3] = {0.2, 0.0, 0.0, 0.05, false, false};
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    for (size_t c = 0; c < cases.size(); ++c) {
      DistTensor p = make_param(Tensor::randn(shape, 7), mesh, {Replicate()});
      SGD opt({p}, cases[c]);
      SgdReference ref{cases[c], values(p), {}};
      for (int k = 0; k < 4; ++k) {
        p.set_grad(distribute(step_grad(shape, k), mesh, {Replicate()}));
        opt.step();
        ref.step(values(step_grad(shape, k)));
        expect_near_all(values(p), ref.p, 1e-5, "sgd case " + std::to_string(c) + " step " + std::to_string(k));
      }
      if (cases[c].momentum != 0) {
        expect_near_all(values(opt.state(0).tensors.at("momentum_buffer")), ref.buf, 1e-5, "momentum buffer");
      } else {
        EXPECT_TRUE(opt.state(0).tensors.empty());
      }
      EXPECT_EQ(opt.state(0).step, 4);
    }
  });
}

TEST(Optim, AdamWMatchesReferenceOverSeveralSteps) {
  const Shape shape{5, 2};
  AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    DistTensor p = make_param(Tensor::randn(shape, 3), mesh, {Replicate()});
    AdamW opt({p}, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
    AdamWReference ref{o, values(p)};
    for (int k = 0; k < 6; ++k) {
      // A learning-rate change between steps takes effect at once, as in PyTorch.
      if (k == 3) opt.set_lr(ref.o.lr = 0.003);
      p.set_grad(distribute(step_grad(shape, k), mesh, {Replicate()}));
      opt.step();
      ref.step(values(step_grad(shape, k)));
      expect_near_all(values(p), ref.p, 1e-5, "adamw step " + std::to_string(k));
    }
    expect_near_all(values(opt.state(0).tensors.at("exp_avg")), ref.m, 1e-5, "exp_avg");
    expect_near_all(values(opt.state(0).tensors.at("exp_avg_sq")), ref.v, 1e-5, "exp_avg_sq");
  });
}

// The fused kernel of this CPU's vector ISA (the suite also runs capped to AVX2 and
// the baseline) against backend/optim_math.h's scalar update, which the CUDA kernel
// runs: the same float operations, so within a few ulp (FMA contraction may differ;
// the baseline build has no FMA and matches exactly).
TEST(Optim, FusedAdamWKernelMatchesTheSharedScalarUpdate) {
  for (DType grad_dtype : {DType::F32, DType::BF16}) {
    const int64_t n = 1003;  // not a multiple of any vector width: the tail too
    Tensor p = Tensor::randn({n}, 1), m = Tensor::zeros({n}), v = Tensor::zeros({n});

    backend::AdamWStep step;
    step.lr = 0.01;
    step.beta1 = 0.9;
    step.beta2 = 0.95;
    step.eps = 1e-8;
    step.weight_decay = 0.1;
    for (int k = 1; k <= 5; ++k) {
      step.step = k;
      const Tensor g = (Tensor::randn({n}, 10 + static_cast<uint64_t>(k)) * (k == 3 ? 1e-4 : 1.0)).to(grad_dtype);
      // Each step from the kernel's own state, so that only this step's rounding counts.
      std::vector<float> rp = p.to_vector<float>(), rm = m.to_vector<float>(), rv = v.to_vector<float>();
      ASSERT_TRUE(backend::kernels_for(Device::cpu()).adamw_step(step, p, g, m, v));
      const std::vector<float> gv = g.to(DType::F32).to_vector<float>();
      const backend::AdamWFactors f = backend::adamw_factors(step);
      const std::vector<float> m_before = rm;
      for (int64_t i = 0; i < n; ++i) backend::adamw_update(f, rp[i], gv[i], rm[i], rv[i]);
      const std::string what = std::string(dtype_name(grad_dtype)) + " step " + std::to_string(k);
      const std::vector<float> gp = p.to_vector<float>(), gm = m.to_vector<float>(), gvv = v.to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(gp[i], rp[i], 4e-7 * (1 + std::fabs(rp[i]))) << what << " param " << i;
        // beta1 m + (1 - beta1) g may cancel: the bound is the terms' rounding.
        ASSERT_NEAR(gm[i], rm[i], 4e-7 * (std::fabs(m_before[i]) + std::fabs(gv[i]))) << what << " exp_avg " << i;
        ASSERT_NEAR(gvv[i], rv[i], 4e-7 * std::fabs(rv[i]) + 1e-15f) << what << " exp_avg_sq " << i;
      }
    }
  }
  // The constants: decay and the bias corrections of step t, rounded to float once.
  backend::AdamWStep step;
  step.lr = 0.5;
  step.beta1 = 0.5;
  step.beta2 = 0.75;
  step.weight_decay = 0.5;
  step.step = 2;
  const backend::AdamWFactors f = backend::adamw_factors(step);
  EXPECT_EQ(f.decay, 0.75f);
  EXPECT_EQ(f.step_size, 0.5f / 0.75f);
  EXPECT_EQ(f.inv_sqrt_bias_correction2, 1.0f / std::sqrt(0.4375f));
}

TEST(Optim, ShardedParametersGetShardedStateAndTheOneRankResult) {
  const Shape shape{5, 3};  // 5 rows on 2 ranks: uneven shards of 3 and 2
  AdamWOptions o;
  o.lr = 0.02;
  AdamWReference ref{o, values(Tensor::randn(shape, 11))};
  for (int k = 0; k < 3; ++k) ref.step(values(step_grad(shape, k)));
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor p = make_param(Tensor::randn(shape, 11), mesh, {Shard(0)});
    AdamW opt({p}, o);
    for (int k = 0; k < 3; ++k) {
      p.set_grad(distribute(step_grad(shape, k), mesh, {Shard(0)}));
      CommDebugMode comm;
      opt.step();
      EXPECT_EQ(comm.total_count(), 0) << "a sharded update needs no communication:\n" << comm.to_string();
    }
    const DistTensor& m = opt.state(0).tensors.at("exp_avg");
    EXPECT_EQ(m.placements(), Placements{Shard(0)});
    EXPECT_EQ(m.to_local().shape(), p.to_local().shape());
    EXPECT_EQ(p.to_local().size(0), world.rank() == 0 ? 3 : 2);
    expect_near_all(values(p), ref.p, 1e-5, "sharded param");
    expect_near_all(values(m), ref.m, 1e-5, "sharded exp_avg");
  });
}

TEST(Optim, PartialGradientIsAllReducedOnceAndSharedWithClipping) {
  const Shape shape{3, 4};
  SgdReference ref{{0.1, 0.9, 0, 0, false, false}, values(Tensor::randn(shape, 5))};
  ref.step(values(step_grad(shape, 0)));
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor p = make_param(Tensor::randn(shape, 5), mesh, {Replicate()});
    SGD opt({p}, 0.1, 0.9);
    // Data parallel: each rank holds a part of the gradient (rank r: (r+1)/3 of it).
    const Tensor part = mul(step_grad(shape, 0), (world.rank() + 1) / 3.0);
    p.set_grad(DistTensor::from_local(part, mesh, {Partial()}, shape));
    CommDebugMode comm;
    const double norm = clip_grad_norm({p}, 1e9);  // all-reduces the gradient, stores it back
    opt.step();                                    // reuses it: no second all-reduce
    EXPECT_EQ(comm.count("all_reduce"), 1) << comm.to_string();
    EXPECT_EQ(p.grad().placements(), Placements{Replicate()});
    double expected_sq = 0;
    for (double g : values(step_grad(shape, 0))) expected_sq += g * g;
    EXPECT_NEAR(norm, std::sqrt(expected_sq), 1e-5);
    expect_near_all(values(p), ref.p, 1e-5, "param after a Partial gradient");
  });
}

TEST(Optim, ClipGradNormIsTheNormOfTheFullGradientsOnATwoByTwoMesh) {
  struct ParamCase {
    Shape shape;
    Placements param, grad;
  };
  const std::vector<ParamCase> cases{
      {{4, 3}, {Replicate(), Replicate()}, {Replicate(), Replicate()}},
      {{5, 2}, {Shard(0), Replicate()}, {Shard(0), Replicate()}},
      {{3, 5}, {Shard(0), Shard(1)}, {Shard(0), Shard(1)}},
      {{7}, {Replicate(), Shard(0)}, {Partial(), Shard(0)}},        // mixed: dp-partial, tp-sharded
      {{2, 2}, {Replicate(), Replicate()}, {Partial(), Partial()}},  // both dims partial
  };
  double full_sq = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (double g : values(step_grad(cases[i].shape, static_cast<int>(i)))) full_sq += g * g;
  }
  const double full_norm = std::sqrt(full_sq);
  for (const double max_norm : {full_norm / 2, full_norm * 2}) {
    launch(4, [&](Group world) {
      DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
      std::vector<DistTensor> params;
      for (size_t i = 0; i < cases.size(); ++i) {
        params.push_back(make_param(Tensor::randn(cases[i].shape, 20 + i), mesh, cases[i].param));
        const Tensor g = step_grad(cases[i].shape, static_cast<int>(i));
        params.back().set_grad(distribute(g, mesh, cases[i].grad));
      }
      DistTensor no_grad = make_param(Tensor::ones({3}), mesh, {Replicate(), Replicate()});
      params.push_back(no_grad);  // skipped: counts for nothing
      const double norm = clip_grad_norm(params, max_norm);
      EXPECT_NEAR(norm, full_norm, 1e-5 * full_norm);
      const double scale = max_norm < full_norm ? max_norm / (full_norm + 1e-6) : 1.0;
      for (size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(params[i].grad().placements(), cases[i].param);
        std::vector<double> want = values(step_grad(cases[i].shape, static_cast<int>(i)));
        for (double& w : want) w *= scale;
        expect_near_all(values(params[i].grad()), want, 1e-5, "clipped gradient " + std::to_string(i));
      }
      EXPECT_NEAR(grad_norm(params), std::min(full_norm, max_norm), 1e-4 * full_norm);
    });
  }
}

TEST(Optim, ParametersWithoutGradientsAreSkipped) {
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    DistTensor a = make_param(Tensor::ones({2}), mesh, {Replicate()});
    DistTensor b = make_param(Tensor::ones({2}), mesh, {Replicate()});
    AdamW opt({a, b}, 0.1);
    a.set_grad(distribute(Tensor::ones({2}), mesh, {Replicate()}));
    opt.step();
    EXPECT_EQ(values(b), (std::vector<double>{1, 1}));
    EXPECT_TRUE(opt.state(1).tensors.empty());
    EXPECT_EQ(opt.state(1).step, 0);
    EXPECT_LT(values(a)[0], 1.0);
    opt.zero_grad();
    EXPECT_FALSE(a.grad().defined());
  });
}

TEST(Optim, MasterWeightsKeepSmallUpdatesThatBf16Loses) {
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    auto run = [&](bool master) {
      DistTensor p = make_param(Tensor::ones({4}, DType::BF16), mesh, {Replicate()});
      SGDOptions o;
      o.lr = 1e-3;
      o.master_weights = master;
      SGD opt({p}, o);
      for (int k = 0; k < 10; ++k) {
        p.set_grad(distribute(Tensor::ones({4}, DType::BF16), mesh, {Replicate()}));
        opt.step();
      }
      EXPECT_EQ(p.dtype(), DType::BF16);
      return std::make_pair(values(p)[0], master ? values(opt.state(0).tensors.at("master"))[0] : 0.0);
    };
    // 1 - 0.001 rounds back to 1 in BF16 (8 bits of mantissa): without a master copy
    // ten steps change nothing.
    EXPECT_EQ(run(false).first, 1.0);
    const auto [param, master] = run(true);
    EXPECT_NEAR(master, 0.99, 1e-6);
    EXPECT_EQ(param, static_cast<double>(static_cast<float>(bf16(static_cast<float>(master)))));
  });
}

TEST(Optim, StateDictRoundTripContinuesIdentically) {
  const Shape shape{3, 2};
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor a = make_param(Tensor::randn(shape, 1), mesh, {Shard(0)});
    AdamW first({a}, 0.01);
    for (int k = 0; k < 2; ++k) {
      a.set_grad(distribute(step_grad(shape, k), mesh, {Shard(0)}));
      first.step();
    }
    DistTensor b = make_param(a.full_tensor(), mesh, {Shard(0)});
    AdamW second({b}, 0.01);
    // The saved state arrives replicated (as from a checkpoint of full tensors).
    std::map<std::string, DistTensor> saved;
    for (const auto& [key, t] : first.state_dict()) saved[key] = t.redistribute({Replicate()});
    second.load_state_dict(saved, first.step_counts());
    EXPECT_EQ(second.state(0).tensors.at("exp_avg").placements(), Placements{Shard(0)});
    a.set_grad(distribute(step_grad(shape, 2), mesh, {Shard(0)}));
    b.set_grad(distribute(step_grad(shape, 2), mesh, {Shard(0)}));
    first.step();
    second.step();
    EXPECT_EQ(values(a), values(b));
    EXPECT_THROW_MSG(second.load_state_dict({{"7.exp_avg", a}}, {}), std::invalid_argument,
                     "parameter index 7 out of range");
  });
}

TEST(Optim, LoadStateDictRejectsUnknownAndMissingKeysAndChangesNothing) {
  const Shape shape{3, 2};
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    DistTensor a = make_param(Tensor::randn(shape, 1), mesh, {Replicate()});
    DistTensor b = make_param(Tensor::randn(shape, 2), mesh, {Replicate()});
    AdamW first({a, b}, 0.01);
    a.set_grad(distribute(step_grad(shape, 0), mesh, {Replicate()}));
    first.step();  // b has no gradient: it stays at step 0 without state
    const auto tensors = first.state_dict();
    const auto steps = first.step_counts();
    AdamW second({a, b}, 0.01);
    auto unknown = tensors;
    unknown["0.momentum"] = a;
    EXPECT_THROW_MSG(second.load_state_dict(unknown, steps), std::invalid_argument,
                     "[AdamW] state \"0.momentum\": parameter 0 keeps no state named \"momentum\" (it keeps: "
                     "exp_avg, exp_avg_sq)");
    auto missing = tensors;
    missing.erase("0.exp_avg_sq");
    EXPECT_THROW_MSG(second.load_state_dict(missing, steps), std::invalid_argument,
                     "missing state \"0.exp_avg_sq\" of parameter 0, which has taken 1 steps");
    EXPECT_THROW_MSG(second.load_state_dict(tensors, {{"0.step", 1}}), std::invalid_argument, "missing \"1.step\"");
    EXPECT_EQ(second.state(0).step, 0) << "a rejected state changes nothing";
    EXPECT_TRUE(second.state(0).tensors.empty());
    second.load_state_dict(missing, {{"0.step", 1}}, /*strict=*/false);  // a part, on purpose
    EXPECT_EQ(second.state(0).step, 1);
    second.load_state_dict(tensors, steps);
    EXPECT_EQ(second.state(0).tensors.size(), 2u);
    SGD momentum({a}, {.lr = 0.1, .momentum = 0.9});
    EXPECT_EQ(momentum.state_names(0), std::vector<std::string>{"momentum_buffer"});
    EXPECT_TRUE(SGD({a}, 0.1).state_names(0).empty());
  });
}

TEST(Optim, BadArguments) {
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    DistTensor p = make_param(Tensor::ones({2}), mesh, {Replicate()});
    EXPECT_THROW_MSG(SGD({p}, 0.1, 0.0, 0.0, true), std::invalid_argument,
                     "[SGD] nesterov needs momentum > 0");
    EXPECT_THROW_MSG(AdamW({p}, -1.0), std::invalid_argument, "expected a learning rate >= 0, got -1");
    EXPECT_THROW_MSG(AdamW({p}, 0.1, 1.0), std::invalid_argument, "expected 0 <= beta1 < 1, got 1");
    EXPECT_THROW_MSG(SGD({p, p}, 0.1), std::invalid_argument, "parameter 1 repeats parameter 0");
    EXPECT_THROW_MSG(clip_grad_norm({p}, 0.0), std::invalid_argument, "expected max_norm > 0");
  });
}

TEST(LRSchedule, WarmupThenCosineToMinimum) {
  const WarmupCosine s(1.0, 4, 14, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.75);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1.0);
  EXPECT_NEAR(s.lr_at(9), 0.55, 1e-12);  // halfway through the decay
  EXPECT_NEAR(s.lr_at(13), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.9)), 1e-12);
  EXPECT_DOUBLE_EQ(s.lr_at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.1);
  for (int64_t step = 4; step < 14; ++step) EXPECT_LT(s.lr_at(step + 1), s.lr_at(step));
  EXPECT_DOUBLE_EQ(WarmupCosine(2.0, 0, 10).lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(ConstantLR(0.3).lr_at(99), 0.3);
  EXPECT_THROW_MSG(WarmupCosine(1.0, 10, 5), std::invalid_argument,
                   "expected 0 <= warmup_steps <= total_steps, got warmup_steps 10 and total_steps 5");
  EXPECT_THROW_MSG(WarmupCosine(1.0, 1, 5, 2.0), std::invalid_argument, "min_lr <= base_lr");
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    DistTensor p = make_param(Tensor::ones({1}), mesh, {Replicate()});
    SGD opt({p}, 1.0);
    EXPECT_DOUBLE_EQ(s.apply(opt, 0), 0.25);
    EXPECT_DOUBLE_EQ(opt.lr(), 0.25);
  });
}

namespace {

// Trains a bigram model (logits = a learnt [V, V] table looked up by the current
// token) on the synthetic language with AdamW, data-parallel over `dp` ranks with a
// replicated table. Returns the loss of every step (rank 0's view of the global loss).
std::vector<double> train_bigram(int dp, int steps) {
  const int64_t vocab = 16, seq = 16, global_batch = 8;
  SyntheticLanguage data(vocab, seq, 512, 3);
  std::vector<double> losses(static_cast<size_t>(steps));
  launch(dp, [&](Group world) {
    DeviceMesh mesh(world, {dp}, {"dp"});
    DistTensor table = make_param(mul(Tensor::randn({vocab, vocab}, 1), 0.02), mesh, {Replicate()});
    AdamW opt({table}, 0.05, 0.9, 0.99, 1e-8, 0.0);
    DistributedSampler sampler(data.size(), global_batch, world.rank(), dp, 4);
    for (int step = 0; step < steps; ++step) {
      const TokenBatch batch = data.get_batch(sampler.batch_at(step));
      const int64_t local_rows = batch.inputs.numel();
      const Shape rows{global_batch * seq};
      const DistTensor ids = DistTensor::from_local(batch.inputs.reshape({local_rows}), mesh, {Shard(0)}, rows);
      const DistTensor targets = DistTensor::from_local(batch.targets.reshape({local_rows}), mesh, {Shard(0)}, rows);
      const DistTensor loss = cross_entropy(embedding(table, ids), targets);
      loss.backward();
      clip_grad_norm({table}, 1.0);
      opt.step();
      opt.zero_grad();
      const double value = loss.full_tensor().item<double>();
      if (world.rank() == 0) losses[static_cast<size_t>(step)] = value;
    }
  });
  return losses;
}

}  // namespace

TEST(Optim, DataParallelBigramTrainingMatchesOneRankAndLearnsTheLanguage) {
  const int steps = 150;
  const std::vector<double> one = train_bigram(1, steps);
  const std::vector<double> two = train_bigram(2, steps);
  expect_near_all(two, one, 1e-4, "dp=2 vs dp=1 loss");
  EXPECT_NEAR(one.front(), std::log(16.0), 0.1);  // untrained: uniform over the vocabulary
  double tail = 0;
  for (int s = steps - 20; s < steps; ++s) tail += one[static_cast<size_t>(s)] / 20;
  // The chain's entropy (0.80) is the floor; the bigram table gets close to it.
  EXPECT_LT(tail, 1.0);
  EXPECT_GT(tail, SyntheticLanguage(16, 16, 1, 3).optimal_loss() - 0.15);
}
