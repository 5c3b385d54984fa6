// DistTensors, autograd and training on the GPU (label cuda): DistTensor::to(Device)
// and its gradient, nn::Module::to(Device), and GPT training on one GPU, one rank,
// DDP and FSDP (ZeRO-3) with two ranks sharing it, and a 2-stage pipeline (its
// activations and gradients sent between the ranks as CUDA tensors), against the
// same training on the CPU; DDP and FSDP on the nccl backend, one GPU per rank (two
// GPUs or more). Skips with a message where no GPU is visible, except the checks that
// need none.
#include "backend/cuda/cuda_runtime.h"
#include "dtensor/data.h"
#include "dtensor/models/gpt.h"
#include "dtensor/models/gpt_pipeline.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/ddp.h"
#include "dtensor/parallel/fsdp.h"
#include "dtensor/parallel/trainer.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

// `steps` steps of AdamW with a global batch of 8, data parallel over `world` ranks
// (DDP, or FSDP stage 3 per block), the model and the batches on `device`; with
// `moe`, the blocks' MLPs are mixtures of 4 experts, top-2 (routing on the device);
// with `nccl`, over init("nccl"), each rank on the GPU of its rank (`device` unused).
dtensor::testing::TrainingRun train(int world, Device device, int steps, bool fsdp = false, bool moe = false,
                                    bool nccl = false) {
  dtensor::testing::TrainingRun result;
  models::GPTConfig config = dtensor::testing::tiny_gpt();
  if (moe) {
    config.moe_experts = 4;
    config.moe_top_k = 2;
  }
  const int64_t global_batch = 8;
  launch(world, [&, device](Group threads) mutable {
    const Group g = nccl ? init("nccl") : threads;
    if (nccl) device = Device::cuda(g.rank());
    DeviceMesh mesh(g, {world}, {"dp"});
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    DistributedSampler sampler(data.size(), global_batch, mesh.coordinate(0), world, 5, true, 1);
    models::GPT model(mesh, config, 42);
    model.to(device);
    std::optional<parallel::DistributedDataParallel> ddp;
    std::optional<parallel::FSDPModule> root;
    if (fsdp) {
      for (auto& [name, m] : model.named_modules()) {
        if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, {.stage = 3});
      }
      root = parallel::fully_shard(model, mesh, {.stage = 3});
    } else {
      ddp.emplace(model, parallel::DDPOptions{.bucket_cap_mb = 0.001});
    }
    AdamW optimizer(model.parameters(), 1e-2);
    parallel::Trainer trainer(optimizer, {.sync = fsdp ? static_cast<parallel::GradientSync*>(&*root)
                                                       : static_cast<parallel::GradientSync*>(&*ddp)});
    const Shape batch_shape{global_batch, config.block_size};
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      const parallel::StepReport report = trainer.step(step, [&](int64_t m) {
        const TokenBatch batch = data.get_batch(sampler.micro_batch_at(step, m));
        const DistTensor ids = DistTensor::from_local(batch.inputs.to(device), mesh, {Shard(0)}, batch_shape);
        const DistTensor targets = DistTensor::from_local(batch.targets.to(device), mesh, {Shard(0)}, batch_shape);
        return model.loss(ids, targets);
      });
      losses.push_back(report.stats.loss);
    }
    for (const auto& [name, p] : model.named_parameters()) {
      EXPECT_EQ(p.device(), device) << name;
    }
    std::map<std::string, Tensor> params;
    for (const auto& [name, t] : model.state_dict()) params[name] = t.to(Device::cpu());
    if (g.rank() == 0) {
      result.losses = losses;
      result.params = params;
    }
  });
  return result;
}

// The same training as train(1, ...) through a GPT pipeline of `pp` stages (one per
// rank) with two micro-batches per step, the stages and the batches on `device`.
dtensor::testing::TrainingRun train_pipelined(int pp, Device device, int steps, parallel::ScheduleKind schedule) {
  dtensor::testing::TrainingRun result;
  const models::GPTConfig config = dtensor::testing::tiny_gpt();
  const int64_t global_batch = 8, micro_batches = 2;
  std::mutex mutex;
  launch(pp, [&](Group g) {
    DeviceMesh mesh(g, {pp}, {"pp"});
    parallel::PipelineMesh pipe_mesh(mesh);
    models::GPTPipeline gpt(pipe_mesh, config, 42,
                            {.schedule = schedule, .micro_batches = static_cast<int>(micro_batches)});
    for (const auto& stage : gpt.stages()) stage->to(device);
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    DistributedSampler sampler(data.size(), global_batch, 0, 1, 5, true, 1);
    const int64_t rows = global_batch / micro_batches;
    auto micro = [&](int64_t step, int64_t m, bool targets) {
      const TokenBatch b = data.get_batch(sampler.micro_batch_at(step, 0));
      const Tensor local = (targets ? b.targets : b.inputs).narrow(0, m * rows, rows).contiguous().to(device);
      return DistTensor::from_local(local, pipe_mesh.stage_mesh(), {Replicate()}, Shape{rows, config.block_size});
    };
    std::unique_ptr<parallel::Pipeline> pipe = gpt.make_pipeline(
        {}, [&](int64_t step, int64_t m) { return micro(step, m, false); },
        [&](int64_t step, int64_t m) { return micro(step, m, true); });
    AdamW optimizer(gpt.parameters(), 1e-2);
    parallel::Trainer trainer(optimizer);
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) losses.push_back(trainer.step(step, *pipe).stats.loss);
    for (const DistTensor& p : gpt.parameters()) EXPECT_EQ(p.device(), device);
    const std::map<std::string, Tensor> params = gpt.state_dict();
    std::lock_guard<std::mutex> lock(mutex);
    if (g.rank() == 0) result.losses = losses;
    for (const auto& [name, t] : params) result.params.emplace(name, t.to(Device::cpu()));
  });
  return result;
}

}  // namespace

TEST(ModuleTo, TheSameDeviceKeepsTheParameters) {
  // Runs everywhere: moving to where the parameters are copies nothing.
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    models::GPT model(mesh, dtensor::testing::tiny_gpt(), 42);
    std::vector<const void*> before;
    for (const DistTensor& p : model.parameters()) before.push_back(p.to_local().data_ptr());
    model.to(Device::cpu());
    const std::vector<DistTensor> after = model.parameters();
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].to_local().data_ptr(), before[i]);
      EXPECT_TRUE(after[i].requires_grad() && after[i].is_leaf());
    }
  });
}

TEST(ModuleTo, AGpuWhereThereIsNoneFailsOnTheCopy) {
  if (cuda_is_available()) GTEST_SKIP() << "a GPU is visible: the no-GPU error path cannot be reached";
  if (std::getenv("DTENSOR_REQUIRE_GPU")) FAIL() << "DTENSOR_REQUIRE_GPU is set but no GPU is visible";
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    models::GPT model(mesh, dtensor::testing::tiny_gpt(), 42);
    EXPECT_THROW(model.to(kGpu), std::exception);
    const DistTensor x = ones({2}, mesh, {Replicate()});
    EXPECT_THROW(x.to(kGpu), std::exception);
  });
}

TEST(DistTensorToDevice, TheGradientReturnsToTheSourceDevice) {
  REQUIRE_GPU();
  launch(2, [](Group g) {
    DeviceMesh mesh(g, {2});
    const Tensor full = Tensor::arange(-3.0, 5.0, 1.0).reshape({2, 4});
    DistTensor x = distribute(full, mesh, {Shard(1)});
    x.set_requires_grad(true);
    const DistTensor y = x.to(kGpu);
    ASSERT_EQ(y.device(), kGpu);
    EXPECT_EQ(y.placements(), x.placements());
    EXPECT_EQ(y.grad_fn_name(), "to_device");
    sum(mul(y, y)).backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().device(), Device::cpu());
    EXPECT_TRUE(allclose(x.grad().full_tensor(), mul(full, 2.0), 0, 0));
    EXPECT_TRUE(allclose(y.to(Device::cpu()).full_tensor(), full, 0, 0));
  });
}

TEST(ModuleTo, TheHarnessMatchesOneRankOnTheCpu) {
  // Runs everywhere: the GPU tests below differ from this only in the device, so a
  // failure there is the GPU's.
  const dtensor::testing::TrainingRun one = train(1, Device::cpu(), 3);
  dtensor::testing::expect_equivalent(train(2, Device::cpu(), 3), one, "DDP=2 on the CPU");
  dtensor::testing::expect_equivalent(train(2, Device::cpu(), 3, true), one, "FSDP=2 on the CPU");
  dtensor::testing::expect_equivalent(train(2, Device::cpu(), 3, false, true), train(1, Device::cpu(), 3, false, true),
                                      "MoE GPT, DDP=2 on the CPU");
}

TEST(ModuleTo, ThePipelineHarnessMatchesOneRankOnTheCpu) {
  const dtensor::testing::TrainingRun one = train(1, Device::cpu(), 3);
  dtensor::testing::expect_equivalent(train_pipelined(2, Device::cpu(), 3, parallel::ScheduleKind::OneFOneB), one,
                                      "1F1B over 2 stages on the CPU");
}

TEST(ModuleTo, GptTrainsOnOneGpuAsOnTheCpu) {
  REQUIRE_GPU();
  const dtensor::testing::TrainingRun cpu = train(1, Device::cpu(), 6);
  ASSERT_LT(cpu.losses.back(), cpu.losses.front()) << "the loss should fall";
  // Different summation orders (cuBLAS, the row kernels) under AdamW's normalisation.
  dtensor::testing::expect_equivalent(train(1, kGpu, 6), cpu, "one rank on the GPU", dtensor::testing::kAcrossDevices);
}

// The MoE's routing on the GPU: top-k, the stable sort by expert (CUB), the counts
// and the row gathers, against the same steps on the CPU, on one rank and on two.
TEST(ModuleTo, AMixtureOfExpertsGptTrainsOnTheGpuAsOnTheCpu) {
  REQUIRE_GPU();
  const dtensor::testing::TrainingRun cpu = train(1, Device::cpu(), 6, false, true);
  ASSERT_LT(cpu.losses.back(), cpu.losses.front()) << "the loss should fall";
  dtensor::testing::expect_equivalent(train(1, kGpu, 6, false, true), cpu, "MoE GPT on one GPU",
                                      dtensor::testing::kAcrossDevices);
  dtensor::testing::expect_equivalent(train(2, kGpu, 6, false, true), cpu, "MoE GPT, DDP=2 on one GPU",
                                      dtensor::testing::kAcrossDevices);
}

TEST(ModuleTo, DdpWithTwoRanksOnOneGpuMatchesTheCpu) {
  REQUIRE_GPU();
  const dtensor::testing::TrainingRun cpu = train(1, Device::cpu(), 6);
  dtensor::testing::expect_equivalent(train(2, kGpu, 6), cpu, "DDP=2 on one GPU", dtensor::testing::kAcrossDevices);
}

TEST(ModuleTo, FsdpWithTwoRanksOnOneGpuMatchesTheCpu) {
  REQUIRE_GPU();
  const dtensor::testing::TrainingRun cpu = train(1, Device::cpu(), 6);
  dtensor::testing::expect_equivalent(train(2, kGpu, 6, true), cpu, "FSDP (ZeRO-3) over 2 ranks on one GPU",
                                      dtensor::testing::kAcrossDevices);
}

TEST(ModuleTo, APipelineOfTwoStagesOnOneGpuMatchesTheCpu) {
  REQUIRE_GPU();
  const dtensor::testing::TrainingRun cpu = train(1, Device::cpu(), 6);
  for (parallel::ScheduleKind kind : {parallel::ScheduleKind::OneFOneB, parallel::ScheduleKind::ZeroBubble}) {
    dtensor::testing::expect_equivalent(train_pipelined(2, kGpu, 6, kind), cpu,
                                        std::string(parallel::schedule_kind_name(kind)) + " over 2 stages on one GPU",
                                        dtensor::testing::kAcrossDevices);
  }
}

// The nccl backend (issue 28): DDP and FSDP over one GPU per rank, the same training
// as on the CPU. Needs two GPUs.
TEST(NcclTraining, DdpAndFsdpOverOneGpuPerRankMatchTheCpu) {
  REQUIRE_GPU();
  if (backend::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (one per rank)";
  const dtensor::testing::TrainingRun cpu = train(1, Device::cpu(), 6);
  dtensor::testing::expect_equivalent(train(2, kGpu, 6, false, false, true), cpu, "DDP on nccl, 2 GPUs",
                                      dtensor::testing::kAcrossDevices);
  dtensor::testing::expect_equivalent(train(2, kGpu, 6, true, false, true), cpu, "FSDP (ZeRO-3) on nccl, 2 GPUs",
                                      dtensor::testing::kAcrossDevices);
}
