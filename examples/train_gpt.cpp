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
// given on the command line win. Run with --help for the list.
#include <dtensor/dtensor.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

using namespace dtensor;

namespace {

// Every option, its default and its help text, in one table.
struct OptionSpec {
  const char* name;
  const char* fallback;
  const char* help;
  bool is_flag = false;  // a boolean switch without a value
};

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> specs = {
      {"mesh", "dp=2", "parallel layout: dp=2, tp=2, dp=2,tp=2 or replicate=2,dp=2 (the product is the number of ranks)"},
      {"sequence-parallel", "false", "with tp: norms and dropout on sequence shards (Megatron sequence parallelism)",
       true},
      {"gather-logits", "false", "with tp: all-gather the logits before the loss instead of the vocab-parallel loss",
       true},
      {"backend", "threads", "threads (ranks are threads of this process) or mpi (run under mpirun)"},
      {"steps", "200", "optimizer steps"},
      {"batch", "16", "global batch in sequences (split over dp, then over grad-accum)"},
      {"seq-len", "32", "tokens per sequence"},
      {"layers", "2", "transformer blocks"},
      {"dim", "64", "model width"},
      {"heads", "4", "attention heads"},
      {"mlp-hidden", "0", "MLP width (0: 4 x dim)"},
      {"activation", "gelu", "gelu or swiglu"},
      {"norm", "layernorm", "layernorm or rmsnorm"},
      {"dropout", "0", "dropout probability"},
      {"vocab", "32", "vocabulary of the built-in synthetic task"},
      {"data", "", "train on the characters of this text file instead of the synthetic task"},
      {"lr", "0.003", "peak learning rate (AdamW)"},
      {"min-lr", "0.0003", "learning rate at the end of the cosine decay"},
      {"warmup", "20", "linear warmup steps"},
      {"weight-decay", "0.01", "AdamW decoupled weight decay"},
      {"clip", "1.0", "gradient clipping by global norm (0: off)"},
      {"precision", "fp32", "fp32, bf16 or fp16 (16-bit compute, FP32 master weights; fp16 scales the loss)"},
      {"grad-accum", "1", "micro-batches per step"},
      {"checkpoint-activations", "false", "recompute each block's activations in backward", true},
      {"bucket-mb", "25", "DDP gradient bucket size in MiB"},
      {"fsdp", "0", "0: DDP on dp; 1, 2, 3: FSDP with that ZeRO stage, sharded over the mesh dim dp"},
      {"hsdp", "false", "hybrid sharding: FSDP within dp, replicas across the mesh dim 'replicate'", true},
      {"seed", "1234", "seed of the model, the data order and dropout"},
      {"trace", "", "write a Chrome trace (Perfetto) of the traced steps to this file"},
      {"trace-steps", "2:2", "FIRST:COUNT of the steps to trace"},
      {"out", "train_gpt_loss.csv", "loss curve CSV (an SVG chart is written beside it)"},
      {"log", "auto", "auto (redraw on a terminal), plain (a line per step) or quiet"},
      {"config", "", "JSON file with any of these keys"},
  };
  return specs;
}

std::string usage() {
  std::ostringstream os;
  os << "usage: train_gpt [--key value | --key=value ...]\n";
  for (const OptionSpec& s : option_specs()) {
    os << "  --" << s.name << (s.is_flag ? "" : " V") << std::string(28 - std::string(s.name).size() - (s.is_flag ? 0 : 2), ' ')
       << s.help << (s.fallback[0] && !s.is_flag ? std::string(" [") + s.fallback + "]" : "") << "\n";
  }
  return os.str();
}

// The options as strings, from defaults, then the config file, then the flags.
class Options {
 public:
  Options(int argc, char** argv) {
    for (const OptionSpec& s : option_specs()) values_[s.name] = s.fallback;
    std::map<std::string, std::string> flags;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") throw HelpRequested();
      if (arg.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + arg + "' (options start with --)");
      arg = arg.substr(2);
      std::string value;
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
      const OptionSpec* spec = find(arg);
      if (!spec) throw std::invalid_argument("unknown option --" + arg + " (see --help)");
      if (eq == std::string::npos) {
        if (spec->is_flag) {
          value = "true";
        } else {
          if (i + 1 >= argc) throw std::invalid_argument("option --" + arg + " needs a value");
          value = argv[++i];
        }
      }
      flags[arg] = value;
    }
    if (flags.count("config") && !flags["config"].empty()) load_config(flags["config"]);
    for (const auto& [k, v] : flags) values_[k] = v;
  }

  struct HelpRequested {};

  std::string str(const std::string& key) const { return values_.at(key); }
  int64_t integer(const std::string& key) const {
    const std::string& v = values_.at(key);
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end) throw std::invalid_argument("--" + key + ": expected an integer, got '" + v + "'");
    return x;
  }
  double number(const std::string& key) const {
    const std::string& v = values_.at(key);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end) throw std::invalid_argument("--" + key + ": expected a number, got '" + v + "'");
    return x;
  }
  bool flag(const std::string& key) const {
    const std::string& v = values_.at(key);
    if (v == "true" || v == "1") return true;
    if (v == "false" || v == "0") return false;
    throw std::invalid_argument("--" + key + ": expected true or false, got '" + v + "'");
  }
  std::string choice(const std::string& key, const std::vector<std::string>& allowed) const {
    const std::string& v = values_.at(key);
    for (const std::string& a : allowed) {
      if (v == a) return v;
    }
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw std::invalid_argument("--" + key + ": expected one of " + list + ", got '" + v + "'");
  }

 private:
  static const OptionSpec* find(const std::string& name) {
    for (const OptionSpec& s : option_specs()) {
      if (name == s.name) return &s;
    }
    return nullptr;
  }

  void load_config(const std::string& path) {
    const Config config = Config::from_file(path);
    for (const std::string& key : config.keys()) {
      const OptionSpec* spec = find(key);
      if (!spec || key == "config") throw std::invalid_argument("[config] " + path + ": unknown key \"" + key + "\"");
      const JsonValue& v = config.get(key);
      if (spec->is_flag) {
        values_[key] = config.get_bool(key) ? "true" : "false";
      } else if (v.is_string()) {
        values_[key] = config.get_string(key);
      } else if (v.is_number()) {
        std::ostringstream os;
        os.precision(17);
        os << config.get_double(key);
        values_[key] = os.str();
      } else {
        throw std::invalid_argument("[config] " + path + ": key \"" + key + "\": expected a string or a number, got " +
                                    JsonValue::kind_name(v.kind()));
      }
    }
  }

  std::map<std::string, std::string> values_;
};

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

Settings read_settings(const Options& o) {
  Settings s;
  s.mesh = parse_mesh(o.str("mesh"));
  s.dp = s.mesh.size("dp") * s.mesh.size("replicate");
  s.tp = s.mesh.size("tp");
  const auto has = [&](const char* name) { return std::count(s.mesh.names.begin(), s.mesh.names.end(), name) > 0; };
  s.fsdp = o.integer("fsdp");
  s.hsdp = o.flag("hsdp");
  if (s.fsdp < 0 || s.fsdp > 3) throw std::invalid_argument("--fsdp: expected 0 (off, DDP), 1, 2 or 3, got " + std::to_string(s.fsdp));
  if (s.fsdp > 0 && !has("dp")) {
    throw std::invalid_argument("--fsdp " + std::to_string(s.fsdp) + " shards over the mesh dim 'dp', --mesh " + o.str("mesh") +
                                " has none");
  }
  if (s.hsdp && (s.fsdp == 0 || !has("replicate"))) {
    throw std::invalid_argument("--hsdp needs --fsdp 1|2|3 and a 'replicate' mesh dim (e.g. --mesh replicate=2,dp=2), got --fsdp " +
                                std::to_string(s.fsdp) + " --mesh " + o.str("mesh"));
  }
  if (!s.hsdp && has("replicate")) {
    throw std::invalid_argument("--mesh " + o.str("mesh") + ": a 'replicate' dim is for HSDP (add --fsdp N --hsdp)");
  }
  s.sequence_parallel = o.flag("sequence-parallel");
  s.loss_parallel = !o.flag("gather-logits");
  s.backend = o.choice("backend", {"threads", "mpi"});
  s.steps = o.integer("steps");
  s.batch = o.integer("batch");
  s.grad_accum = o.integer("grad-accum");
  if (s.steps < 1) throw std::invalid_argument("--steps: expected at least 1, got " + std::to_string(s.steps));
  if (s.grad_accum < 1) throw std::invalid_argument("--grad-accum: expected at least 1, got " + std::to_string(s.grad_accum));
  if (s.batch < 1 || s.batch % (s.dp * s.grad_accum) != 0) {
    throw std::invalid_argument("--batch " + std::to_string(s.batch) + " must be a positive multiple of dp (" +
                                std::to_string(s.dp) + ") x grad-accum (" + std::to_string(s.grad_accum) + ")");
  }
  s.model.block_size = o.integer("seq-len");
  s.model.layers = o.integer("layers");
  s.model.dim = o.integer("dim");
  s.model.heads = o.integer("heads");
  s.model.mlp_hidden = o.integer("mlp-hidden");
  s.model.activation = o.choice("activation", {"gelu", "swiglu"}) == "gelu" ? nn::Activation::Gelu : nn::Activation::SwiGlu;
  s.model.rms_norm = o.choice("norm", {"layernorm", "rmsnorm"}) == "rmsnorm";
  s.model.dropout = o.number("dropout");
  s.model.checkpoint_activations = o.flag("checkpoint-activations");
  if (s.model.heads < 1 || s.model.dim % s.model.heads != 0) {
    throw std::invalid_argument("--dim " + std::to_string(s.model.dim) + " must be a multiple of --heads " +
                                std::to_string(s.model.heads));
  }
  s.vocab = o.integer("vocab");
  s.data = o.str("data");
  s.lr = o.number("lr");
  s.min_lr = o.number("min-lr");
  s.warmup = o.integer("warmup");
  s.weight_decay = o.number("weight-decay");
  s.clip = o.number("clip");
  s.bucket_mb = o.number("bucket-mb");
  s.precision = o.choice("precision", {"fp32", "bf16", "fp16"});
  s.seed = static_cast<uint64_t>(o.integer("seed"));
  s.trace = o.str("trace");
  const std::string steps = o.str("trace-steps");
  const size_t colon = steps.find(':');
  if (colon == std::string::npos) throw std::invalid_argument("--trace-steps: expected FIRST:COUNT, got '" + steps + "'");
  s.trace_first = std::stoll(steps.substr(0, colon));
  s.trace_count = std::stoll(steps.substr(colon + 1));
  s.out = o.str("out");
  s.log = o.choice("log", {"auto", "plain", "quiet"});
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
    settings = read_settings(Options(argc, argv));
  } catch (const Options::HelpRequested&) {
    std::printf("%s", usage().c_str());
    return 0;
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
