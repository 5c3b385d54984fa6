// Pipeline schedules on this machine (issue 13).
//
// BM_PipelineMeasured: GPT training on pp = 2 (two ranks, one core's BLAS thread each)
// for every schedule and m micro-batches at one global batch of 16 sequences: the step
// time and tokens/s, the measured bubble of the median step next to the textbook
// (p-1)/(m+p-1) (GPipe, 1F1B), (p-1)/(vm+p-1) (interleaved) and (p-1)/(3m+p-1) (ZB-H1,
// m >= p), and the simulator's replay of the same action lists with the per-action
// costs measured in that step (each stage's mean F, B, I, W and the time to post a
// transfer), whose makespan is set next to the measured one.
//
// BM_PipelineSimulated: p = 4 and 8, which would share two cores here, replayed in the
// simulator with per-action costs measured by the p = 2 rows at the same m: the
// model's forward and backward per micro-batch (both stages' sum) cut into p equal
// stages; the row says `simulated`.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "dtensor/dtensor.h"

using namespace dtensor;
using namespace dtensor::parallel;
using namespace dtensor::models;

namespace {

constexpr int kWarmup = 2, kSteps = 5;
constexpr int64_t kBatch = 16;

// The GPT of the PyTorch peer (bench/peers/torch_pipeline_peer.py): 8 blocks of width
// 128, 4 heads, sequences of 64 tokens, vocabulary 256, an untied head (torch's
// pipelining holds each stage's parameters apart).
models::GPTConfig bench_config() {
  models::GPTConfig c;
  c.vocab = 256;
  c.block_size = 64;
  c.layers = 8;
  c.dim = 128;
  c.heads = 4;
  c.tie_weights = false;
  return c;
}

// Per micro-batch, measured: the summed cost of every stage, per kind.
struct MeasuredCosts {
  double forward = 0, backward = 0, backward_input = 0, backward_weight = 0, post = 0;
};
std::mutex costs_mutex;
std::map<std::pair<int, int>, MeasuredCosts> measured_costs;  // (kind, m)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The simulator's inputs from a measured timeline: each stage's mean duration per kind
// of compute, and the mean time a rank spent posting one transfer.
ActionCosts costs_of(const Timeline& t, int stages) {
  ActionCosts c;
  std::vector<double> sum[4], count[4];
  for (auto& v : sum) v.assign(static_cast<size_t>(stages), 0);
  for (auto& v : count) v.assign(static_cast<size_t>(stages), 0);
  double post = 0, posts = 0;
  for (const auto& rank : t.entries) {
    for (const TimelineEntry& e : rank) {
      if (e.action.is_compute()) {
        const size_t k = static_cast<size_t>(e.action.kind), s = static_cast<size_t>(e.action.stage);
        sum[k][s] += e.end - e.start;
        count[k][s] += 1;
      } else if (e.action.is_send()) {
        post += e.end - e.start;
        posts += 1;
      }
    }
  }
  std::vector<double>* out[4] = {&c.forward, &c.backward, &c.backward_input, &c.backward_weight};
  for (size_t k = 0; k < 4; ++k) {
    out[k]->assign(static_cast<size_t>(stages), 0);
    for (size_t s = 0; s < static_cast<size_t>(stages); ++s) {
      if (count[k][s] > 0) (*out[k])[s] = sum[k][s] / count[k][s];
    }
  }
  c.post = posts > 0 ? post / posts : 0;
  return c;
}

double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

void BM_PipelineMeasured(benchmark::State& state) {
  const auto kind = static_cast<ScheduleKind>(state.range(0));
  const int m = static_cast<int>(state.range(1)), v = static_cast<int>(state.range(2));
  const models::GPTConfig config = bench_config();
  constexpr int p = 2;
  double step_seconds = 0, makespan = 0, simulated = 0, bubble = 0, peak_bytes = 0;
  Timeline kept;
  for (auto _ : state) {
    launch(p, [&](Group world) {
      DeviceMesh mesh(world, {p}, {"pp"});
      PipelineMesh pm(mesh);
      GPTPipeline gpt(pm, config, 1, {.schedule = kind, .micro_batches = m, .virtual_stages = v});
      SyntheticLanguage data(config.vocab, config.block_size, 1024, 1);
      DistributedSampler sampler(data.size(), kBatch, 0, 1, 1);
      const std::vector<int64_t> rows = parallel::micro_batch_rows(kBatch, m);
      std::vector<double> weights;
      for (int64_t r : rows) weights.push_back(static_cast<double>(r) / kBatch);
      auto micro = [&](int64_t step, int64_t k, bool targets) {
        const TokenBatch b = data.get_batch(sampler.batch_at(step));
        int64_t offset = 0;
        for (int64_t i = 0; i < k; ++i) offset += rows[static_cast<size_t>(i)];
        const Tensor local = (targets ? b.targets : b.inputs).narrow(0, offset, rows[static_cast<size_t>(k)]).contiguous();
        return distribute(local, pm.stage_mesh(), {Replicate()});
      };
      std::unique_ptr<Pipeline> pipe = gpt.make_pipeline(
          {}, [&](int64_t step, int64_t k) { return micro(step, k, false); },
          [&](int64_t step, int64_t k) { return micro(step, k, true); }, weights);
      AdamW optimizer(gpt.parameters(), 1e-3);
      Trainer trainer(optimizer, {.clip_grad_norm = 1.0});
      std::vector<double> seconds;
      std::vector<Timeline> timelines;
      int64_t peak = 0;
      for (int step = 0; step < kWarmup + kSteps; ++step) {
        barrier(world);
        const StepReport report = trainer.step(step, *pipe);
        Timeline t = pipe->gather_timeline();
        if (step < kWarmup) continue;
        seconds.push_back(report.stats.seconds);
        timelines.push_back(std::move(t));
        peak = std::max(peak, pipe->stats().peak_held_bytes);
      }
      const double slowest_peak =
          all_reduce(world, Tensor::full({1}, static_cast<double>(peak), DType::F64), ReduceOp::Max).item<double>();
      if (world.rank() == 0) {
        // The step of median time, and its timeline.
        std::vector<size_t> order(seconds.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return seconds[a] < seconds[b]; });
        const size_t mid = order[order.size() / 2];
        step_seconds = seconds[mid];
        kept = timelines[mid];
        makespan = kept.makespan();
        bubble = kept.bubble_fraction();
        const ActionCosts costs = costs_of(kept, pipe->schedule().stages);
        simulated = simulate(pipe->schedule(), costs).makespan();
        peak_bytes = slowest_peak;
        const std::lock_guard<std::mutex> lock(costs_mutex);
        measured_costs[{static_cast<int>(kind), m}] = {sum_of(costs.forward), sum_of(costs.backward),
                                                       sum_of(costs.backward_input), sum_of(costs.backward_weight),
                                                       costs.post};
      }
    });
    state.SetIterationTime(step_seconds);
  }
  state.counters["m"] = m;
  state.counters["step_ms"] = step_seconds * 1e3;
  state.counters["tokens_per_s"] = static_cast<double>(kBatch * config.block_size) / step_seconds;
  state.counters["bubble"] = bubble;
  state.counters["bubble_theory"] = theoretical_bubble(kind, p, m, v);
  state.counters["pipeline_ms"] = makespan * 1e3;
  state.counters["simulated_ms"] = simulated * 1e3;
  state.counters["sim_error"] = simulated / makespan - 1;
  state.counters["peak_held_MiB"] = peak_bytes / 1048576.0;
  state.SetLabel(std::string(schedule_kind_name(kind)) + " p=2 measured" + (v > 1 ? " v=" + std::to_string(v) : ""));
  if (m == 8) {
    const std::string name = "bench_pipeline_" + std::string(schedule_kind_name(kind)) + "_p2_m8";
    kept.title = std::string(schedule_kind_name(kind)) + ", p = 2, m = 8, measured step (GPT 8 x 128, 16 x 64 tokens)";
    kept.write_svg(name + ".svg");
    kept.write_chrome_trace(name + ".json");
  }
}

void BM_PipelineSimulated(benchmark::State& state) {
  const auto kind = static_cast<ScheduleKind>(state.range(0));
  const int m = static_cast<int>(state.range(1)), p = static_cast<int>(state.range(2));
  const int v = kind == ScheduleKind::Interleaved1F1B ? 2 : 1;
  if (p == 4 && m == 8) {
    // The textbook picture: uniform stages, F = 1 ms, B = 2 ms (I = W = 1 ms).
    Timeline uniform = simulate(make_schedule(kind, p, m, v), ActionCosts::uniform(1e-3, 2e-3));
    uniform.title = std::string(schedule_kind_name(kind)) + ", p = 4, m = 8" + (v > 1 ? ", v = 2" : "") +
                    ", simulated with F = 1 ms, B = 2 ms (I = W = 1 ms)";
    uniform.write_svg("bench_pipeline_" + std::string(schedule_kind_name(kind)) + "_p4_m8_uniform.svg");
  }
  MeasuredCosts measured;
  {
    const std::lock_guard<std::mutex> lock(costs_mutex);
    const auto it = measured_costs.find({static_cast<int>(kind), m});
    if (it == measured_costs.end()) {
      state.SkipWithError("no measured p = 2 row at this m (run the whole benchmark)");
      return;
    }
    measured = it->second;
  }
  const Schedule schedule = make_schedule(kind, p, m, v);
  const double stages = schedule.stages;
  ActionCosts costs;
  costs.forward = {measured.forward / stages};
  costs.backward = {measured.backward / stages};
  costs.backward_input = {measured.backward_input / stages};
  costs.backward_weight = {measured.backward_weight / stages};
  costs.post = measured.post;
  Timeline t;
  for (auto _ : state) {
    t = simulate(schedule, costs);
    state.SetIterationTime(t.makespan());
  }
  state.counters["m"] = m;
  state.counters["pipeline_ms"] = t.makespan() * 1e3;
  state.counters["bubble"] = t.bubble_fraction();
  state.counters["bubble_theory"] = theoretical_bubble(kind, p, m, v);
  state.counters["tokens_per_s"] = static_cast<double>(kBatch * bench_config().block_size) / t.makespan();
  state.SetLabel(std::string(schedule_kind_name(kind)) + " p=" + std::to_string(p) + " simulated" +
                 (v > 1 ? " v=" + std::to_string(v) : ""));
}

void measured_rows(benchmark::internal::Benchmark* b) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                            ScheduleKind::ZeroBubble}) {
    for (int m = 1; m <= 16; ++m) {
      // Interleaving needs m to be a multiple of p.
      if (kind == ScheduleKind::Interleaved1F1B && m % 2 != 0) continue;
      b->Args({static_cast<int64_t>(kind), m, kind == ScheduleKind::Interleaved1F1B ? 2 : 1});
    }
  }
}

void simulated_rows(benchmark::internal::Benchmark* b) {
  for (int p : {4, 8}) {
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                              ScheduleKind::ZeroBubble}) {
      for (int m = 1; m <= 16; ++m) {
        if (kind == ScheduleKind::Interleaved1F1B && (m % 2 != 0 || m % p != 0)) continue;
        b->Args({static_cast<int64_t>(kind), m, p});
      }
    }
  }
}

}  // namespace

BENCHMARK(BM_PipelineMeasured)->Apply(measured_rows)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PipelineSimulated)->Apply(simulated_rows)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
