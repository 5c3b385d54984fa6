// This machine's measured rates for the auto-parallel estimator
// (dtensor/parallel/machine_profile.h): measuring, fitting, saving and loading.
#include "dtensor/parallel/machine_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dtensor/cpu.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dist_tensor.h"
#include "dtensor/group.h"
#include "dtensor/nn/layers.h"
#include "dtensor/ops.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/fsdp.h"
#include "dtensor/parallel/tensor_parallel.h"
#include "dtensor/step_plan.h"
#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor::parallel {

namespace {

constexpr const char* kOp = "machine profile";
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Line {
  double intercept = 0, slope = 0;
};

// Least squares y = intercept + slope x in relative error (each residual over its y), so
// that the small samples set the intercept and the large ones the slope, as they do in
// the times predicted: absolute errors would let the largest samples decide both.
Line fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (y[i] * y[i]);
    sw += w;
    sx += w * x[i];
    sy += w * y[i];
    sxx += w * x[i] * x[i];
    sxy += w * x[i] * y[i];
  }
  const double denominator = sw * sxx - sx * sx;
  Line line;
  line.slope = denominator != 0 ? (sw * sxy - sx * sy) / denominator : 0;
  line.intercept = (sy - line.slope * sx) / sw;
  return line;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

double host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

// The mean over the group of each rank's values.
std::vector<double> mean_over(const Group& group, const std::vector<double>& values) {
  Tensor t = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  all_reduce_(group, t, ReduceOp::Sum);
  std::vector<double> mean = t.to_vector<double>();
  for (double& v : mean) v /= group.size();
  return mean;
}

// The slowest rank's seconds. A training step waits for its slowest rank at every
// collective, so the rates it is estimated with are that rank's: on a 2-vCPU machine
// one rank's GEMMs ran 12% slower than the other's through a whole DDP step (a
// trace), which the ranks' mean rate hid.
double slowest_over(const Group& group, double seconds) {
  Tensor t = Tensor::from_vector(std::vector<double>{seconds}, {1});
  all_reduce_(group, t, ReduceOp::Max);
  return t.item<double>();
}

// The median per-call time of `calls` calls of fn over `trials` trials, every rank
// starting each trial together. The median, not the best: the estimator predicts a
// training run's median step, and this machine's speed drifts between trials.
template <class Fn>
double median_seconds_per_call(const Group& group, int trials, int64_t calls, Fn&& fn) {
  std::vector<double> seconds;
  for (int trial = 0; trial < trials; ++trial) {
    barrier(group);
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < calls; ++i) fn();
    seconds.push_back(seconds_since(start) / static_cast<double>(calls));
  }
  std::nth_element(seconds.begin(), seconds.begin() + trials / 2, seconds.end());
  return seconds[static_cast<size_t>(trials / 2)];
}

// Calls of a kernel costing `seconds_each` that fill `budget` seconds (at least 2); the
// same on every rank, so that collectives stay matched.
int64_t calls_for(const Group& group, double seconds_each, double budget) {
  const double mean = mean_over(group, {seconds_each})[0];
  return std::clamp<int64_t>(static_cast<int64_t>(budget / std::max(mean, 1e-9)), 2, 100000);
}

// The slowest rank's median seconds per call of fn: a first call (a GEMM shape chooses
// its engine, buffers are allocated), then one timed to size the trials at
// seconds_per_sample.
template <class Fn>
double time_per_call(const Group& world, const CalibrationOptions& o, Fn&& fn) {
  fn();
  const Clock::time_point probe = Clock::now();
  fn();
  const int64_t calls = calls_for(world, seconds_since(probe), o.seconds_per_sample);
  return slowest_over(world, median_seconds_per_call(world, o.trials, calls, fn));
}

CalibrationSamples measure(const Group& world, const CalibrationOptions& o) {
  CalibrationSamples s;
  s.machine = cpu::summary();  // inside the rank: its threads
  s.ranks = world.size();
  s.backend = o.backend;
  for (const auto& [m, n, k] : o.gemm_shapes) {
    DT_CHECK_ARG(m >= 1 && n >= 1 && k >= 1, kOp, "expected GEMM sizes >= 1, got ", m, " x ", n, " x ", k);
    const Tensor a = Tensor::randn({m, k}, 1), b = Tensor::randn({k, n}, 2);
    const double seconds = time_per_call(world, o, [&] { (void)matmul(a, b); });
    s.gemm.push_back({m, n, k, 2.0 * m * n * k / seconds});
  }
  for (int64_t bytes : o.all_reduce_bytes) {
    DT_CHECK_ARG(bytes >= 4, kOp, "expected all-reduce sizes of at least 4 bytes, got ", bytes);
    const Tensor t = Tensor::zeros({bytes / 4});
    // A collective ends when its slowest rank does.
    const double seconds = time_per_call(world, o, [&] { all_reduce_(world, t); });
    s.all_reduce.push_back({bytes / 4 * 4, seconds});
  }
  {
    // A transformer block (nn::TransformerBlock) at a size with almost no arithmetic,
    // forward and backward, its batch sharded over the ranks: dispatch, sharding
    // propagation, autograd, allocation and each kernel's fixed cost, per op it
    // dispatches (counted by recording one step), as a model's ops cost them.
    DT_CHECK_ARG(o.op_block_dim >= 2 && o.op_block_dim % 2 == 0, kOp,
                 "expected an even op_block_dim of at least 2, got ", o.op_block_dim);
    const DeviceMesh mesh(world, {world.size()}, {"dp"});
    nn::BlockConfig config;
    config.dim = o.op_block_dim;
    config.heads = 2;
    config.mlp_hidden = 4 * o.op_block_dim;
    config.layers = 1;
    nn::TransformerBlock block(mesh, config, /*seed=*/7);
    const int64_t seq = 4;
    const DistTensor x = DistTensor::from_local(Tensor::randn({1, seq, o.op_block_dim}, 3), mesh, {Shard(0)},
                                                Shape{world.size(), seq, o.op_block_dim});
    auto block_step = [&] {
      block.zero_grad();
      sum(block.forward(x)).backward();
    };
    block_step();  // the first step allocates its gradients
    double ops = 0;
    {
      StepPlanner counter;
      {
        PlannedStep recording(counter);
        block_step();
      }
      ops = static_cast<double>(counter.last_report().ops);
    }
    DT_CHECK_ARG(ops > 0, kOp, "expected the calibration block to dispatch ops, recording counted none");
    const double block_seconds = time_per_call(world, o, block_step);
    s.op_seconds = block_seconds / ops;
    // The same block under FSDP (ZeRO-3, one unit): each step gathers its parameters for
    // forward and again for backward and reduce-scatters its gradients; what that adds
    // to the step (hooks, the collectives' launch and wait, packing a unit), per
    // collective.
    {
      nn::TransformerBlock sharded(mesh, config, /*seed=*/7);
      FSDPModule unit = fully_shard(sharded, mesh);
      auto sharded_step = [&] {
        sharded.zero_grad();
        sum(sharded.forward(x)).backward();
        unit.finish_gradient_sync();
      };
      const double fsdp = time_per_call(world, o, sharded_step);
      s.fsdp_collective_seconds = std::max(0.0, fsdp - block_seconds) / 3;
    }
    // The same block under tensor parallelism over all ranks (Megatron's: q, k, v and
    // the MLP's first linear column-parallel, the attention's output and the MLP's
    // second row-parallel, their outputs all-reduced), its input replicated: each op's
    // sharding, the collectives' host side and the ranks' waits for each other, per op
    // of the plain block (the model's op counts are the plain model's). Where the heads
    // or the MLP do not divide over the ranks, or one rank: the plain block's.
    s.tp_op_seconds = s.op_seconds;
    const int64_t tp = world.size();
    if (tp > 1 && config.dim % tp == 0 && config.mlp_hidden % tp == 0) {
      nn::BlockConfig tp_config = config;
      tp_config.heads = tp;
      nn::TransformerBlock parallel_block(mesh, tp_config, /*seed=*/7);
      parallelize_module(parallel_block, mesh,
                         {{"attn", PrepareModuleInput{.desired_input_layouts = Replicate()}},
                          {"attn.q", ColwiseParallel{}},
                          {"attn.k", ColwiseParallel{}},
                          {"attn.v", ColwiseParallel{}},
                          {"attn.out", RowwiseParallel{}},
                          {"mlp", PrepareModuleInput{.desired_input_layouts = Replicate()}},
                          {"mlp.up", ColwiseParallel{}},
                          {"mlp.down", RowwiseParallel{}}});
      const DistTensor whole = DistTensor::from_local(Tensor::randn({1, seq, o.op_block_dim}, 3), mesh, {Replicate()},
                                                      Shape{1, seq, o.op_block_dim});
      auto tp_step = [&] {
        parallel_block.zero_grad();
        sum(parallel_block.forward(whole)).backward();
      };
      s.tp_op_seconds = time_per_call(world, o, tp_step) / ops;
    }
    // The block's optimizer step as train_gpt takes it (clipping by the global norm,
    // AdamW), per parameter tensor: each tensor's norm, update and state are ops and
    // kernels of their own, a host cost that a tensor's size does not change here.
    const std::vector<DistTensor> params = block.parameters();
    AdamW optimizer(params, AdamWOptions{});
    auto optimizer_step = [&] {
      (void)clip_grad_norm(params, 1.0);
      optimizer.step();
    };
    s.optimizer_tensor_seconds = time_per_call(world, o, optimizer_step) / static_cast<double>(params.size());
  }
  {
    const size_t n = static_cast<size_t>(std::max<int64_t>(o.copy_bytes, 4096));
    std::vector<char> from(n, 1), to(n, 0);
    std::memcpy(to.data(), from.data(), n);  // pages in
    const double seconds = slowest_over(
        world, median_seconds_per_call(world, o.trials, 1, [&] { std::memcpy(to.data(), from.data(), n); }));
    s.copy_bytes_per_s = static_cast<double>(n) / seconds;
  }
  return s;
}

template <class T>
T field(const nlohmann::json& j, const char* name, const std::string& path) {
  DT_CHECK_ARG(j.is_object() && j.contains(name), kOp, "'", path, "' has no field '", name,
               "' (expected a profile written by dtensor-plan --calibrate)");
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception& e) {
    DT_CHECK_ARG(false, kOp, "'", path, "': field '", name, "' has the wrong type: ", e.what());
  }
  return T{};
}

}  // namespace

MachineProfile fit_profile(const CalibrationSamples& s) {
  DT_CHECK_ARG(s.gemm.size() >= 2, kOp, "fitting needs at least two GEMM sizes, got ", s.gemm.size());
  DT_CHECK_ARG(s.all_reduce.size() >= 2, kOp, "fitting needs at least two all-reduce sizes, got ", s.all_reduce.size());
  DT_CHECK_ARG(s.ranks >= 1, kOp, "expected the ranks measured >= 1, got ", s.ranks);
  DT_CHECK_ARG(s.copy_bytes_per_s > 0, kOp, "expected a positive copy rate, got ", s.copy_bytes_per_s);
  MachineProfile p;
  p.backend = s.backend;
  p.ranks = s.ranks;
  p.samples = s;
  p.memory_bandwidth = s.copy_bytes_per_s;
  DT_CHECK_ARG(s.op_seconds >= 0, kOp, "expected a non-negative time per op, got ", s.op_seconds);
  p.op_seconds = s.op_seconds;
  DT_CHECK_ARG(s.tp_op_seconds >= 0, kOp, "expected a non-negative time per op under tensor parallelism, got ",
               s.tp_op_seconds);
  p.tp_op_seconds = s.tp_op_seconds;
  DT_CHECK_ARG(s.optimizer_tensor_seconds >= 0, kOp, "expected a non-negative optimizer time per tensor, got ",
               s.optimizer_tensor_seconds);
  p.optimizer_tensor_seconds = s.optimizer_tensor_seconds;
  DT_CHECK_ARG(s.fsdp_collective_seconds >= 0, kOp, "expected a non-negative FSDP time per collective, got ",
               s.fsdp_collective_seconds);
  p.fsdp_collective_seconds = s.fsdp_collective_seconds;
  // rate = R / (1 + d0 (1/m + 1/n + 1/k))  <=>  1/rate = 1/R + (d0/R) (1/m + 1/n + 1/k).
  std::vector<double> x, y;
  for (const CalibrationSamples::Gemm& g : s.gemm) {
    DT_CHECK_ARG(g.m >= 1 && g.n >= 1 && g.k >= 1 && g.flops_per_s > 0, kOp,
                 "expected GEMM sizes >= 1 and a positive rate, got ", g.m, " x ", g.n, " x ", g.k, " at ",
                 g.flops_per_s, " FLOP/s");
    x.push_back(1.0 / static_cast<double>(g.m) + 1.0 / static_cast<double>(g.n) + 1.0 / static_cast<double>(g.k));
    y.push_back(1.0 / g.flops_per_s);
  }
  Line gemm = fit_line(x, y);
  if (gemm.intercept <= 0 || gemm.slope < 0) {
    // Noise made the line meaningless (rates falling with size): a flat rate, the best seen.
    double best = 0;
    for (const CalibrationSamples::Gemm& g : s.gemm) best = std::max(best, g.flops_per_s);
    gemm = {1.0 / best, 0};
  }
  p.gemm_flops = 1.0 / gemm.intercept;
  p.gemm_half_dim = 3 * gemm.slope / gemm.intercept;
  // t(B) = 2(n-1) alpha + 2(n-1)/n B / beta. On one rank an all-reduce moves nothing:
  // its cost is a call's overhead, kept as the latency, and beta is the copy rate.
  const double n = static_cast<double>(s.ranks);
  x.clear();
  y.clear();
  for (const CalibrationSamples::Collective& c : s.all_reduce) {
    DT_CHECK_ARG(c.bytes >= 1 && c.seconds > 0, kOp, "expected an all-reduce of >= 1 byte taking positive time, got ",
                 c.bytes, " bytes in ", c.seconds, " s");
    x.push_back(static_cast<double>(c.bytes));
    y.push_back(c.seconds);
  }
  const Line collective = fit_line(x, y);
  const double hops = s.ranks > 1 ? 2 * (n - 1) : 1;
  const double wire = s.ranks > 1 ? 2 * (n - 1) / n : 1;
  p.latency = std::max(collective.intercept, 1e-7) / hops;
  p.bandwidth = collective.slope > 0 ? wire / collective.slope : s.copy_bytes_per_s;
  return p;
}

MachineProfile calibrate(const CalibrationOptions& options) {
  CalibrationOptions o = options;
  DT_CHECK_ARG(o.trials >= 1 && o.seconds_per_sample > 0, kOp, "expected trials >= 1 and seconds_per_sample > 0, got ",
               o.trials, " and ", o.seconds_per_sample);
  CalibrationSamples samples;
  if (o.backend == "threads") {
    const int ranks = static_cast<int>(o.ranks > 0 ? o.ranks : std::max(1u, std::thread::hardware_concurrency()));
    launch(ranks, [&](Group world) {
      CalibrationSamples mine = measure(world, o);
      if (world.rank() == 0) samples = std::move(mine);
    });
  } else {
    DT_CHECK_ARG(o.backend == "mpi", kOp, "expected the backend 'threads' or 'mpi', got '", o.backend, "'");
    const Group world = init("mpi");
    DT_CHECK_ARG(o.ranks == 0 || o.ranks == world.size(), kOp, "the mpi backend measures its world of ", world.size(),
                 " ranks, asked for ", o.ranks);
    samples = measure(world, o);
  }
  MachineProfile p = fit_profile(samples);
  p.machine = samples.machine;
  p.measured_at = utc_now();
  p.memory_bytes = host_memory_bytes();
  return p;
}

ClusterSpec MachineProfile::cluster(int64_t devices) const {
  DT_CHECK_ARG(devices >= 1, kOp, "expected at least one device, got ", devices);
  DT_CHECK_ARG(gemm_flops > 0 && bandwidth > 0 && memory_bandwidth > 0 && ranks >= 1, kOp,
               "the profile has no rates (expected one from calibrate or load)");
  // More ranks than measured share the cores further; fewer have more of the cores'
  // threads each (cpu::threads_per_rank: the host's cores over its ranks), which the
  // GEMMs, copies and collectives use but the host's dispatch of an op does not.
  const double share = static_cast<double>(ranks) / static_cast<double>(devices);
  ClusterSpec c;
  c.name = "cpu (measured)";
  c.devices = devices;
  c.devices_per_node = devices;
  c.memory_bytes = (memory_bytes > 0 ? memory_bytes : 24e9) / static_cast<double>(devices);
  c.peak_flops = gemm_flops * share;
  c.gemm_efficiency = 1.0;  // gemm_flops is a measured rate already
  c.gemm_half_dim = std::max(gemm_half_dim, 1e-3);
  c.intra_bandwidth = c.inter_bandwidth = bandwidth * share;
  c.intra_latency = c.inter_latency = latency;
  c.memory_bandwidth = memory_bandwidth * share;
  // The host is the same memory (offload's copies are copies within it), as the cpu
  // preset has it.
  c.host_bandwidth = c.host_memory_bandwidth = c.memory_bandwidth;
  c.host_memory_bytes = c.memory_bytes;
  c.host_is_device_memory = true;
  const double host_share = std::min(1.0, share);  // one thread dispatches however many a rank has
  c.op_seconds = op_seconds / host_share;
  c.tp_op_seconds = tp_op_seconds / host_share;
  c.optimizer_tensor_seconds = optimizer_tensor_seconds / host_share;
  c.fsdp_collective_seconds = fsdp_collective_seconds / host_share;
  c.overlap_communication = false;  // the ranks' cores copy the bytes
  c.bytes_per_value = 4;
  c.validate();
  return c;
}

std::string MachineProfile::to_string() const {
  std::ostringstream os;
  os.precision(3);
  os << "GEMM " << gemm_flops / 1e9 << " GFLOP/s per rank (half of it at size " << gemm_half_dim << "), copy "
     << memory_bandwidth / 1e9 << " GB/s per rank, collectives " << latency * 1e6 << " us per hop and "
     << bandwidth / 1e9 << " GB/s per rank, " << op_seconds * 1e6 << " us per dispatched op (" << tp_op_seconds * 1e6
     << " under tensor parallelism), " << optimizer_tensor_seconds * 1e6
     << " us per parameter tensor in the optimizer step, " << fsdp_collective_seconds * 1e6
     << " us per FSDP collective (" << backend << ", " << ranks << " ranks busy)";
  return os.str();
}

void MachineProfile::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "dtensor machine profile 1";
  j["machine"] = machine;
  j["measured_at"] = measured_at;
  j["backend"] = backend;
  j["ranks"] = ranks;
  j["memory_bytes"] = memory_bytes;
  j["gemm_flops"] = gemm_flops;
  j["gemm_half_dim"] = gemm_half_dim;
  j["memory_bandwidth"] = memory_bandwidth;
  j["latency"] = latency;
  j["bandwidth"] = bandwidth;
  j["op_seconds"] = op_seconds;
  j["tp_op_seconds"] = tp_op_seconds;
  j["optimizer_tensor_seconds"] = optimizer_tensor_seconds;
  j["fsdp_collective_seconds"] = fsdp_collective_seconds;
  nlohmann::json gemm = nlohmann::json::array(), collectives = nlohmann::json::array();
  for (const CalibrationSamples::Gemm& g : samples.gemm)
    gemm.push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"flops_per_s", g.flops_per_s}});
  for (const CalibrationSamples::Collective& c : samples.all_reduce)
    collectives.push_back({{"bytes", c.bytes}, {"seconds", c.seconds}});
  j["samples"] = {{"gemm", gemm},
                  {"all_reduce", collectives},
                  {"copy_bytes_per_s", samples.copy_bytes_per_s},
                  {"op_seconds", samples.op_seconds},
                  {"tp_op_seconds", samples.tp_op_seconds},
                  {"optimizer_tensor_seconds", samples.optimizer_tensor_seconds},
                  {"fsdp_collective_seconds", samples.fsdp_collective_seconds}};
  const std::string tmp = path + ".part";
  {
    std::ofstream out(tmp, std::ios::trunc);
    DT_CHECK_ARG(out.good(), kOp, "cannot write '", tmp, "': ", std::strerror(errno));
    out << j.dump(2) << "\n";
    out.flush();
    DT_CHECK_ARG(out.good(), kOp, "writing '", tmp, "' failed: ", std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    DT_CHECK_ARG(false, kOp, "cannot rename '", tmp, "' to '", path, "'");
  }
}

MachineProfile MachineProfile::load(const std::string& path) {
  std::ifstream in(path);
  DT_CHECK_ARG(in.good(), kOp, "cannot open '", path, "': ", std::strerror(errno),
               " (write one with dtensor-plan --calibrate ", path, ")");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DT_CHECK_ARG(false, kOp, "'", path, "' is not JSON: ", e.what());
  }
  DT_CHECK_ARG(field<std::string>(j, "format", path) == "dtensor machine profile 1", kOp, "'", path,
               "': expected format 'dtensor machine profile 1', got '", j.at("format").get<std::string>(), "'");
  MachineProfile p;
  p.machine = field<std::string>(j, "machine", path);
  p.measured_at = field<std::string>(j, "measured_at", path);
  p.backend = field<std::string>(j, "backend", path);
  p.ranks = field<int64_t>(j, "ranks", path);
  p.memory_bytes = field<double>(j, "memory_bytes", path);
  p.gemm_flops = field<double>(j, "gemm_flops", path);
  p.gemm_half_dim = field<double>(j, "gemm_half_dim", path);
  p.memory_bandwidth = field<double>(j, "memory_bandwidth", path);
  p.latency = field<double>(j, "latency", path);
  p.bandwidth = field<double>(j, "bandwidth", path);
  p.op_seconds = field<double>(j, "op_seconds", path);
  // Profiles written before it was measured: not costed.
  p.optimizer_tensor_seconds =
      j.contains("optimizer_tensor_seconds") ? field<double>(j, "optimizer_tensor_seconds", path) : 0;
  p.fsdp_collective_seconds =
      j.contains("fsdp_collective_seconds") ? field<double>(j, "fsdp_collective_seconds", path) : 0;
  // ... and before tensor parallelism's was: a plain op's.
  p.tp_op_seconds = j.contains("tp_op_seconds") ? field<double>(j, "tp_op_seconds", path) : p.op_seconds;
  DT_CHECK_ARG(p.ranks >= 1 && p.gemm_flops > 0 && p.gemm_half_dim >= 0 && p.memory_bandwidth > 0 && p.latency >= 0 &&
                   p.bandwidth > 0 && p.op_seconds >= 0 && p.tp_op_seconds >= 0 && p.optimizer_tensor_seconds >= 0 &&
                   p.fsdp_collective_seconds >= 0,
               kOp, "'", path, "': expected ranks >= 1 and positive rates, got ", p.to_string());
  if (j.contains("samples")) {
    const nlohmann::json& s = j.at("samples");
    p.samples.ranks = p.ranks;
    p.samples.backend = p.backend;
    for (const nlohmann::json& g : field<nlohmann::json>(s, "gemm", path)) {
      // Square samples of earlier profiles: {"dim": d}.
      auto size = [&](const char* name) { return field<int64_t>(g, g.contains("dim") ? "dim" : name, path); };
      p.samples.gemm.push_back({size("m"), size("n"), size("k"), field<double>(g, "flops_per_s", path)});
    }
    for (const nlohmann::json& c : field<nlohmann::json>(s, "all_reduce", path))
      p.samples.all_reduce.push_back({field<int64_t>(c, "bytes", path), field<double>(c, "seconds", path)});
    p.samples.copy_bytes_per_s = field<double>(s, "copy_bytes_per_s", path);
    p.samples.op_seconds = field<double>(s, "op_seconds", path);
    p.samples.tp_op_seconds = p.tp_op_seconds;
    p.samples.optimizer_tensor_seconds = p.optimizer_tensor_seconds;
    p.samples.fsdp_collective_seconds = p.fsdp_collective_seconds;
  }
  return p;
}

}  // namespace dtensor::parallel
