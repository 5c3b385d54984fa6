// dtensor-plan: the parallel configurations of a transformer on a cluster, ranked by
// predicted step time, with memory per device and MFU (dtensor/parallel/plan.h).
//
//   dtensor-plan --layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 \
//                --cluster h100 --devices 1024 --global-batch 1536
//   dtensor-plan --validate    # the model against published runs; exit 0 when all within 15%
//   dtensor-plan --calibrate machine.json      # measure this machine (GEMMs, copies, collectives)
//   dtensor-plan --profile machine.json --devices 2 --layers 2 --hidden 64 --heads 4 --seq 32 --vocab 32 \
//                --global-batch 8          # ranked on this machine's measured rates
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "common/cli.h"
#include "dtensor/group.h"
#include "dtensor/parallel/machine_profile.h"
#include "dtensor/parallel/plan.h"

using namespace dtensor;
using namespace dtensor::parallel;

namespace {

double published_measure(const PublishedRun& run, const PlanEstimate& e) {
  return (run.hardware ? e.hardware_flops_per_device : e.model_flops_per_device) / 1e12;
}

int validate(double tolerance, const std::string& source) {
  std::printf("%-62s %-52s %9s %9s %7s\n", "published run", "configuration (published, or its stand-in)", "published",
              "predicted", "error");
  bool all = true;
  for (const PublishedRun& run : published_runs()) {
    if (run.source.find(source) == std::string::npos) continue;
    const PlanEstimate e = estimate_published(run);
    const PlanEstimate as_published = estimate_plan(run.model, run.cluster, run.global_batch, run.plan);
    const double predicted = published_measure(run, e);
    const double error = predicted / run.tflops_per_device - 1;
    const bool ok = std::abs(error) <= tolerance;
    all &= ok;
    std::printf("%-62s %-52s %9.0f %9.0f %+6.1f%%%s\n", run.source.c_str(),
                (e.plan.to_string() + (run.tuned_degrees    ? " (degrees, recipe, schedule tuned)"
                                       : run.tuned_recipe   ? " (recipe, schedule tuned)"
                                       : run.tuned_schedule ? " (schedule tuned)"
                                                            : ""))
                    .c_str(),
                run.tflops_per_device, predicted, error * 100, ok ? "" : "  (outside the tolerance)");
    if (!as_published.fits && !run.tuned()) {
      std::printf(
          "    memory: the model says the published configuration %s (it ran: the memory model misses what "
          "it did)\n",
          as_published.rejected.c_str());
    }
    std::printf("    %s\n", e.to_string().c_str());
    if (!e.fits) {
      std::printf(
          "    (no configuration with what was published fits in the memory model: the fastest of them; the "
          "run itself fit, so the memory model misses what it did)\n");
    }
    const PlanSearch found = search_plans(run.model, run.cluster, run.global_batch);
    if (!found.ranked.empty()) {
      const PlanEstimate& best = found.ranked.front();
      std::printf("    picked: %s, %.0f TFLOP/s, %.2fx the published configuration's predicted step\n",
                  best.plan.to_string().c_str(), published_measure(run, best), e.step_seconds / best.step_seconds);
    }
  }
  std::printf("%s: every published run%s within %.0f%%\n", all ? "OK" : "NOT OK",
              source.empty() ? "" : (" of '" + source + "'").c_str(), tolerance * 100);
  return all ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Parallel configurations of a transformer on a cluster, ranked by predicted step time.", "dtensor-plan"};
  std::string family = "gpt", cluster_name = "h100";
  int64_t layers = 24, hidden = 2048, heads = 16, kv_heads = 0, ffn = 0, seq = 2048, vocab = 51200, devices = 8,
          batch = 512, top = 10, experts = 0, top_k = 0;
  double memory_gb = 0;
  std::string source, calibrate_to, profile_path, backend = "threads";
  int64_t ranks = 0, cp = 0, ep = 0, max_cp = 8, zero_shard = -1;
  std::string offload = "search";
  bool run_validation = false, show_rejected = false;
  app.add_option("--model", family, "gpt (GELU MLP, tied embeddings) or llama (SwiGLU, GQA, untied)")
      ->check(CLI::IsMember({"gpt", "llama"}));
  app.add_option("--layers", layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", hidden, "model width")->capture_default_str();
  app.add_option("--heads", heads, "attention heads")->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "key/value heads (0: --heads)")->capture_default_str();
  app.add_option("--ffn", ffn, "MLP width (0: 4 x hidden)")->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence")->capture_default_str();
  app.add_option("--vocab", vocab, "vocabulary")->capture_default_str();
  app.add_option("--experts", experts, "mixture of experts: experts per block (0: dense)")->capture_default_str();
  app.add_option("--top-k", top_k, "with --experts: experts per token")->capture_default_str();
  app.add_option("--cluster", cluster_name, "a100, h100, h200 (8 per node, NVLink, InfiniBand) or cpu (this machine)")
      ->capture_default_str();
  app.add_option("--devices", devices, "devices in all")->capture_default_str();
  app.add_option("--memory-gb", memory_gb, "usable memory per device (0: the preset's)")->capture_default_str();
  app.add_option("--global-batch", batch, "sequences per optimizer step")->capture_default_str();
  app.add_option("--cp", cp, "context-parallel degree (0: searched up to --max-cp)")->capture_default_str();
  app.add_option("--max-cp", max_cp, "the largest context-parallel degree searched")->capture_default_str();
  app.add_option("--ep", ep, "expert-parallel degree, of the dp ranks (0: searched for --experts)")
      ->capture_default_str();
  app.add_option("--zero-shard", zero_shard,
                 "HSDP: ranks ZeRO shards over, the rest replicas (-1: searched, 0: the whole data-parallel group)")
      ->capture_default_str();
  app.add_option("--offload", offload, "ZeRO-Offload of the optimizer to the host: search, on or off")
      ->check(CLI::IsMember({"search", "on", "off"}))
      ->capture_default_str();
  app.add_option("--top", top, "plans to print")->capture_default_str();
  app.add_flag("--rejected", show_rejected, "also list why the other configurations were rejected");
  app.add_flag("--validate", run_validation, "compare the model with published runs (exit 0 when all within 15%)");
  app.add_option("--source", source, "with --validate: only the runs whose source names this (e.g. Megatron-LM)");
  app.add_option("--calibrate", calibrate_to,
                 "measure this machine's GEMMs, memory copies and collectives and write the profile to this file");
  app.add_option("--ranks", ranks, "with --calibrate: ranks busy at once (0: the cores; mpi: the world)")
      ->capture_default_str();
  app.add_option("--backend", backend, "with --calibrate: threads, or mpi under mpirun")
      ->check(CLI::IsMember({"threads", "mpi"}))
      ->capture_default_str();
  app.add_option("--profile", profile_path, "rank on a measured machine (a --calibrate file) instead of --cluster");
  try {
    if (!tools::parse_command_line(app, argc, argv)) return 0;
    if (run_validation) return validate(0.15, source);
    if (!calibrate_to.empty()) {
      CalibrationOptions options;
      options.ranks = ranks;
      options.backend = backend;
      const MachineProfile profile = calibrate(options);
      if (backend == "mpi" && init("mpi").rank() != 0) return 0;  // rank 0 reports and writes
      std::printf("%s\n", profile.machine.c_str());
      for (const CalibrationSamples::Gemm& g : profile.samples.gemm)
        std::printf("  GEMM %4lld x %4lld x %4lld: %7.2f GFLOP/s per rank\n", static_cast<long long>(g.m),
                    static_cast<long long>(g.n), static_cast<long long>(g.k), g.flops_per_s / 1e9);
      for (const CalibrationSamples::Collective& c : profile.samples.all_reduce)
        std::printf("  all-reduce %9lld B over %lld ranks: %9.1f us\n", static_cast<long long>(c.bytes),
                    static_cast<long long>(profile.ranks), c.seconds * 1e6);
      std::printf("fitted: %s\n", profile.to_string().c_str());
      profile.save(calibrate_to);
      std::printf("wrote %s\n", calibrate_to.c_str());
      return 0;
    }
    ModelSpec model = family == "llama" ? ModelSpec::llama(layers, hidden, heads, kv_heads, ffn, seq, vocab)
                                        : ModelSpec::gpt(layers, hidden, heads, seq, vocab);
    model.ffn_hidden = ffn;
    model.kv_heads = kv_heads;
    model.experts = experts;
    model.top_k = top_k;
    ClusterSpec cluster = profile_path.empty() ? ClusterSpec::preset(cluster_name, devices)
                                               : MachineProfile::load(profile_path).cluster(devices);
    if (memory_gb > 0) cluster.memory_bytes = memory_gb * 1e9;
    PlanSearchOptions options;
    options.cp = cp;
    options.max_cp = max_cp;
    options.ep = ep;
    options.zero_shard = zero_shard;
    options.offload = offload == "search" ? -1 : offload == "on" ? 1 : 0;
    const PlanSearch found = search_plans(model, cluster, batch, options);
    std::printf(
        "%s: %.2fB parameters, %lld layers, hidden %lld, %lld heads, seq %lld, vocab %lld; %s x %lld, %.0f GB "
        "each; global batch %lld\n",
        model.name.c_str(), static_cast<double>(model.parameters()) / 1e9, static_cast<long long>(layers),
        static_cast<long long>(hidden), static_cast<long long>(heads), static_cast<long long>(seq),
        static_cast<long long>(vocab), cluster.name.c_str(), static_cast<long long>(devices),
        cluster.memory_bytes / 1e9, static_cast<long long>(batch));
    std::printf("%zu configurations fit, %zu rejected\n", found.ranked.size(), found.rejected.size());
    for (size_t i = 0; i < found.ranked.size() && static_cast<int64_t>(i) < top; ++i) {
      std::printf("%2zu. %s\n", i + 1, found.ranked[i].to_string().c_str());
    }
    // Why the rest were rejected: by reason (the memory reasons grouped).
    std::map<std::string, int64_t> reasons;
    for (const PlanEstimate& e : found.rejected) {
      const std::string r = e.rejected.rfind("needs ", 0) == 0 ? "does not fit in memory" : e.rejected;
      reasons[r]++;
    }
    for (const auto& [reason, count] : reasons)
      std::printf("rejected %lld: %s\n", static_cast<long long>(count), reason.c_str());
    if (show_rejected) {
      for (const PlanEstimate& e : found.rejected) std::printf("   %s\n", e.to_string().c_str());
    }
    return found.ranked.empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtensor-plan: %s\n", e.what());
    return 2;
  }
}
