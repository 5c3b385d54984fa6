// Training: parallel equivalence of data-parallel GPT training with one rank, DDP's
// all-reduce count and overlap, gradient accumulation, activation checkpointing and
// loss scaling.
#include "dtensor/amp.h"
#include "dtensor/data.h"
#include "dtensor/models/gpt.h"
#include "dtensor/nn/checkpoint.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/ddp.h"
#include "dtensor/parallel/trainer.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

// Two linear layers; with a sum loss its backward needs no communication of its own.
class TwoLayers : public nn::Module {
 public:
  explicit TwoLayers(const DeviceMesh& mesh) {
    first_ = register_module("first", std::make_shared<nn::Linear>(mesh, 8, 16, true, 1));
    second_ = register_module("second", std::make_shared<nn::Linear>(mesh, 16, 4, true, 2));
  }
  DistTensor forward(const DistTensor& x) override { return (*second_)(relu((*first_)(x))); }

 private:
  std::shared_ptr<nn::Linear> first_, second_;
};

// `steps` steps of AdamW on the synthetic task with a global batch of 8 sequences,
// data parallel over `world` ranks, `accum` micro-batches per step.
dtensor::testing::TrainingRun train(int world, int accum, int steps, DType compute = DType::F32,
                                    bool checkpoint = false) {
  dtensor::testing::TrainingRun result;
  const models::GPTConfig config = [&] {
    models::GPTConfig c = dtensor::testing::tiny_gpt();
    c.checkpoint_activations = checkpoint;
    return c;
  }();
  const int64_t global_batch = 8;
  launch(world, [&](Group g) {
    DeviceMesh mesh(g, {world}, {"dp"});
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    DistributedSampler sampler(data.size(), global_batch, mesh.coordinate(0), world, 5, true, accum);
    models::GPT model(mesh, config, 42);
    parallel::DistributedDataParallel ddp(model, {.bucket_cap_mb = 0.001});
    AdamW optimizer(model.parameters(), 1e-2);
    std::optional<DType> precision;
    if (compute != DType::F32) precision = compute;
    parallel::Trainer trainer(optimizer, {.grad_accum = accum, .compute_dtype = precision, .sync = &ddp});
    const Shape micro{global_batch / accum, config.block_size};
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      const parallel::StepReport report = trainer.step(step, [&](int64_t m) {
        const TokenBatch batch = data.get_batch(sampler.micro_batch_at(step, m));
        const DistTensor ids = DistTensor::from_local(batch.inputs, mesh, {Shard(0)}, micro);
        const DistTensor targets = DistTensor::from_local(batch.targets, mesh, {Shard(0)}, micro);
        return model.loss(ids, targets);
      });
      losses.push_back(report.stats.loss);
    }
    const auto params = model.state_dict();
    if (g.rank() == 0) {
      result.losses = losses;
      result.params = params;
    }
  });
  return result;
}

}  // namespace

TEST(Train, DataParallelMatchesOneRank) {
  const dtensor::testing::TrainingRun one = train(1, 1, 10);
  ASSERT_LT(one.losses.back(), one.losses.front()) << "the loss should fall";
  dtensor::testing::expect_equivalent(train(2, 1, 10), one, "DP=2");
  dtensor::testing::expect_equivalent(train(4, 1, 10), one, "DP=4");
  dtensor::testing::expect_equivalent(train(2, 2, 10), one, "DP=2 with 2 accumulation steps");
}

TEST(Train, Bf16TracksF32) {
  const dtensor::testing::TrainingRun f32 = train(1, 1, 10);
  const dtensor::testing::TrainingRun bf16 = train(2, 1, 10, DType::BF16);
  for (size_t i = 0; i < f32.losses.size(); ++i) {
    // BF16 keeps 8 bits of mantissa: losses within 5% of the F32 curve.
    EXPECT_NEAR(bf16.losses[i], f32.losses[i], 0.05 * f32.losses[i]) << "step " << i;
  }
}

TEST(Train, CheckpointedActivationsGiveTheSameTraining) {
  dtensor::testing::expect_equivalent(train(2, 1, 3, DType::F32, true), train(2, 1, 3), "checkpointed");
  // The recomputation in backward runs in the forward's compute dtype.
  dtensor::testing::expect_equivalent(train(2, 1, 3, DType::BF16, true), train(2, 1, 3, DType::BF16),
                                      "checkpointed bf16");
}

TEST(Train, CheckpointingLowersPeakMemory) {
  auto peak_of_backward = [](bool checkpoint) {
    int64_t peak = 0;
    launch(1, [&](Group g) {
      DeviceMesh mesh(g, {1});
      models::GPTConfig c = dtensor::testing::tiny_gpt();
      c.layers = 4;
      c.block_size = 64;
      c.dim = 64;
      c.checkpoint_activations = checkpoint;
      models::GPT model(mesh, c, 1);
      SyntheticLanguage data(c.vocab, c.block_size, 16, 3);
      const TokenBatch batch = data.get_batch({0, 1, 2, 3, 4, 5, 6, 7});
      const DistTensor ids = distribute(batch.inputs, mesh, {Replicate()});
      const DistTensor targets = distribute(batch.targets, mesh, {Replicate()});
      reset_peak_memory();
      const int64_t before = memory_stats().live_bytes;
      model.loss(ids, targets).backward();
      peak = memory_stats().peak_bytes - before;
    });
    return peak;
  };
  const int64_t full = peak_of_backward(false), checkpointed = peak_of_backward(true);
  EXPECT_LT(checkpointed, full) << "checkpointed peak " << checkpointed << " vs " << full;
}

TEST(Train, DdpAllReducesOncePerBucketAndOverlapsBackward) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2}, {"dp"});
    TwoLayers model(mesh);
    // Gradients of 16, 256, 64 and 512 bytes (in backward order) under a 300-byte
    // cap: buckets {second.bias, second.weight}, {first.bias}, {first.weight}.
    parallel::DistributedDataParallel ddp(model, {.bucket_cap_mb = 300.0 / (1 << 20)});
    ASSERT_EQ(ddp.num_buckets(), 3);
    const Tensor x = Tensor::randn({6, 8}, 1);
    const DistTensor xs = distribute(x, mesh, {Shard(0)});
    const DistTensor loss = sum(model(xs));
    CommDebugMode comm;
    loss.backward();
    ddp.wait_for_gradients();
    EXPECT_EQ(comm.count("all_reduce"), ddp.num_buckets()) << comm.to_string();
    EXPECT_EQ(comm.total_count(), ddp.num_buckets()) << comm.to_string();
    EXPECT_EQ(ddp.stats().all_reduces, ddp.num_buckets());
    // The first buckets started while backward still had gradients to produce.
    EXPECT_GE(ddp.stats().launched_during_backward, 1);
    // And the reduced gradients are those of the full batch on one rank.
    const auto grads = model.named_parameters();
    launch(1, [&](Group one) {
      DeviceMesh single(one, {1});
      TwoLayers reference(single);
      sum(reference(distribute(x, single, {Replicate()}))).backward();
      const auto expected = reference.named_parameters();
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_TRUE(allclose(grads[i].second.grad().to_local(), expected[i].second.grad().to_local(), 1e-5, 1e-6))
            << expected[i].first;
      }
    });
    for (const DistTensor& p : model.parameters()) EXPECT_TRUE(p.grad().placements()[0].is_replicate());
  });
}

TEST(Train, LossScalingSkipsTheStepOnEveryRankWhenOneOverflows) {
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    DistTensor w = distribute(Tensor::ones({4}), mesh, {Replicate()}).set_requires_grad();
    LossScaler scaler({.initial_scale = 1024, .growth_interval = 1});
    scaler.scale(sum(mul(w, 3.0))).backward();
    // Rank 1 gets an infinite gradient (an overflow in its half of the batch).
    if (g.rank() == 1) {
      Tensor local = w.grad().to_local();
      local.fill_(INFINITY);
    }
    EXPECT_FALSE(scaler.unscale_and_check({w}));
    scaler.update();
    EXPECT_EQ(scaler.scale_value(), 512);
    EXPECT_EQ(scaler.skipped_steps(), 1);
    w.zero_grad();
    scaler.scale(sum(mul(w, 3.0))).backward();
    EXPECT_TRUE(scaler.unscale_and_check({w}));
    EXPECT_TRUE(allclose(w.grad().to_local(), Tensor::full({4}, 3.0), 1e-6, 0));
    scaler.update();
    EXPECT_EQ(scaler.scale_value(), 1024);  // grows after growth_interval clean steps
  });
}

// What counts as an overflow: any NaN, any infinity (also +inf beside -inf, whose sum
// is NaN), on any rank; large finite FP16 gradients (whose FP16 sum would overflow) do
// not.
TEST(Train, LossScalingFindsEveryNonFiniteGradientAndOnlyThose) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    auto check = [&](Tensor grad) {
      DistTensor w = distribute(Tensor::zeros(grad.shape(), grad.dtype()), mesh, {Replicate()}).set_requires_grad();
      w.set_grad(distribute(grad, mesh, {Replicate()}));
      LossScaler scaler({.initial_scale = 1});
      return scaler.unscale_and_check({w});
    };
    EXPECT_FALSE(check(Tensor::from_vector(std::vector<float>{1, NAN, 2})));
    EXPECT_FALSE(check(Tensor::from_vector(std::vector<float>{INFINITY, 1, -INFINITY})));
    EXPECT_FALSE(check(Tensor::from_vector(std::vector<float>{-INFINITY})));
    EXPECT_TRUE(check(Tensor::from_vector(std::vector<float>{1e30F, -1e30F, 3})));
    EXPECT_TRUE(check(Tensor::from_vector(std::vector<float>{3e38F, 3e38F})));  // whose sum overflows F32
    EXPECT_TRUE(check(Tensor::zeros({0})));
    EXPECT_TRUE(check(Tensor::full({4096}, 60000.0, DType::F16)));  // sums to 2.5e8, beyond FP16's 65504
    EXPECT_FALSE(check(Tensor::from_vector(std::vector<float>{1, NAN}).to(DType::BF16)));
  });
}

namespace {

// A linear layer scaled by a learned scalar: DDP's bucket holds a 0-d gradient too.
class ScaledLinear : public nn::Module {
 public:
  explicit ScaledLinear(const DeviceMesh& mesh) {
    linear_ = register_module("linear", std::make_shared<nn::Linear>(mesh, 6, 3, true, 4));
    scale_ = &register_parameter("scale", distribute(Tensor::full({}, 1.5), mesh, {Replicate()}));
  }
  DistTensor forward(const DistTensor& x) override { return (*linear_)(x) * *scale_; }

 private:
  std::shared_ptr<nn::Linear> linear_;
  DistTensor* scale_;
};

}  // namespace

TEST(Train, DdpBucketsHoldScalarsAndMatchOneRank) {
  auto run = [](int world) {
    return dtensor::testing::train_on_ranks(world, [&](Group g) {
      DeviceMesh mesh(g, {world}, {"dp"});
      ScaledLinear model(mesh);
      parallel::DistributedDataParallel ddp(model);
      SGD optimizer(model.parameters(), 0.1);
      parallel::Trainer trainer(optimizer, {.sync = &ddp});
      dtensor::testing::TrainingRun mine;
      for (int64_t step = 0; step < 3; ++step) {
        const Tensor x = Tensor::randn({4, 6}, 10 + static_cast<uint64_t>(step));
        mine.losses.push_back(trainer
                                  .step(step,
                                        [&](int64_t) {
                                          const DistTensor y = model(distribute(x, mesh, {Shard(0)}));
                                          return mean(y * y);
                                        })
                                  .stats.loss);
      }
      mine.params = model.state_dict();
      return mine;
    });
  };
  dtensor::testing::expect_equivalent(run(2), run(1), "DDP=2 with a 0-d parameter");
}
