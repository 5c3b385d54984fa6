// Auto-parallel on paper (dtensor/parallel/plan.h): the estimator's formulas against the
// literature they come from, the search's invariants, and the published runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "dtensor/cost_model.h"
#include "dtensor/parallel/plan.h"

namespace dtensor::parallel {
namespace {

ParallelPlan plan_of(int64_t dp, int64_t tp, int64_t pp, int zero, int64_t batch, int64_t micro_batch = 1) {
  ParallelPlan p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.zero = zero;
  p.micro_batch = micro_batch;
  p.micro_batches = batch / (dp * micro_batch);
  return p;
}

// Megatron's FLOPs per iteration: 72 B s l h^2 (1 + s/6h + V/12lh) without recomputation,
// 96 B s l h^2 (1 + s/6h + V/16lh) with it (Narayanan et al., SC'21).
TEST(Plan, FlopsAreMegatrons) {
  const ModelSpec m = ModelSpec::gpt(24, 2304, 24, 2048, 51200);
  const double s = 2048, l = 24, h = 2304, v = 51200;
  EXPECT_NEAR(m.flops_per_sequence(false) / (72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))), 1, 1e-12);
  EXPECT_NEAR(m.flops_per_sequence(true) / (96 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))), 1, 1e-12);
  // 12 h^2 matrix parameters per block, the tied table once.
  EXPECT_EQ(m.layer_parameters(), 12 * 2304 * 2304 + 4 * 2304);
  EXPECT_EQ(m.parameters(), 24 * m.layer_parameters() + 51200 * 2304 + 2 * 2304);
}

// Mixed-precision Adam: 16 bytes per parameter, split by ZeRO stage over dp ranks as
// 16, 4 + 12/N, 2 + 14/N, 16/N (Rajbhandari et al.).
TEST(Plan, ZeroStagesSplitSixteenBytesPerParameter) {
  const ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  const double n = 8;
  const double expected[] = {16, 4 + 12 / n, 2 + 14 / n, 16 / n};
  const double params = static_cast<double>(8 * m.layer_parameters() + 32000 * 1024);
  for (int zero = 0; zero <= 3; ++zero) {
    const PlanEstimate e = estimate_plan(m, c, 64, plan_of(8, 1, 1, zero, 64));
    ASSERT_TRUE(e.rejected.empty()) << e.rejected;
    EXPECT_NEAR((e.param_bytes + e.grad_bytes + e.optimizer_bytes) / params, expected[zero], 1e-9) << zero;
    EXPECT_EQ(e.working_set_bytes > 0, zero == 3);
  }
}

// The bubble is (p-1)/m of the compute for 1F1B and GPipe, (p-1)/(v m) interleaved; the
// first stage holds min(m, p) micro-batches under 1F1B, every stage m under GPipe.
TEST(Plan, PipelineBubbleAndActivationsInFlight) {
  const ModelSpec m = ModelSpec::gpt(32, 4096, 32, 2048, 51200);
  const ClusterSpec c = ClusterSpec::preset("a100", 64);
  ParallelPlan p = plan_of(2, 8, 4, 1, 64);  // m = 32
  const PlanEstimate one = estimate_plan(m, c, 64, p);
  EXPECT_NEAR(one.bubble_seconds / (one.compute_seconds + one.tp_seconds), 3.0 / 32, 1e-12);
  p.schedule = PlanSchedule::Interleaved;
  p.virtual_stages = 2;
  const PlanEstimate interleaved = estimate_plan(m, c, 64, p);
  EXPECT_NEAR(interleaved.bubble_seconds / (interleaved.compute_seconds + interleaved.tp_seconds), 3.0 / 64, 1e-12);
  EXPECT_LT(interleaved.step_seconds, one.step_seconds + one.pp_seconds * 2);
  p.schedule = PlanSchedule::GPipe;
  p.virtual_stages = 1;
  const PlanEstimate gpipe = estimate_plan(m, c, 64, p);
  // GPipe's last stage holds all 32 micro-batches and their FP32 logits (the most);
  // 1F1B's first, 4.
  const double logits = 2048.0 * 51200 * 4 / 8;
  EXPECT_NEAR((gpipe.activation_bytes - 32 * logits) / one.activation_bytes, 32.0 / 4, 1e-9);
}

// Activations per layer (Korthikanti et al.): s b h (10 + 24/t + 5as/ht) stored, 34/t + 5as/ht
// with sequence parallelism, 34/t with selective recomputation, 2 with full.
TEST(Plan, ActivationsFollowKorthikanti) {
  ModelSpec m = ModelSpec::gpt(16, 4096, 32, 2048, 51200);
  m.flash_attention = false;
  const ClusterSpec c = ClusterSpec::preset("a100", 8);
  const double s = 2048, b = 1, h = 4096, a = 32, t = 8, layers = 16;
  auto activations = [&](Recompute r, bool sp) {
    ParallelPlan p = plan_of(1, 8, 1, 0, 1);
    p.recompute = r;
    p.sequence_parallel = sp;
    const PlanEstimate e = estimate_plan(m, c, 1, p);
    return e.activation_bytes - s * b * 51200 * 4 / t;  // less the FP32 logits
  };
  const double sbh = s * b * h, scores = 5 * a * s / (h * t);
  EXPECT_NEAR(activations(Recompute::None, false), layers * sbh * (10 + 24 / t + scores), 1);
  EXPECT_NEAR(activations(Recompute::None, true), layers * sbh * (34 / t + scores), 1);
  EXPECT_NEAR(activations(Recompute::Selective, true), layers * sbh * 34 / t, 1);
  // Full: each layer's input, plus the one layer rebuilt at a time.
  EXPECT_NEAR(activations(Recompute::Full, true), layers * 2 * sbh / t + sbh * (34 / t + scores), 1);
}

// Host dispatch: op_seconds for every op of every micro-batch on the device's layers
// (a third more of a block's under full recomputation), inside compute.
TEST(Plan, DispatchOverheadScalesWithMicroBatchesAndLayers) {
  ModelSpec m = ModelSpec::gpt(4, 256, 8, 64, 32);
  m.ops_per_layer = 80;
  m.ops_outside_layers = 30;
  ClusterSpec c = ClusterSpec::preset("cpu", 2);
  const ParallelPlan four = plan_of(2, 1, 1, 0, 16, 2);  // 4 micro-batches of 2
  const PlanEstimate free_ops = estimate_plan(m, c, 16, four);
  EXPECT_EQ(free_ops.overhead_seconds, 0);
  c.op_seconds = 5e-6;
  const PlanEstimate costed = estimate_plan(m, c, 16, four);
  EXPECT_NEAR(costed.overhead_seconds, 4 * 5e-6 * (80 * 4 + 30), 1e-12);
  EXPECT_NEAR(costed.compute_seconds - free_ops.compute_seconds, costed.overhead_seconds, 1e-12);
  ParallelPlan full = four;
  full.recompute = Recompute::Full;
  EXPECT_NEAR(estimate_plan(m, c, 16, full).overhead_seconds, 4 * 5e-6 * (80 * 4 * 4.0 / 3 + 30), 1e-12);
  // Half the layers on each of two stages.
  const PlanEstimate staged = estimate_plan(m, c, 16, plan_of(1, 1, 2, 0, 16, 4));
  EXPECT_NEAR(staged.overhead_seconds, 4 * 5e-6 * (80 * 2 + 30), 1e-12);
  // Under tensor parallelism each op costs tp_op_seconds (unset: op_seconds).
  const ParallelPlan tp = plan_of(1, 2, 1, 0, 16, 2);  // 8 micro-batches of 2
  EXPECT_NEAR(estimate_plan(m, c, 16, tp).overhead_seconds, 8 * 5e-6 * (80 * 4 + 30), 1e-12);
  c.tp_op_seconds = 9e-6;
  EXPECT_NEAR(estimate_plan(m, c, 16, tp).overhead_seconds, 8 * 9e-6 * (80 * 4 + 30), 1e-12);
  EXPECT_NEAR(estimate_plan(m, c, 16, four).overhead_seconds, costed.overhead_seconds, 1e-15);
  c.tp_op_seconds = -1;
  EXPECT_THROW(estimate_plan(m, c, 16, tp), std::invalid_argument);
}

// The optimizer's host time: optimizer_tensor_seconds for each parameter tensor of the
// device's stage, once per step whatever the micro-batches, on top of its bytes.
TEST(Plan, OptimizerHostTimePerParameterTensor) {
  ModelSpec m = ModelSpec::gpt(4, 256, 8, 64, 32);
  m.tensors_per_layer = 12;
  m.tensors_outside_layers = 3;
  ClusterSpec c = ClusterSpec::preset("cpu", 2);
  const ParallelPlan four = plan_of(2, 1, 1, 0, 16, 2);
  const PlanEstimate bytes_only = estimate_plan(m, c, 16, four);
  c.optimizer_tensor_seconds = 7e-6;
  const PlanEstimate costed = estimate_plan(m, c, 16, four);
  EXPECT_NEAR(costed.optimizer_seconds - bytes_only.optimizer_seconds, 7e-6 * (12 * 4 + 3), 1e-12);
  EXPECT_NEAR(costed.step_seconds - bytes_only.step_seconds, 7e-6 * (12 * 4 + 3), 1e-12);
  // Two stages: each steps its two blocks' tensors (and the tensors outside them).
  const ParallelPlan staged = plan_of(1, 1, 2, 0, 16, 4);
  c.optimizer_tensor_seconds = 0;
  const PlanEstimate staged_bytes = estimate_plan(m, c, 16, staged);
  c.optimizer_tensor_seconds = 7e-6;
  EXPECT_NEAR(estimate_plan(m, c, 16, staged).optimizer_seconds - staged_bytes.optimizer_seconds, 7e-6 * (12 * 2 + 3),
              1e-12);
}

// On a host, data parallelism's flat buffers are copied by the computing cores: DDP's
// gradients in and out of its buckets once per step, FSDP's gradients packed per
// reduce-scatter and its gathered parameters unpacked per gather, at the memory rate
// (GPUs copy beside the collectives: CommunicationWithoutOverlapIsExposed), and each
// of FSDP's collectives its host cost.
TEST(Plan, HostCopiesOfDataParallelFlatBuffers) {
  const ModelSpec m = ModelSpec::gpt(4, 256, 8, 64, 32);
  ClusterSpec c = ClusterSpec::preset("cpu", 2);
  ClusterSpec no_copies = c;
  no_copies.memory_bandwidth = 1e30;
  const double bytes = static_cast<double>(m.parameters()) * 4;  // FP32 parameters and gradients
  for (int zero = 0; zero <= 3; ++zero) {
    const ParallelPlan p = plan_of(2, 1, 1, zero, 16, 2);  // 4 micro-batches of 2
    const double micro_batches = static_cast<double>(p.micro_batches);
    const double copies = zero == 0   ? 2      // gradients into the buckets and out
                          : zero == 1 ? 1 + 1  // packed once, parameters unpacked once
                          : zero == 2 ? micro_batches + 1
                                      : micro_batches + 2 * micro_batches;
    // (the stage holds the parameters but the position table: within 0.1%)
    const double charged = estimate_plan(m, c, 16, p).dp_seconds - estimate_plan(m, no_copies, 16, p).dp_seconds;
    EXPECT_NEAR(charged / (copies * bytes / c.memory_bandwidth), 1, 1e-3) << "zero " << zero;
    // FSDP's host cost per collective, for each unit (4 blocks and the layers outside):
    // the copies above are its gathers and reduce-scatters.
    ClusterSpec per_call = c;
    per_call.fsdp_collective_seconds = 1e-4;
    EXPECT_NEAR(estimate_plan(m, per_call, 16, p).dp_seconds - estimate_plan(m, c, 16, p).dp_seconds,
                zero == 0 ? 0 : 1e-4 * 5 * copies, 1e-12)
        << "zero " << zero;
  }
}

// Where the cores that compute also copy (the CPU), the data-parallel reduction is not
// hidden behind backward: its whole time is on the step.
TEST(Plan, CommunicationWithoutOverlapIsExposed) {
  const ModelSpec m = ModelSpec::gpt(4, 256, 8, 64, 32);
  ClusterSpec c = ClusterSpec::preset("cpu", 2);
  EXPECT_FALSE(c.overlap_communication);
  const ParallelPlan ddp = plan_of(2, 1, 1, 0, 16, 8);
  const PlanEstimate exposed = estimate_plan(m, c, 16, ddp);
  const CostModel threads = CostModel::for_backend("threads", 2);
  const double grads = static_cast<double>(m.parameters()) * 4;
  // The all-reduce and DDP's copies of the gradients into its buckets and out (the
  // stage holds the parameters but the position table: within 0.1%).
  EXPECT_NEAR(
      exposed.dp_seconds / (threads.all_reduce(static_cast<int64_t>(grads), 2) + 2 * grads / c.memory_bandwidth), 1,
      1e-3);
  c.overlap_communication = true;  // behind a backward far longer than the all-reduce, copies beside it
  EXPECT_EQ(estimate_plan(m, c, 16, ddp).dp_seconds, 0);
}

// With overlap (Megatron-Core's --overlap-grad-reduce and --overlap-param-gather), a
// device's model chunks reduce their gradients one after another, each as soon as its
// last backward is done: under the interleaved schedule all but the last chunk's share
// hide behind the last round's backward; one chunk hides behind the last micro-batch's
// backward alone. ZeRO-1 reduce-scatters the FP32 gradients behind backward and
// all-gathers the 16-bit parameters behind the next forward.
TEST(Plan, DataParallelCollectivesHideChunkByChunk) {
  const ModelSpec m = ModelSpec::gpt(32, 1024, 16, 1024, 32000);
  ClusterSpec c = ClusterSpec::preset("h100", 16);  // dp x pp spans two nodes
  ASSERT_TRUE(c.overlap_communication);
  const int64_t micro_batches = 8, batch = 2 * micro_batches;
  // A stage: 4 blocks and the (tied) embedding table.
  const double stage_params = 4 * static_cast<double>(m.layer_parameters()) + static_cast<double>(m.vocab * m.hidden);
  CostModel network;
  network.latency_s = c.inter_latency;
  // The reduction far longer than the last round's backward, longer than one micro-batch's
  // only (the last chunk's share exposed), and shorter.
  for (double bandwidth : {2e9, 5e10, 2e11}) {
    c.inter_bandwidth = network.bandwidth_bytes_per_s = bandwidth;
    ParallelPlan p = plan_of(2, 1, 8, 0, batch);
    const PlanEstimate one = estimate_plan(m, c, batch, p);
    const double all_reduce = network.all_reduce(static_cast<int64_t>(stage_params * 2), 2);
    auto backward_of = [&](const PlanEstimate& e) { return 2 * e.compute_seconds / (3 * micro_batches); };
    EXPECT_NEAR(one.dp_seconds, std::max(0.0, all_reduce - backward_of(one)), 1e-9) << bandwidth;
    for (int64_t v : {2, 4}) {
      p.schedule = PlanSchedule::Interleaved;
      p.virtual_stages = v;
      const PlanEstimate e = estimate_plan(m, c, batch, p);
      const double w = backward_of(e), chunks = static_cast<double>(v), rounds = 8;  // min(m, pp)
      EXPECT_NEAR(e.dp_seconds,
                  std::max({0.0, (all_reduce - w) / chunks, all_reduce - w * (rounds * (chunks - 1) + 1) / chunks}),
                  1e-9)
          << bandwidth << " v " << v;
      EXPECT_LE(e.dp_seconds, one.dp_seconds);
    }
  }
  // ZeRO-1 with FP32 gradients: a reduce-scatter of 4-byte values behind one backward,
  // an all-gather of 2-byte ones behind one forward.
  c.inter_bandwidth = network.bandwidth_bytes_per_s = 2e9;
  ParallelPlan zero1 = plan_of(2, 1, 8, 1, batch);
  zero1.fp32_gradients = true;
  const PlanEstimate e = estimate_plan(m, c, batch, zero1);
  const double forward = e.compute_seconds / (3 * micro_batches);
  EXPECT_NEAR(e.dp_seconds,
              network.reduce_scatter(static_cast<int64_t>(stage_params * 4), 2) - 2 * forward +
                  network.all_gather(static_cast<int64_t>(stage_params * 2), 2) - forward,
              1e-9);
}

// Each GEMM runs at the rate of its shape, R / (1 + d0 (1/m + 1/n + 1/k)): with no
// per-dim cost every FLOP runs at R; with one, a layer split over tensor-parallel ranks
// (thinner products) takes more than 1/t of the time, and a square GEMM of
// gemm_half_dim runs at half the rate.
TEST(Plan, GemmsRunAtTheRateOfTheirShapes) {
  const ModelSpec m = ModelSpec::gpt(4, 512, 8, 256, 1024);
  ClusterSpec c = ClusterSpec::preset("h100", 2);
  c.memory_bandwidth = 1e30;  // no time for memory-bound ops
  c.gemm_half_dim = 0;
  const double rate = c.peak_flops * c.gemm_efficiency;
  const PlanEstimate flat = estimate_plan(m, c, 2, plan_of(2, 1, 1, 0, 2));
  EXPECT_NEAR(flat.compute_seconds * rate / (m.flops_per_sequence(false) * 2 / 2), 1, 1e-9);
  c.gemm_half_dim = 384;
  const PlanEstimate one = estimate_plan(m, c, 2, plan_of(2, 1, 1, 0, 2));
  const PlanEstimate two = estimate_plan(m, c, 2, plan_of(1, 2, 1, 0, 2));
  EXPECT_GT(one.compute_seconds, flat.compute_seconds);
  // tp=2: each device has both sequences and half of each layer: more than half the
  // time of one sequence's whole layer would take at tp=1 x 2 sequences / 2 devices.
  EXPECT_GT(two.compute_seconds, one.compute_seconds);
  // The square product of the half dim: 512^3 GEMMs only (seq 512, hidden 512, one
  // head of 512, vocab 512, ffn 512) at R / 2 with d_half = 512.
  ModelSpec square = ModelSpec::gpt(1, 512, 1, 512, 512);
  square.ffn_hidden = 512;
  square.fused_qkv = false;
  c.gemm_half_dim = 512;
  const PlanEstimate half = estimate_plan(square, c, 2, plan_of(2, 1, 1, 0, 2));
  EXPECT_NEAR(half.compute_seconds * rate / (square.flops_per_sequence(false) * 2 / 2), 2, 1e-9);
}

// The estimate is the peak, not the sum: with gradients dropped after each step
// (MemorySpec::gradients_persist false), backward's start holds every activation but
// only the output layer's and the last MLP's gradients, its end every gradient and no
// activation. Whichever is larger sets the memory.
TEST(Plan, MemoryIsBackwardsPeakNotTheSumOfItsParts) {
  ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  m.memory.gradients_persist = false;
  const ClusterSpec c = ClusterSpec::preset("h100", 1);
  const double output_and_mlp = (32000.0 * 1024 + 2.0 * 1024 * 4096) * 2;
  // Big activations: backward's start.
  const PlanEstimate start = estimate_plan(m, c, 8, plan_of(1, 1, 1, 0, 8, 8));
  EXPECT_NEAR(
      start.memory_bytes,
      start.param_bytes + start.optimizer_bytes + start.activation_bytes + start.transient_bytes + output_and_mlp, 1);
  EXPECT_LT(start.memory_bytes, start.param_bytes + start.grad_bytes + start.optimizer_bytes + start.activation_bytes);
  // One short sequence: the gradients outweigh the activations; backward's end.
  m.seq = 8;
  const PlanEstimate end = estimate_plan(m, c, 1, plan_of(1, 1, 1, 0, 1, 1));
  EXPECT_NEAR(end.memory_bytes, end.param_bytes + end.optimizer_bytes + end.grad_bytes, 1);
  // Kept gradients (Megatron's buffer) are all there at the start.
  m.seq = 1024;
  m.memory.gradients_persist = true;
  const PlanEstimate kept = estimate_plan(m, c, 8, plan_of(1, 1, 1, 0, 8, 8));
  EXPECT_NEAR(kept.memory_bytes - start.memory_bytes, start.grad_bytes - output_and_mlp, 1);
}

TEST(Plan, SearchRanksFeasiblePlansAndSaysWhyOthersWereRejected) {
  const ModelSpec m = ModelSpec::gpt(48, 8192, 64, 2048, 51200);  // 39B
  const ClusterSpec c = ClusterSpec::preset("a100", 64);
  const PlanSearch found = search_plans(m, c, 512);
  ASSERT_FALSE(found.ranked.empty());
  ASSERT_FALSE(found.rejected.empty());
  for (size_t i = 0; i < found.ranked.size(); ++i) {
    const PlanEstimate& e = found.ranked[i];
    EXPECT_TRUE(e.rejected.empty());
    EXPECT_LE(e.memory_bytes, c.memory_bytes);
    EXPECT_EQ(e.plan.dp * e.plan.cp * e.plan.tp * e.plan.pp, 64);
    EXPECT_EQ(e.plan.ep, 1);      // a dense model
    EXPECT_EQ(8 % e.plan.tp, 0);  // tensor parallel within a node
    if (i > 0) EXPECT_LE(found.ranked[i - 1].step_seconds, e.step_seconds);
  }
  for (const PlanEstimate& e : found.rejected) EXPECT_FALSE(e.rejected.empty());
  // 39B parameters cannot be replicated with Adam on 80 GB devices: plain data
  // parallelism without ZeRO is never feasible.
  for (const PlanEstimate& e : found.ranked) EXPECT_FALSE(e.plan.tp == 1 && e.plan.pp == 1 && e.plan.zero == 0);
  // One device: nothing fits.
  const PlanSearch alone = search_plans(m, ClusterSpec::preset("a100", 1), 8);
  EXPECT_TRUE(alone.ranked.empty());
  ASSERT_FALSE(alone.rejected.empty());
  EXPECT_NE(alone.rejected.front().rejected.find("per device"), std::string::npos) << alone.rejected.front().rejected;
}

// Context parallelism splits each sequence over cp ranks: a device holds the
// activations of its s/cp tokens (cp=2 with micro-batch 2 holds what dp=2 with
// micro-batch 1 does, Megatron's activations having nothing of the whole sequence),
// and each attention passes its keys and values round the ring: cp - 1 times in
// forward, cp - 1 and their gradients cp times in backward. On the CPU every pass is
// on the step.
TEST(Plan, ContextParallelSplitsTheSequenceAndPassesKeysAndValues) {
  const ModelSpec m = ModelSpec::gpt(4, 256, 8, 512, 32);
  const ClusterSpec c = ClusterSpec::preset("cpu", 2);
  ParallelPlan by_cp = plan_of(1, 1, 1, 0, 8, 2);  // 4 micro-batches of 2 sequences
  by_cp.cp = 2;
  const PlanEstimate cp = estimate_plan(m, c, 8, by_cp);
  const PlanEstimate dp = estimate_plan(m, c, 8, plan_of(2, 1, 1, 0, 8, 1));
  ASSERT_TRUE(cp.rejected.empty()) << cp.rejected;
  ASSERT_TRUE(dp.rejected.empty()) << dp.rejected;
  EXPECT_DOUBLE_EQ(cp.activation_bytes, dp.activation_bytes);
  EXPECT_DOUBLE_EQ(cp.param_bytes, dp.param_bytes);
  const CostModel threads = CostModel::for_backend("threads", 2);
  const double tokens = 512 * 2 / 2, pass = threads.point_to_point(static_cast<int64_t>(2 * tokens * 256 * 4), 1);
  EXPECT_NEAR(cp.cp_seconds / (4 /*micro-batches*/ * 4 /*layers*/ * ((2 - 1) + (2 * 2 - 1)) * pass), 1, 1e-9);
  EXPECT_EQ(dp.cp_seconds, 0);
  // The gradients are reduced over the cp ranks as over dp ones.
  EXPECT_GT(cp.dp_seconds, 0);
  by_cp.cp = 3;
  EXPECT_NE(estimate_plan(m, c, 8, by_cp).rejected.find("dp x cp x tp x pp"), std::string::npos);
  by_cp.cp = 2;
  EXPECT_NE(estimate_plan(ModelSpec::gpt(4, 256, 8, 511, 32), c, 8, by_cp).rejected.find("cp does not divide"),
            std::string::npos);
}

// Expert parallelism splits each block's experts over ep of the dp ranks (their
// parameters, gradients and optimizer state over ep, the dense ones not), and each MoE
// layer sends every routed copy of its tokens by two all-to-alls in forward and two
// in backward, after an all-gather of the per-expert counts.
TEST(Plan, ExpertParallelSplitsTheExpertsAndSendsTokensByAllToAll) {
  ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  m.experts = 8;
  m.top_k = 2;
  EXPECT_EQ(m.layer_expert_parameters(), 8 * 2 * 1024 * 4096);
  EXPECT_EQ(m.layer_parameters(), 4 * 1024 * 1024 + m.layer_expert_parameters() + 1024 * 8 + 4 * 1024);
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  ParallelPlan plan = plan_of(8, 1, 1, 0, 64);  // 8 micro-batches of 1
  const PlanEstimate replicated = estimate_plan(m, c, 64, plan);
  plan.ep = 4;
  const ParallelPlan split_plan = plan;
  const PlanEstimate split = estimate_plan(m, c, 64, plan);
  ASSERT_TRUE(split.rejected.empty()) << split.rejected;
  const double experts = 8 * static_cast<double>(m.layer_expert_parameters());
  // 16-bit parameters and gradients, 12 bytes of optimizer state: 3/4 of the experts
  // are elsewhere.
  EXPECT_NEAR(replicated.param_bytes - split.param_bytes, experts * 3 / 4 * 2, 1);
  EXPECT_NEAR(replicated.optimizer_bytes - split.optimizer_bytes, experts * 3 / 4 * 12, 1);
  const CostModel nvlink = [&] {
    CostModel l;
    l.bandwidth_bytes_per_s = c.intra_bandwidth;
    l.latency_s = c.intra_latency;
    return l;
  }();
  const double a2a = nvlink.all_to_all(static_cast<int64_t>(1024 * 2 * 1024 * 2), 4);
  const double counts = nvlink.all_gather(8 * 8 * 4, 4);
  EXPECT_NEAR(split.ep_seconds / (8 * 8 * (2 * a2a + counts + 2 * a2a)), 1, 1e-9);
  EXPECT_EQ(replicated.ep_seconds, 0);
  plan.ep = 3;
  EXPECT_NE(estimate_plan(m, c, 64, plan).rejected.find("ep 3 must divide"), std::string::npos);
  plan.ep = 2;
  EXPECT_NE(estimate_plan(ModelSpec::gpt(8, 1024, 16, 1024, 32000), c, 64, plan).rejected.find("ep 2 must divide"),
            std::string::npos);
  // A capacity factor bounds the rows the busiest ep rank receives: the estimate takes
  // every expert full (activations of the routed copies 1.25x); without expert
  // parallelism a device's experts take its own tokens' copies whatever the factor.
  ModelSpec capped = m;
  capped.capacity_factor = 1.25;
  const PlanEstimate full = estimate_plan(capped, c, 64, split_plan);
  EXPECT_GT(full.activation_bytes, split.activation_bytes);
  EXPECT_LT(full.activation_bytes, 1.25 * split.activation_bytes);
  EXPECT_DOUBLE_EQ(estimate_plan(capped, c, 64, plan_of(8, 1, 1, 0, 64)).activation_bytes, replicated.activation_bytes);
  capped.capacity_factor = -1;
  EXPECT_THROW(estimate_plan(capped, c, 64, split_plan), std::invalid_argument);
  // The search tries expert parallelism for a mixture of experts only.
  PlanSearchOptions options;
  options.tp = options.pp = options.cp = 1;
  options.zero = 0;
  const PlanSearch found = search_plans(m, c, 64, options);
  std::set<int64_t> eps;
  for (const PlanEstimate& e : found.ranked) eps.insert(e.plan.ep);
  EXPECT_EQ(eps, (std::set<int64_t>{1, 2, 4, 8}));
}

// ZeRO-Offload: the optimizer's state, the master and the gradients' shards on the
// host (mixed precision: 14 bytes per parameter over N there, 2 over N on the device
// under stage 3; the README's table), the reduced gradients copied to the host and the
// updated shard back each step.
TEST(Plan, OffloadMovesTheOptimizerToTheHost) {
  const ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  ParallelPlan plan = plan_of(8, 1, 1, 3, 64);
  const PlanEstimate kept = estimate_plan(m, c, 64, plan);
  plan.offload = true;
  const PlanEstimate off = estimate_plan(m, c, 64, plan);
  ASSERT_TRUE(off.rejected.empty()) << off.rejected;
  const double p = static_cast<double>(m.parameters()) - static_cast<double>(m.learned_positions * m.hidden);
  EXPECT_NEAR(off.host_bytes / (14 * p / 8), 1, 1e-3);
  EXPECT_NEAR(off.param_bytes / (2 * p / 8), 1, 1e-3);
  EXPECT_EQ(off.grad_bytes, 0);
  EXPECT_EQ(off.optimizer_bytes, 0);
  EXPECT_EQ(kept.host_bytes, 0);
  EXPECT_LT(off.memory_bytes, kept.memory_bytes);
  EXPECT_GE(off.step_seconds, kept.step_seconds);  // PCIe and the host's bandwidth are slower
  // The host's optimizer step reads and writes its bytes at the host's bandwidth.
  EXPECT_NEAR(off.optimizer_seconds / (off.host_bytes * 2 / c.host_memory_bandwidth), 1, 1e-9);
  ParallelPlan zero1 = plan_of(8, 1, 1, 1, 64);
  zero1.offload = true;
  EXPECT_NE(estimate_plan(m, c, 64, zero1).rejected.find("offload needs ZeRO-2 or 3"), std::string::npos);
  ClusterSpec hostless = c;
  hostless.host_bandwidth = 0;
  EXPECT_NE(estimate_plan(m, hostless, 64, plan).rejected.find("no host"), std::string::npos);
  hostless.host_bandwidth = c.host_bandwidth;
  hostless.host_memory_bytes = 1e6;
  const PlanEstimate full_host = estimate_plan(m, hostless, 64, plan);
  EXPECT_FALSE(full_host.fits);
  EXPECT_NE(full_host.rejected.find("host memory"), std::string::npos) << full_host.rejected;
}

// HSDP: ZeRO over groups of z ranks whose dp / z copies are replicas of each other:
// ZeRO-3's 16 bytes per parameter (FP32 here) over z, and every micro-batch gathers
// over z twice and reduce-scatters over z, then all-reduces the shard over the
// replicas.
TEST(Plan, HybridShardingShardsWithinGroupsAndAllReducesAcrossThem) {
  const ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  const ClusterSpec c = ClusterSpec::preset("cpu", 8);  // every collective on the step
  const ParallelPlan full = plan_of(8, 1, 1, 3, 64);    // 8 micro-batches of 1
  ParallelPlan hybrid = full;
  hybrid.zero_shard = 4;
  const PlanEstimate f = estimate_plan(m, c, 64, full), h = estimate_plan(m, c, 64, hybrid);
  ASSERT_TRUE(h.rejected.empty()) << h.rejected;
  EXPECT_NEAR((h.param_bytes + h.grad_bytes + h.optimizer_bytes) / (f.param_bytes + f.grad_bytes + f.optimizer_bytes),
              2, 1e-9);
  CostModel l;
  l.bandwidth_bytes_per_s = c.intra_bandwidth;
  l.latency_s = c.intra_latency;
  const double bytes = (8 * static_cast<double>(m.layer_parameters()) + 32000.0 * 1024) * 4;
  const auto b = static_cast<int64_t>(bytes);
  const double over_eight = 2 * l.all_gather(b, 8) + l.reduce_scatter(b, 8);
  const double over_four = 2 * l.all_gather(b, 4) + l.reduce_scatter(b, 4) + l.all_reduce(b / 4, 2);
  EXPECT_NEAR((h.dp_seconds - f.dp_seconds) / (8 * (over_four - over_eight)), 1, 1e-6);
  EXPECT_NE(h.plan.to_string().find("hsdp=4"), std::string::npos);
  for (int64_t shard : {3, 8 * 2}) {
    hybrid.zero_shard = shard;
    EXPECT_NE(estimate_plan(m, c, 64, hybrid).rejected.find("HSDP's shard group"), std::string::npos) << shard;
  }
  ParallelPlan ddp = plan_of(8, 1, 1, 0, 64);
  ddp.zero_shard = 4;
  EXPECT_NE(estimate_plan(m, c, 64, ddp).rejected.find("needs a ZeRO stage"), std::string::npos);
  // The search tries every proper divisor of the group for ZeRO stages.
  PlanSearchOptions options;
  options.tp = options.pp = options.cp = 1;
  options.zero = 3;
  options.offload = 0;
  std::set<int64_t> shards;
  for (const PlanEstimate& e : search_plans(m, c, 64, options).ranked) shards.insert(e.plan.zero_shard);
  EXPECT_EQ(shards, (std::set<int64_t>{0, 2, 4}));
}

// A partial offload mixes the shares: half the parameters' optimizer side on the host,
// half on the device as without offload; the delayed update needs all of it offloaded,
// holds a second step's gradient shards on the host and hides its host step behind the
// next step where the cluster overlaps (not on a CPU).
TEST(Plan, PartialOffloadAndTheDelayedUpdate) {
  const ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  ParallelPlan plan = plan_of(8, 1, 1, 3, 64);
  const PlanEstimate kept = estimate_plan(m, c, 64, plan);
  plan.offload = true;
  const PlanEstimate all = estimate_plan(m, c, 64, plan);
  plan.offload_fraction = 0.5;
  const PlanEstimate half = estimate_plan(m, c, 64, plan);
  ASSERT_TRUE(half.rejected.empty()) << half.rejected;
  EXPECT_NEAR(half.host_bytes / all.host_bytes, 0.5, 1e-9);
  EXPECT_NEAR(half.optimizer_bytes / kept.optimizer_bytes, 0.5, 1e-9);
  EXPECT_NEAR(half.grad_bytes / kept.grad_bytes, 0.5, 1e-9);
  EXPECT_NE(half.plan.to_string().find("offload=0.5"), std::string::npos) << half.plan.to_string();
  for (const double bad : {-0.5, 1.5}) {
    plan.offload_fraction = bad;
    EXPECT_NE(estimate_plan(m, c, 64, plan).rejected.find("offload fraction must be in [0, 1]"), std::string::npos);
  }
  // The device steps its own share: half the bytes it steps without offload, but for
  // the 16-bit copies of the offloaded half it keeps.
  plan.offload_fraction = 0.5;
  ParallelPlan none = plan;
  none.offload = false;
  const double device_part = half.optimizer_seconds - half.host_bytes * 2 / c.host_memory_bandwidth;
  EXPECT_NEAR(device_part / estimate_plan(m, c, 64, none).optimizer_seconds, 0.5, 1e-9);
  plan.offload_fraction = 0.5;
  plan.delayed_update = true;
  EXPECT_NE(estimate_plan(m, c, 64, plan).rejected.find("delayed update needs every parameter offloaded"),
            std::string::npos);
  plan.offload_fraction = 1;
  const PlanEstimate delayed = estimate_plan(m, c, 64, plan);
  ASSERT_TRUE(delayed.rejected.empty()) << delayed.rejected;
  // Two steps' gradient shards (2 bytes each of the 14 per parameter) on the host.
  EXPECT_NEAR(delayed.host_bytes / all.host_bytes, 16.0 / 14, 1e-9);
  EXPECT_LT(delayed.optimizer_seconds, all.optimizer_seconds);
  EXPECT_LT(delayed.step_seconds, all.step_seconds);
  ClusterSpec cpu = ClusterSpec::preset("cpu", 8);
  cpu.host_bandwidth = cpu.memory_bandwidth;
  cpu.host_memory_bandwidth = cpu.memory_bandwidth;
  ParallelPlan undelayed = plan;
  undelayed.delayed_update = false;
  EXPECT_NEAR(
      estimate_plan(m, cpu, 64, plan).optimizer_seconds / estimate_plan(m, cpu, 64, undelayed).optimizer_seconds, 1,
      1e-12)
      << "the CPU's cores run the host step and the next step's work both";
}

// 16-bit compute over FP32 parameters (autocast, FSDP's param_dtype): 4 + 4 + 8 bytes
// per parameter split by ZeRO as FP32 training's (ZeRO-1/2 keep a whole 16-bit copy
// beside the FP32 shard), ZeRO-3 gathers 16-bit, and without ZeRO every micro-batch
// in flight keeps a 16-bit copy of each weight.
TEST(Plan, SixteenBitComputeOverFp32Parameters) {
  ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  m.memory.fp32_parameters = true;
  const ClusterSpec c = ClusterSpec::preset("h100", 8);  // 2-byte values
  const double n = 8, params = static_cast<double>(8 * m.layer_parameters() + 32000 * 1024);
  const double expected[] = {16, 2 + 4 + 12 / n, 2 + 16 / n, 16 / n};  // ZeRO-1 keeps whole FP32 gradients
  for (int zero = 0; zero <= 3; ++zero) {
    const PlanEstimate e = estimate_plan(m, c, 64, plan_of(8, 1, 1, zero, 64));
    ASSERT_TRUE(e.rejected.empty()) << e.rejected;
    const double per = (e.param_bytes + e.grad_bytes + e.optimizer_bytes) / params;
    EXPECT_NEAR(per, expected[zero], 1e-9) << zero;
  }
  // The working set is gathered in 16 bits; the cast copies are activations.
  ModelSpec mixed = m;
  mixed.memory.fp32_parameters = false;
  const PlanEstimate z3 = estimate_plan(m, c, 64, plan_of(8, 1, 1, 3, 64));
  EXPECT_NEAR(z3.working_set_bytes, estimate_plan(mixed, c, 64, plan_of(8, 1, 1, 3, 64)).working_set_bytes, 1e-6);
  const PlanEstimate ddp = estimate_plan(m, c, 64, plan_of(8, 1, 1, 0, 64));
  const PlanEstimate ddp_mixed = estimate_plan(mixed, c, 64, plan_of(8, 1, 1, 0, 64));
  EXPECT_NEAR(ddp.activation_bytes - ddp_mixed.activation_bytes, 2 * params, 1e-3 * params);
  // FP32 training does not cast.
  ClusterSpec fp32 = c;
  fp32.bytes_per_value = 4;
  EXPECT_EQ(estimate_plan(m, fp32, 64, plan_of(8, 1, 1, 0, 64)).activation_bytes,
            estimate_plan(mixed, fp32, 64, plan_of(8, 1, 1, 0, 64)).activation_bytes);
}

// The loss: the logits whole on every tp rank when gathered (and an all-gather per
// micro-batch), and the loss's backward as the peak of a large vocabulary.
TEST(Plan, GatheredLogitsAndTheLossBackward) {
  ModelSpec m = ModelSpec::gpt(2, 256, 8, 512, 128000);
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  ParallelPlan plan = plan_of(1, 8, 1, 0, 8);
  const PlanEstimate split = estimate_plan(m, c, 8, plan);
  plan.loss_parallel = false;
  const PlanEstimate whole = estimate_plan(m, c, 8, plan);
  ASSERT_TRUE(whole.rejected.empty()) << whole.rejected;
  EXPECT_GT(whole.activation_bytes, split.activation_bytes);
  EXPECT_GT(whole.tp_seconds, split.tp_seconds);
  EXPECT_NE(whole.plan.to_string().find("gathered-logits"), std::string::npos);
  // With the loss's backward counted, the peak grows by what it holds.
  m.memory.backward_frees_logits = false;
  const PlanEstimate without = estimate_plan(m, c, 8, plan);
  m.memory.loss_backward = 1;
  const PlanEstimate with = estimate_plan(m, c, 8, plan);
  EXPECT_GT(with.memory_bytes, without.memory_bytes);
  EXPECT_LE(with.memory_bytes - without.memory_bytes, 512.0 * 128000 * 4 + 1);
}

// A shared expert is a dense MLP beside the routed ones: its parameters, FLOPs and
// activations once per token, split by tp and not by ep.
TEST(Plan, SharedExpertIsADenseMlpBesideTheRoutedOnes) {
  ModelSpec m = ModelSpec::gpt(4, 512, 8, 256, 32000);
  m.experts = 8;
  m.top_k = 2;
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  ModelSpec shared = m;
  shared.shared_expert_ffn = 1024;
  EXPECT_EQ(shared.layer_parameters() - m.layer_parameters(), 2 * 512 * 1024);
  EXPECT_EQ(shared.layer_expert_parameters(), m.layer_expert_parameters());
  EXPECT_NEAR(shared.flops_per_sequence(false) - m.flops_per_sequence(false), 3.0 * 256 * 4 * 2 * (2 * 512 * 1024), 1);
  ParallelPlan ep = plan_of(8, 1, 1, 0, 64);
  ep.ep = 8;
  EXPECT_NEAR(estimate_plan(shared, c, 64, ep).param_bytes - estimate_plan(m, c, 64, ep).param_bytes,
              4.0 * 2 * 2 * 512 * 1024, 1);  // 2 bytes, replicated over ep
  EXPECT_GT(estimate_plan(shared, c, 64, ep).activation_bytes, estimate_plan(m, c, 64, ep).activation_bytes);
  ModelSpec dense = ModelSpec::gpt(4, 512, 8, 256, 32000);
  dense.shared_expert_ffn = 1024;
  EXPECT_THROW(estimate_plan(dense, c, 64, plan_of(8, 1, 1, 0, 64)), std::invalid_argument);
}

// Zero bubble (ZB-H1): the bubble a third of 1F1B's, the first stage's micro-batches in
// flight as 1F1B's, and the last stage holding deferred weight gradients.
TEST(Plan, ZeroBubbleFillsTheBubbleAndHoldsDeferredWeightGradients) {
  ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  m.memory.deferred_hidden = 4;
  m.memory.deferred_split = 7;
  m.memory.deferred_ffn = 2;
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  ParallelPlan one = plan_of(1, 1, 8, 0, 32);
  const PlanEstimate f = estimate_plan(m, c, 32, one);
  ParallelPlan zb = one;
  zb.schedule = PlanSchedule::ZeroBubble;
  const PlanEstimate z = estimate_plan(m, c, 32, zb);
  ASSERT_TRUE(z.rejected.empty()) << z.rejected;
  const double busy = f.compute_seconds + f.tp_seconds + f.cp_seconds + f.ep_seconds;
  EXPECT_NEAR(f.bubble_seconds / busy, 7.0 / 32, 1e-9);
  EXPECT_NEAR(z.bubble_seconds / busy, 7.0 / (3 * 32), 1e-9);
  EXPECT_GE(z.memory_bytes, f.memory_bytes);
  EXPECT_NE(z.plan.to_string().find("zero-bubble"), std::string::npos);
  // Nothing deferred is kept: the first stage holds what 1F1B's does.
  m.memory.deferred_hidden = m.memory.deferred_split = m.memory.deferred_ffn = 0;
  EXPECT_NEAR(estimate_plan(m, c, 32, zb).activation_bytes, estimate_plan(m, c, 32, one).activation_bytes, 1);
}

// ZeRO-3's working set: prefetch k gathers k + 1 units (no more than the stage's
// blocks), layer units hold a block's attention and MLP where block units hold two
// blocks, and keeping the gathered blocks after forward holds every block (and skips
// backward's all-gather).
TEST(Plan, FsdpUnitsPrefetchAndReshardingSetTheWorkingSet) {
  const ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  const ClusterSpec c = ClusterSpec::preset("cpu", 8);  // collectives exposed
  const double layer = static_cast<double>(m.layer_parameters()) * 4, outside = 32000.0 * 1024 * 4;
  auto working_set = [&](bool layer_units, int64_t prefetch, bool reshard) {
    ParallelPlan p = plan_of(8, 1, 1, 3, 64);
    p.fsdp_layer_units = layer_units;
    p.fsdp_prefetch = prefetch;
    p.reshard_after_forward = reshard;
    const PlanEstimate e = estimate_plan(m, c, 64, p);
    EXPECT_TRUE(e.rejected.empty()) << e.rejected;
    return e;
  };
  EXPECT_NEAR(working_set(false, 1, true).working_set_bytes, 2 * layer + outside, 1);
  EXPECT_NEAR(working_set(false, 0, true).working_set_bytes, layer + outside, 1);
  EXPECT_NEAR(working_set(false, 3, true).working_set_bytes, 4 * layer + outside, 1);
  EXPECT_NEAR(working_set(false, 20, true).working_set_bytes, 8 * layer + outside, 1);
  EXPECT_NEAR(working_set(true, 1, true).working_set_bytes, layer + outside, 1);  // norms, attention and MLP
  EXPECT_LT(working_set(true, 0, true).working_set_bytes, layer + outside);
  const PlanEstimate kept = working_set(false, 1, false);
  EXPECT_NEAR(kept.working_set_bytes, 8 * layer + outside, 1);
  EXPECT_LT(kept.dp_seconds, working_set(false, 1, true).dp_seconds);
  // Three units a block: three times the collectives' host cost.
  ClusterSpec host = c;
  host.fsdp_collective_seconds = 1e-4;
  ParallelPlan block = plan_of(8, 1, 1, 3, 64), layers = block;
  layers.fsdp_layer_units = true;
  EXPECT_NEAR(estimate_plan(m, host, 64, layers).dp_seconds - estimate_plan(m, host, 64, block).dp_seconds,
              1e-4 * 16 * 8 * 3, 1e-9);
  block.fsdp_prefetch = -1;
  EXPECT_NE(estimate_plan(m, c, 64, block).rejected.find("prefetch must be >= 0"), std::string::npos);
}

TEST(Plan, InvalidPlansAndInputsAreRejectedWithReasons) {
  const ModelSpec m = ModelSpec::gpt(8, 1024, 16, 1024, 32000);
  const ClusterSpec c = ClusterSpec::preset("h100", 8);
  EXPECT_NE(estimate_plan(m, c, 64, plan_of(4, 1, 1, 0, 64)).rejected.find("not the 8 devices"), std::string::npos);
  ParallelPlan zero_pp = plan_of(2, 1, 4, 3, 64);
  EXPECT_NE(estimate_plan(m, c, 64, zero_pp).rejected.find("ZeRO-2/3"), std::string::npos);
  ParallelPlan odd = plan_of(8, 1, 1, 0, 64);
  odd.micro_batches = 3;
  EXPECT_NE(estimate_plan(m, c, 64, odd).rejected.find("global batch"), std::string::npos);
  try {
    ClusterSpec::preset("tpu", 8);
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a100, h100, h200, cpu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(search_plans(ModelSpec::gpt(8, 1000, 16, 1024, 32000), c, 64), std::invalid_argument);
}

// The model against published runs (dtensor-plan --validate): one fitted constant per
// device kind (on the first row of each), every run within 15%. Llama 3's runs, which
// kept every activation, do not fit in the memory model: it misses what they did
// (RESULTS.md).
TEST(Plan, PublishedRunsAreReproduced) {
  const std::vector<PublishedRun> runs = published_runs();
  ASSERT_GE(runs.size(), 10u);
  int a100 = 0;
  for (const PublishedRun& run : runs) {
    const PlanEstimate e = estimate_published(run);
    const double predicted = (run.hardware ? e.hardware_flops_per_device : e.model_flops_per_device) / 1e12;
    const double ratio = predicted / run.tflops_per_device;
    a100 += run.source.find("Megatron-LM") != std::string::npos;
    if (run.source.find(", 96 H100") != std::string::npos) {
      EXPECT_NEAR(ratio, 1, 0.01) << "the fitted point: " << e.to_string();
    }
    EXPECT_NEAR(ratio, 1, 0.15) << run.source << ": " << e.to_string();
    EXPECT_EQ(e.fits, run.source.find("Llama 3") == std::string::npos) << run.source << ": " << e.to_string();
  }
  EXPECT_EQ(a100, 6);
}

}  // namespace
}  // namespace dtensor::parallel
