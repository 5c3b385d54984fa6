// Data-parallel GPT training: the same model code on one rank or many.
//
//   ./build/examples/train_gpt --mesh dp=2 --steps 200
//   ./build/examples/train_gpt --config examples/configs/small.json --precision bf16
//   ./build/examples/train_gpt --mesh dp=4 --fsdp 3              # ZeRO-3 (FSDP)
//   ./build/examples/train_gpt --mesh dp=2,tp=2 --fsdp 3         # FSDP over tensor parallel
//   ./build/examples/train_gpt --mesh replicate=2,dp=2 --fsdp 3 --hsdp
//   mpirun -np 2 ./build/examples/train_gpt --backend mpi --mesh dp=2
//
// Every flag can also come from a JSON file (--config) with the same keys; flags
// given on the command line win. Run with --help for the list. The keys, their
// types, defaults and help are one table, examples/common/train_config.cpp.
#include <dtensor/dtensor.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "train_config.h"  // the keys of the flags and the config file (examples/common)
#include "train_log.h"

using namespace dtensor;
using dtensor::tools::TrainConfig;
using dtensor::tools::TrainLog;

namespace {

// The mesh flag: "dp=2", "tp=2", "dp=2,tp=2", "replicate=2,dp=2" (HSDP; pipeline
// layouts arrive with their issue).
MeshSpec parse_mesh(const std::string& text) {
  MeshSpec mesh;
  try {
    mesh = parse_mesh_spec(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--mesh: ") + e.what());
  }
  for (const std::string& name : mesh.names) {
    if (name != "dp" && name != "tp" && name != "replicate") {
      throw std::invalid_argument("--mesh: dims are dp (data parallel), tp (tensor parallel) and replicate (HSDP replica groups), got '" +
                                  name + "'");
    }
  }
  return mesh;
}

struct Settings {
  MeshSpec mesh;
  int64_t dp = 1, tp = 1, steps = 0, batch = 0, grad_accum = 1;  // dp: data-parallel ranks (dp x replicate)
  int64_t fsdp = 0;
  bool hsdp = false;
  bool sequence_parallel = false, loss_parallel = true;
  std::string backend, precision, data, trace, out, log;
  int64_t trace_first = 0, trace_count = 0;
  nn::GPTConfig model;
  double lr = 0, min_lr = 0, weight_decay = 0, clip = 0, bucket_mb = 25;
  int64_t warmup = 0, vocab = 0;
  uint64_t seed = 0;
};

Settings read_settings(const TrainConfig& o) {
  Settings s;
  s.mesh = parse_mesh(o.mesh);
  s.dp = s.mesh.size("dp") * s.mesh.size("replicate");
  s.tp = s.mesh.size("tp");
  const auto has = [&](const char* name) { return std::count(s.mesh.names.begin(), s.mesh.names.end(), name) > 0; };
  s.fsdp = o.fsdp;
  s.hsdp = o.hsdp;
  if (s.fsdp < 0 || s.fsdp > 3) throw std::invalid_argument("--fsdp: expected 0 (off, DDP), 1, 2 or 3, got " + std::to_string(s.fsdp));
  if (s.fsdp > 0 && !has("dp")) {
    throw std::invalid_argument("--fsdp " + std::to_string(s.fsdp) + " shards over the mesh dim 'dp', --mesh " +
                                o.mesh + " has none");
  }
  if (s.hsdp && (s.fsdp == 0 || !has("replicate"))) {
    throw std::invalid_argument(
        "--hsdp needs --fsdp 1|2|3 and a 'replicate' mesh dim (e.g. --mesh replicate=2,dp=2), got --fsdp " +
        std::to_string(s.fsdp) + " --mesh " + o.mesh);
  }
  if (!s.hsdp && has("replicate")) {
    throw std::invalid_argument("--mesh " + o.mesh + ": a 'replicate' dim is for HSDP (add --fsdp N --hsdp)");
  }
  s.sequence_parallel = o.sequence_parallel;
  s.loss_parallel = !o.gather_logits;
  s.backend = o.backend;
  s.steps = o.steps;
  s.batch = o.batch;
  s.grad_accum = o.grad_accum;
  if (s.steps < 1) throw std::invalid_argument("--steps: expected at least 1, got " + std::to_string(s.steps));
  if (s.grad_accum < 1) throw std::invalid_argument("--grad-accum: expected at least 1, got " + std::to_string(s.grad_accum));
  if (s.batch < 1 || s.batch % (s.dp * s.grad_accum) != 0) {
    throw std::invalid_argument("--batch " + std::to_string(s.batch) + " must be a positive multiple of dp (" +
                                std::to_string(s.dp) + ") x grad-accum (" + std::to_string(s.grad_accum) + ")");
  }
  s.model.block_size = o.seq_len;
  s.model.layers = o.layers;
  s.model.dim = o.dim;
  s.model.heads = o.heads;
  s.model.mlp_hidden = o.mlp_hidden;
  s.model.activation = o.activation == "gelu" ? nn::Activation::Gelu : nn::Activation::SwiGlu;
  s.model.rms_norm = o.norm == "rmsnorm";
  s.model.dropout = o.dropout;
  s.model.checkpoint_activations = o.checkpoint_activations;
  if (s.model.heads < 1 || s.model.dim % s.model.heads != 0) {
    throw std::invalid_argument("--dim " + std::to_string(s.model.dim) + " must be a multiple of --heads " +
                                std::to_string(s.model.heads));
  }
  s.vocab = o.vocab;
  s.data = o.data;
  s.lr = o.lr;
  s.min_lr = o.min_lr;
  s.warmup = o.warmup;
  s.weight_decay = o.weight_decay;
  s.clip = o.clip;
  s.bucket_mb = o.bucket_mb;
  s.precision = o.precision;
  s.seed = static_cast<uint64_t>(o.seed);
  s.trace = o.trace;
  const std::string steps = o.trace_steps;
  const size_t colon = steps.find(':');
  if (colon == std::string::npos) throw std::invalid_argument("--trace-steps: expected FIRST:COUNT, got '" + steps + "'");
  const auto whole = [&](const std::string& part) {
    char* end = nullptr;
    const long long value = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end || value < 0) {
      throw std::invalid_argument("--trace-steps: expected FIRST:COUNT, two whole numbers, got '" + steps + "'");
    }
    return static_cast<int64_t>(value);
  };
  s.trace_first = whole(steps.substr(0, colon));
  s.trace_count = whole(steps.substr(colon + 1));
  s.out = o.out;
  s.log = o.log;
  return s;
}

std::unique_ptr<TokenDataset> make_dataset(const Settings& s) {
  if (!s.data.empty()) return std::make_unique<CharDataset>(CharDataset::from_file(s.data, s.model.block_size));
  // Enough sequences that an epoch spans many steps.
  const int64_t sequences = std::max<int64_t>(s.batch * 64, 1024);
  return std::make_unique<SyntheticLanguage>(s.vocab, s.model.block_size, sequences, s.seed);
}

// One rank's training loop. Returns rank 0's log history through `log`.
void train(Group world, const Settings& s, const TokenDataset& data) {
  DeviceMesh mesh(world, s.mesh.shape, s.mesh.names);
  if (!s.trace.empty()) Tracer::record_steps(s.trace_first, s.trace_count);
  nn::GPTConfig config = s.model;
  config.vocab = data.vocab_size();
  nn::GPT model(mesh, config, s.seed);
  const bool has_dp = std::count(s.mesh.names.begin(), s.mesh.names.end(), "dp") > 0;
  const bool has_tp = std::count(s.mesh.names.begin(), s.mesh.names.end(), "tp") > 0;
  // Megatron tensor parallelism on tp (heads, MLP hidden and vocabulary sharded),
  // data parallelism (bucketed all-reduce) on dp.
  if (has_tp) {
    parallel::parallelize_module(model, mesh["tp"],
                                 parallel::gpt_tp_plan(config, {.sequence_parallel = s.sequence_parallel,
                                                                .loss_parallel = s.loss_parallel}));
  }
  const std::optional<DType> compute = s.precision == "bf16" ? std::optional<DType>(DType::BF16)
                                       : s.precision == "fp16" ? std::optional<DType>(DType::F16)
                                                               : std::nullopt;
  // Data parallelism on dp: DDP, or FSDP per block and then the root (over the
  // tensor-parallel layouts, if any: dp shards each tp piece).
  std::optional<parallel::DistributedDataParallel> ddp;
  std::optional<parallel::FSDPModule> fsdp;
  if (s.fsdp > 0) {
    parallel::FSDPOptions options{.stage = static_cast<int>(s.fsdp), .replicate_dim = s.hsdp ? "replicate" : ""};
    // 16-bit compute: gather the parameters in it, reduce gradients in F32.
    if (compute) options.mixed_precision = {.param_dtype = compute, .reduce_dtype = DType::F32};
    for (auto& [name, m] : model.named_modules()) {
      if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, options);
    }
    fsdp = parallel::fully_shard(model, mesh, options);
  } else if (has_dp) {
    ddp.emplace(model, parallel::DDPOptions{.bucket_cap_mb = s.bucket_mb, .dp_dim = "dp"});
  }
  // The batch is split over the data-parallel dims (replicate outer, dp inner) and
  // replicated over tp; each data-parallel rank reads its own slice.
  Placements batch_layout;
  int64_t dp_rank = 0;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const bool data_parallel = s.mesh.names[d] != "tp";
    batch_layout.push_back(data_parallel ? Shard(0) : Replicate());
    if (data_parallel) dp_rank = dp_rank * mesh.size(d) + mesh.coordinate(d);
  }
  AdamW optimizer(model.parameters(), {.lr = s.lr, .weight_decay = s.weight_decay});
  // Short runs (tests, smoke checks) shorten the warmup rather than fail.
  const WarmupCosine schedule(s.lr, std::min(s.warmup, s.steps), s.steps, s.min_lr);
  DistributedSampler sampler(data.size(), s.batch, dp_rank, s.dp, s.seed, true, s.grad_accum);
  const bool leader = world.rank() == 0;
  std::unique_ptr<TrainLog> log;
  if (leader && s.log != "quiet") {
    log = std::make_unique<TrainLog>(s.steps, s.log == "plain" ? TrainLog::Mode::Plain : TrainLog::Mode::Auto);
    std::printf("%s\n", cpu::summary().c_str());  // the CPU, its kernels and GEMM engines
    for (const std::string& w : cpu::warnings()) std::printf("warning: %s\n", w.c_str());
    const std::string parallelism = fsdp ? (s.hsdp ? "HSDP ZeRO-" : "FSDP ZeRO-") + std::to_string(s.fsdp)
                                    : ddp ? "DDP" : "no data parallelism";
    std::printf("GPT %lld parameters (%lld layers, dim %lld, %lld heads, vocab %lld, seq %lld) on %s (%s), %s backend, "
                "%s%s\n",
                static_cast<long long>(model.num_parameters()), static_cast<long long>(config.layers),
                static_cast<long long>(config.dim), static_cast<long long>(config.heads),
                static_cast<long long>(config.vocab), static_cast<long long>(config.block_size),
                mesh.to_string().c_str(), parallelism.c_str(), world.backend().c_str(), s.precision.c_str(),
                config.checkpoint_activations ? ", activation checkpointing" : "");
  }
  parallel::GradientSync* sync = fsdp ? static_cast<parallel::GradientSync*>(&*fsdp) : ddp ? &*ddp : nullptr;
  parallel::TrainerOptions training{.grad_accum = s.grad_accum,
                                    .clip_grad_norm = s.clip,
                                    .compute_dtype = fsdp ? std::nullopt : compute,
                                    .schedule = &schedule,
                                    .sync = sync,
                                    .tokens_per_step = s.batch * config.block_size};
  if (s.precision == "fp16") training.loss_scaling = LossScalerOptions{};
  parallel::Trainer trainer(optimizer, training);
  const Shape micro_shape{s.batch / s.grad_accum, config.block_size};
  for (int64_t step = 0; step < s.steps; ++step) {
    const parallel::StepReport report = trainer.step(step, [&](int64_t micro) {
      const TokenBatch batch = data.get_batch(sampler.micro_batch_at(step, micro));
      const DistTensor ids = DistTensor::from_local(batch.inputs, mesh, batch_layout, micro_shape);
      const DistTensor targets = DistTensor::from_local(batch.targets, mesh, batch_layout, micro_shape);
      return model.loss(ids, targets);
    });
    if (log) log->step(report.stats);
  }
  if (log) {
    log->finish();
    const std::string svg = log->write_loss_curve(s.out, "GPT training loss (" + mesh.to_string() + ", " + s.precision + ")");
    std::printf("loss curve: %s and %s\n", s.out.c_str(), svg.c_str());
    if (const LossScaler* scaler = trainer.scaler()) {
      std::printf("fp16 loss scale %g, %lld skipped steps\n", scaler->scale_value(),
                  static_cast<long long>(scaler->skipped_steps()));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  try {
    // Defaults, then the config file (--config), then the flags given here.
    const std::optional<TrainConfig> config = tools::parse_train_args(argc, argv);
    if (!config) return 0;  // --help
    settings = read_settings(*config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 2;
  }
  try {
    const std::unique_ptr<TokenDataset> data = make_dataset(settings);
    if (settings.backend == "mpi") {
      Group world = init("mpi");
      const int64_t ranks = shape_numel(settings.mesh.shape);
      if (world.size() != ranks) {
        throw std::invalid_argument("--mesh " + settings.mesh.to_string() + " needs " + std::to_string(ranks) +
                                    " ranks, mpirun started " + std::to_string(world.size()));
      }
      std::string trace = settings.trace;
      // One file per process: trace.json -> trace.0.json, trace.1.json, ...
      if (!trace.empty() && trace.find("{rank}") == std::string::npos) {
        const size_t dot = trace.rfind('.');
        trace = dot == std::string::npos || dot < trace.rfind('/') + 1 ? trace + ".{rank}"
                                                                       : trace.substr(0, dot) + ".{rank}" + trace.substr(dot);
      }
      if (!trace.empty()) Tracer::start(trace);
      train(world, settings, *data);
      if (!trace.empty()) std::printf("trace: %s\n", Tracer::stop().c_str());
    } else {
      if (!settings.trace.empty()) Tracer::start(settings.trace);
      launch(static_cast<int>(shape_numel(settings.mesh.shape)), [&](Group world) { train(world, settings, *data); });
      if (!settings.trace.empty()) std::printf("trace: %s (open in Perfetto)\n", Tracer::stop().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
