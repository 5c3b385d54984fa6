// The machine profile (dtensor/parallel/machine_profile.h): the fits recover known rates,
// a profile survives saving and loading, bad files say what is wrong, and calibrating
// this machine gives rates the estimator can use.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "dtensor/parallel/machine_profile.h"

namespace dtensor::parallel {
namespace {

namespace fs = std::filesystem;

// Samples drawn from the model's own forms with known parameters.
CalibrationSamples synthetic(double rate, double half_dim, double alpha, double beta, int64_t ranks) {
  CalibrationSamples s;
  s.ranks = ranks;
  s.backend = "threads";
  // Squares and tall, thin products, at R / (1 + d0 (1/m + 1/n + 1/k)) with d0 = half_dim / 3.
  for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{
           {16, 16, 16}, {64, 64, 64}, {256, 256, 256}, {1024, 1024, 1024}, {1024, 64, 256}, {2048, 512, 128}}) {
    const double sum = 1.0 / static_cast<double>(m) + 1.0 / static_cast<double>(n) + 1.0 / static_cast<double>(k);
    s.gemm.push_back({m, n, k, rate / (1 + half_dim / 3 * sum)});
  }
  const double n = static_cast<double>(ranks);
  for (int64_t b : {4096, 1 << 20, 16 << 20})
    s.all_reduce.push_back({b, 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / beta});
  s.copy_bytes_per_s = 7e9;
  return s;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("dtensor_profile_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  return dir / name;
}

TEST(MachineProfile, FitRecoversTheRatesItsFormsWereDrawnFrom) {
  for (int64_t ranks : {2, 4}) {
    const MachineProfile p = fit_profile(synthetic(60e9, 48, 3e-6, 5e9, ranks));
    EXPECT_NEAR(p.gemm_flops / 60e9, 1, 1e-9);
    EXPECT_NEAR(p.gemm_half_dim / 48, 1, 1e-9);
    EXPECT_NEAR(p.latency / 3e-6, 1, 1e-6);
    EXPECT_NEAR(p.bandwidth / 5e9, 1, 1e-9);
    EXPECT_EQ(p.memory_bandwidth, 7e9);
    EXPECT_EQ(p.ranks, ranks);
  }
}

TEST(MachineProfile, NoisyGemmRatesFallBackToTheBestSeen) {
  CalibrationSamples s = synthetic(60e9, 48, 3e-6, 5e9, 2);
  // Rates falling with size: no line of the form fits; a flat rate, the best.
  s.gemm = {{16, 16, 16, 50e9}, {64, 64, 64, 40e9}, {256, 256, 256, 30e9}};
  const MachineProfile p = fit_profile(s);
  EXPECT_NEAR(p.gemm_flops, 50e9, 1);
  EXPECT_EQ(p.gemm_half_dim, 0);
}

TEST(MachineProfile, FitRejectsTooFewOrBadSamples) {
  CalibrationSamples s = synthetic(60e9, 48, 3e-6, 5e9, 2);
  s.gemm.resize(1);
  EXPECT_THROW(fit_profile(s), std::invalid_argument);
  s = synthetic(60e9, 48, 3e-6, 5e9, 2);
  s.all_reduce[0].seconds = 0;
  EXPECT_THROW(fit_profile(s), std::invalid_argument);
  s = synthetic(60e9, 48, 3e-6, 5e9, 2);
  s.copy_bytes_per_s = 0;
  EXPECT_THROW(fit_profile(s), std::invalid_argument);
}

TEST(MachineProfile, SavesAtomicallyAndLoadsWhatItSaved) {
  MachineProfile p = fit_profile(synthetic(60e9, 48, 3e-6, 5e9, 2));
  p.machine = "test CPU";
  p.measured_at = "2026-12-06T00:00:00Z";
  p.memory_bytes = 24e9;
  p.op_seconds = 3e-6;
  p.tp_op_seconds = 3.5e-6;
  p.optimizer_tensor_seconds = 4e-6;
  p.fsdp_collective_seconds = 5e-5;
  const fs::path path = scratch("machine.json");
  p.save(path.string());
  EXPECT_FALSE(fs::exists(path.string() + ".part"));
  const MachineProfile q = MachineProfile::load(path.string());
  EXPECT_EQ(q.machine, "test CPU");
  EXPECT_EQ(q.measured_at, p.measured_at);
  EXPECT_EQ(q.ranks, 2);
  EXPECT_DOUBLE_EQ(q.gemm_flops, p.gemm_flops);
  EXPECT_DOUBLE_EQ(q.gemm_half_dim, p.gemm_half_dim);
  EXPECT_DOUBLE_EQ(q.latency, p.latency);
  EXPECT_DOUBLE_EQ(q.bandwidth, p.bandwidth);
  EXPECT_DOUBLE_EQ(q.memory_bandwidth, p.memory_bandwidth);
  EXPECT_DOUBLE_EQ(q.op_seconds, 3e-6);
  EXPECT_DOUBLE_EQ(q.tp_op_seconds, 3.5e-6);
  EXPECT_DOUBLE_EQ(q.optimizer_tensor_seconds, 4e-6);
  EXPECT_DOUBLE_EQ(q.fsdp_collective_seconds, 5e-5);
  ASSERT_EQ(q.samples.gemm.size(), p.samples.gemm.size());
  EXPECT_EQ(q.samples.all_reduce.back().bytes, 16 << 20);
  // A profile written before tensor parallelism's op was measured (the field renamed
  // away): a plain op's time.
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::string older = text.str();
  const std::string key = "\"tp_op_seconds\"";
  for (size_t at = older.find(key); at != std::string::npos; at = older.find(key)) {
    older.replace(at, key.size(), "\"xx_op_seconds\"");
  }
  std::ofstream(path, std::ios::trunc) << older;
  EXPECT_DOUBLE_EQ(MachineProfile::load(path.string()).tp_op_seconds, 3e-6);
  fs::remove_all(path.parent_path());
}

TEST(MachineProfile, BadFilesSayWhatIsWrong) {
  const fs::path path = scratch("bad.json");
  auto message_of = [&](const std::string& text) -> std::string {
    std::ofstream(path) << text;
    try {
      MachineProfile::load(path.string());
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message_of("{not json").find("is not JSON"), std::string::npos);
  EXPECT_NE(message_of("{\"format\": \"something else\"}").find("expected format"), std::string::npos);
  EXPECT_NE(message_of("{\"format\": \"dtensor machine profile 1\", \"machine\": \"x\"}").find("'measured_at'"),
            std::string::npos);
  try {
    MachineProfile::load((path.parent_path() / "missing.json").string());
    ADD_FAILURE() << "a missing file loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dtensor-plan --calibrate"), std::string::npos) << e.what();
  }
  fs::remove_all(path.parent_path());
}

// The cluster a profile describes: its rates per rank, shared by more ranks than measured,
// and fewer ranks' larger share of the cores' threads (the host's dispatch of an op
// stays one thread's), and its memory as the host offload moves to.
TEST(MachineProfile, ClusterCarriesTheMeasuredRates) {
  MachineProfile p = fit_profile(synthetic(60e9, 48, 3e-6, 5e9, 2));
  p.memory_bytes = 24e9;
  p.op_seconds = 2e-6;
  p.tp_op_seconds = 3e-6;
  const ClusterSpec one = p.cluster(1), two = p.cluster(2), four = p.cluster(4);
  EXPECT_DOUBLE_EQ(two.tp_op_seconds, 3e-6);
  EXPECT_DOUBLE_EQ(four.tp_op_seconds, 6e-6);
  EXPECT_DOUBLE_EQ(two.peak_flops * two.gemm_efficiency, 60e9);
  EXPECT_DOUBLE_EQ(two.gemm_half_dim, p.gemm_half_dim);
  EXPECT_DOUBLE_EQ(two.intra_bandwidth, 5e9);
  EXPECT_DOUBLE_EQ(two.memory_bytes, 12e9);
  EXPECT_DOUBLE_EQ(four.peak_flops, 30e9);
  EXPECT_DOUBLE_EQ(four.intra_bandwidth, 2.5e9);
  EXPECT_DOUBLE_EQ(four.op_seconds, 2 * two.op_seconds);
  EXPECT_EQ(four.bytes_per_value, 4);
  EXPECT_DOUBLE_EQ(one.peak_flops, 120e9);
  EXPECT_DOUBLE_EQ(one.memory_bandwidth, 2 * two.memory_bandwidth);
  EXPECT_DOUBLE_EQ(one.op_seconds, two.op_seconds);
  // The host offload moves to is the same memory: a measured CPU can estimate offload.
  EXPECT_DOUBLE_EQ(two.host_bandwidth, two.memory_bandwidth);
  EXPECT_DOUBLE_EQ(two.host_memory_bandwidth, two.memory_bandwidth);
  EXPECT_DOUBLE_EQ(two.host_memory_bytes, two.memory_bytes);
  ParallelPlan offload{.dp = 2, .zero = 3, .micro_batch = 4, .micro_batches = 1, .offload = true};
  EXPECT_EQ(estimate_plan(ModelSpec::gpt(2, 64, 4, 32, 32), two, 8, offload).rejected, "");
  EXPECT_THROW(p.cluster(0), std::invalid_argument);
  EXPECT_THROW(MachineProfile{}.cluster(2), std::invalid_argument);
}

// A short calibration of this machine: positive rates, in the estimator's hands.
TEST(MachineProfile, CalibratesThisMachine) {
  CalibrationOptions o;
  o.ranks = 2;
  o.gemm_shapes = {{16, 16, 16}, {64, 64, 64}, {256, 32, 64}};
  o.all_reduce_bytes = {4096, 1 << 20};
  o.copy_bytes = 4 << 20;
  o.seconds_per_sample = 0.005;
  o.trials = 2;
  const MachineProfile p = calibrate(o);
  EXPECT_EQ(p.ranks, 2);
  EXPECT_EQ(p.samples.gemm.size(), 3u);
  EXPECT_GT(p.gemm_flops, 1e8);
  EXPECT_GE(p.gemm_half_dim, 0);
  EXPECT_GT(p.bandwidth, 1e7);
  EXPECT_GT(p.latency, 0);
  EXPECT_GT(p.memory_bandwidth, 1e8);
  EXPECT_GT(p.memory_bytes, 0);
  EXPECT_GT(p.op_seconds, 0);                // a block's ops cost host time
  EXPECT_GT(p.tp_op_seconds, 0);             // and under tensor parallelism
  EXPECT_GT(p.optimizer_tensor_seconds, 0);  // and so does each tensor's update
  EXPECT_GE(p.fsdp_collective_seconds, 0);   // what FSDP adds may be lost in the noise
  EXPECT_FALSE(p.machine.empty());
  const ModelSpec model = ModelSpec::gpt(2, 64, 4, 32, 32);
  ParallelPlan plan;
  plan.dp = 2;
  plan.micro_batches = 4;
  const PlanEstimate e = estimate_plan(model, p.cluster(2), 8, plan);
  EXPECT_TRUE(e.rejected.empty()) << e.rejected;
  EXPECT_GT(e.step_seconds, 0);
  o.backend = "nccl";
  EXPECT_THROW(calibrate(o), std::invalid_argument);
}

}  // namespace
}  // namespace dtensor::parallel
