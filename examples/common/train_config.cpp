#include "train_config.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "cli.h"

namespace dtensor::tools {

using Json = nlohmann::json;

const std::vector<TrainKey>& train_keys() {
  using C = TrainConfig;
  static const std::vector<TrainKey> keys = {
      {"mesh", &C::mesh,
       "parallel layout: dp=2, tp=2, dp=2,tp=2, replicate=2,dp=2, pp=4,dp=2,tp=2, ... (the product is the number "
       "of ranks)"},
      {"plan",
       &C::plan,
       "auto: the fastest layout the estimator finds for --mesh's number of ranks (dp, tp, pp, ZeRO stage, "
       "micro-batches, schedule, recomputation, sequence parallelism) replaces those flags",
       {"none", "auto"}},
      {"profile", &C::profile,
       "this machine's rates from dtensor-plan --calibrate: --plan auto ranks on them (empty: a short calibration "
       "now), and the summary sets the run's estimated step time beside the measured one"},
      {"schedule", &C::schedule, "with pp: gpipe, 1f1b, interleaved or zero-bubble (empty: 1f1b)"},
      {"microbatches", &C::microbatches,
       "with pp: micro-batches per step (0: 2 x pp; interleaved needs a multiple of pp)"},
      {"virtual-stages", &C::virtual_stages, "with --schedule interleaved: stages per pp rank (pp x this <= --layers)"},
      {"timeline", &C::timeline,
       "with pp: write the last step's measured schedule as this SVG (and a Chrome trace beside it)"},
      {"sequence-parallel", &C::sequence_parallel,
       "with tp: norms and dropout on sequence shards (Megatron sequence parallelism)"},
      {"gather-logits", &C::gather_logits,
       "with tp: all-gather the logits before the loss instead of the vocab-parallel loss"},
      {"backend",
       &C::backend,
       "threads (ranks are threads of this process), mpi (run under mpirun) or nccl (one GPU per rank: one "
       "process under mpirun, else a thread per GPU)",
       {"threads", "mpi", "nccl"}},
      {"device", &C::device,
       "where ranks compute: cpu, cuda (with nccl each rank its own GPU; with threads every rank on cuda:0) or "
       "cuda:N (threads: every rank on GPU N); auto: cuda with --backend nccl, else cpu"},
      {"steps", &C::steps, "optimizer steps"},
      {"batch", &C::batch, "global batch in sequences (split over dp, then over grad-accum)"},
      {"seq-len", &C::seq_len, "tokens per sequence"},
      {"layers", &C::layers, "transformer blocks"},
      {"dim", &C::dim, "model width"},
      {"heads", &C::heads, "attention heads"},
      {"mlp-hidden", &C::mlp_hidden, "MLP width (0: 4 x dim)"},
      {"activation", &C::activation, "MLP activation", {"gelu", "swiglu"}},
      {"norm", &C::norm, "normalisation layers", {"layernorm", "rmsnorm"}},
      {"dropout", &C::dropout, "dropout probability"},
      {"tie-weights", &C::tie_weights, "the LM head shares the token embedding (--tie-weights false: its own weight)"},
      {"vocab", &C::vocab, "vocabulary of the built-in synthetic task"},
      {"data", &C::data, "train on the characters of this text file instead of the synthetic task"},
      {"lr", &C::lr, "peak learning rate (AdamW)"},
      {"min-lr", &C::min_lr, "learning rate at the end of the cosine decay"},
      {"warmup", &C::warmup, "linear warmup steps"},
      {"weight-decay", &C::weight_decay, "AdamW decoupled weight decay"},
      {"clip", &C::clip, "gradient clipping by global norm (0: off)"},
      {"precision",
       &C::precision,
       "16-bit compute with FP32 master weights (fp16 scales the loss), or fp32",
       {"fp32", "bf16", "fp16"}},
      {"grad-accum", &C::grad_accum, "micro-batches per step"},
      {"checkpoint-activations", &C::checkpoint_activations, "recompute each block's activations in backward"},
      {"moe-experts", &C::moe_experts, "mixture of experts: every block's MLP is this many experts (0: dense)"},
      {"moe-top-k", &C::moe_top_k, "with --moe-experts: experts per token"},
      {"moe-capacity", &C::moe_capacity,
       "with --moe-experts: capacity factor (assignments an expert takes: this x tokens x k / experts; 0: dropless)"},
      {"moe-shared-expert", &C::moe_shared_expert,
       "with --moe-experts: a shared expert besides, an MLP every token goes through (DeepSeek-MoE)"},
      {"bucket-mb", &C::bucket_mb, "DDP gradient bucket size in MiB"},
      {"fsdp", &C::fsdp, "0: DDP on dp; 1, 2, 3: FSDP with that ZeRO stage, sharded over the mesh dim dp"},
      {"hsdp", &C::hsdp, "hybrid sharding: FSDP within dp, replicas across the mesh dim 'replicate'"},
      {"offload", &C::offload,
       "with --fsdp 2|3: ZeRO-Offload, the master weights, gradients and optimizer state on the host (cpu:1 "
       "without a GPU)"},
      {"offload-fraction", &C::offload_fraction,
       "with --offload: the share of the parameters offloaded, whole blocks from the first (Megatron's "
       "offload fraction); the rest stays on the device"},
      {"delayed-update", &C::delayed_update,
       "with --offload: after this many warm-up steps, each step's host optimizer step runs beside the next step's "
       "forward and backward, one step stale (DeepSpeed's delayed parameter update; -1: off)"},
      {"fsdp-unit",
       &C::fsdp_unit,
       "with --fsdp: each block one FSDP unit, or each block's attention and feed-forward its own (a smaller gathered "
       "working set, twice the collectives)",
       {"block", "layer"}},
      {"fsdp-prefetch", &C::fsdp_prefetch,
       "with --fsdp: units whose all-gather runs ahead of their use (0: none, the smallest working set)"},
      {"fsdp-reshard-after-forward", &C::fsdp_reshard_after_forward,
       "with --fsdp 3: free each block's gathered parameters after its forward and gather them again for backward "
       "(false: keep them until backward, no second all-gather)"},
      {"seed", &C::seed, "seed of the model, the data order and dropout"},
      {"trace", &C::trace, "write a Chrome trace (Perfetto) of the traced steps to this file"},
      {"trace-steps", &C::trace_steps, "FIRST:COUNT of the steps to trace"},
      {"save", &C::save, "write the trained parameters to this file (read by examples/generate)"},
      {"save-dir", &C::save_dir,
       "write checkpoints of the whole training state under this directory (step-00000006, ...; see --save-every)"},
      {"save-every", &C::save_every, "with --save-dir: a checkpoint every N steps (0: only after the last step)"},
      {"keep", &C::keep, "with --save-dir: keep only the newest N checkpoints (0: all)"},
      {"async-save", &C::async_save,
       "with --save-dir: a step waits only while the state is copied to host memory; a thread writes it"},
      {"resume", &C::resume,
       "continue from the newest checkpoint under this directory (or from this checkpoint directory), on any --mesh; "
       "starts from step 1 when there is none yet"},
      {"init-from", &C::init_from,
       "start from the parameters in this safetensors file (the model's names; written by --export, PyTorch, ...), "
       "on any --mesh; ignored when --resume finds a checkpoint"},
      {"export", &C::export_path,
       "write the trained parameters as one safetensors file (the model's names; any safetensors reader opens it)"},
      {"out", &C::out, "loss curve CSV (an SVG chart is written beside it)"},
      {"log", &C::log, "auto (redraw on a terminal), plain (a line per step) or quiet", {"auto", "plain", "quiet"}},
  };
  return keys;
}

namespace {

const TrainKey* find_key(std::string_view name) {
  for (const TrainKey& key : train_keys()) {
    if (name == key.name) return &key;
  }
  return nullptr;
}

// A value as it appears in the file, shortened for a message.
std::string shown(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

const char* kind_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "a number";
  }
}

// Line and column (1-based) of byte `offset` of `text`.
std::pair<size_t, size_t> line_column(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

class KeyError {
 public:
  KeyError(const std::string& source, const char* key) : prefix_("[config] " + source + ": key \"" + key + "\": ") {}
  [[noreturn]] void expected(const std::string& what, const Json& got) const {
    throw std::invalid_argument(prefix_ + "expected " + what + ", got " + shown(got));
  }

 private:
  std::string prefix_;
};

void set_value(const TrainKey& key, const Json& value, const std::string& source, TrainConfig& config) {
  const KeyError error(source, key.name);
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(config.*member)>;
        T& field = config.*member;
        if constexpr (std::is_same_v<T, std::string>) {
          if (!value.is_string()) error.expected("a string", value);
          field = value.get<std::string>();
          if (!key.choices.empty() && std::find(key.choices.begin(), key.choices.end(), field) == key.choices.end()) {
            std::string list;
            for (const std::string& c : key.choices) list += (list.empty() ? "" : ", ") + c;
            error.expected("one of " + list, value);
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!value.is_boolean()) error.expected("true or false", value);
          field = value.get<bool>();
        } else if constexpr (std::is_same_v<T, int64_t>) {
          if (value.is_number_unsigned()) {
            if (value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) error.expected("a 64-bit integer", value);
            field = static_cast<int64_t>(value.get<uint64_t>());
          } else if (value.is_number_integer()) {
            field = value.get<int64_t>();
          } else if (value.is_number_float()) {
            // 1e3 is an integer written with an exponent.
            const double x = value.get<double>();
            if (!(std::trunc(x) == x && std::fabs(x) < 9.2e18)) error.expected("an integer", value);
            field = static_cast<int64_t>(x);
          } else {
            error.expected("an integer", value);
          }
        } else {
          if (!value.is_number()) error.expected("a number", value);
          field = value.get<double>();
        }
      },
      key.member);
}

// --name for every key, bound to the members of `config` (whose values are the
// defaults --help shows); strings with choices are checked.
void add_train_flags(CLI::App& app, TrainConfig& config) {
  for (const TrainKey& key : train_keys()) {
    const std::string flag = std::string("--") + key.name;
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(config.*member)>;
          if constexpr (std::is_same_v<T, bool>) {
            // A switch that is off by default is a flag (--hsdp); one that is on
            // takes a value (--tie-weights false). Both accept --name=true|false.
            if (config.*member) {
              app.add_option(flag, config.*member, key.help)->capture_default_str();
            } else {
              app.add_flag(flag, config.*member, key.help);
            }
          } else {
            CLI::Option* option = app.add_option(flag, config.*member, key.help)->capture_default_str();
            if constexpr (std::is_same_v<T, std::string>) {
              if (!key.choices.empty()) option->check(CLI::IsMember(key.choices));
            }
          }
        },
        key.member);
  }
}

// Copies into `to` the keys given on `app`'s command line, from `from` (the struct
// add_train_flags bound).
void apply_given_flags(const CLI::App& app, const TrainConfig& from, TrainConfig& to) {
  for (const TrainKey& key : train_keys()) {
    if (app.get_option(std::string("--") + key.name)->count() == 0) continue;
    std::visit([&](auto member) { to.*member = from.*member; }, key.member);
  }
}

}  // namespace

TrainConfig parse_train_config(std::string_view text, const std::string& source, TrainConfig base) {
  // Duplicate top-level keys are an error (JSON leaves them undefined; nlohmann keeps the last).
  std::set<std::string> seen;
  const auto no_duplicates = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second) {
      throw std::invalid_argument("[config] " + source + ": key \"" + parsed.get<std::string>() + "\" given twice");
    }
    return true;
  };
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end(), no_duplicates);
  } catch (const Json::parse_error& e) {
    // what() is "[json.exception.parse_error.101] parse error at line 3, column 7: <detail>".
    const std::string what = e.what();
    const size_t at = what.find(": ", what.find("parse error"));
    // e.byte counts the characters read: the position is that of the last one, the
    // end of the token that did not fit.
    const auto [line, column] = line_column(text, e.byte == 0 ? 0 : e.byte - 1);
    throw std::invalid_argument("[config] " + source + ":" + std::to_string(line) + ":" + std::to_string(column) +
                                ": " + (at == std::string::npos ? what : what.substr(at + 2)));
  } catch (const Json::exception& e) {
    // A number beyond a double's range ("[json.exception.out_of_range.406] number
    // overflow parsing '5e1103'"): nlohmann gives no position, the text names the number.
    const std::string what = e.what();
    const size_t close = what.find("] ");
    throw std::invalid_argument("[config] " + source + ": " +
                                (close == std::string::npos ? what : what.substr(close + 2)) +
                                " (a JSON number must fit a double)");
  }
  if (!doc.is_object()) {
    throw std::invalid_argument("[config] " + source + ": expected a JSON object of keys, got " + kind_name(doc));
  }
  for (const auto& [name, value] : doc.items()) {
    const TrainKey* key = find_key(name);
    if (!key)
      throw std::invalid_argument("[config] " + source + ": unknown key \"" + name +
                                  "\" (train_gpt --help lists the keys)");
    set_value(*key, value, source, base);
  }
  return base;
}

TrainConfig load_train_config(const std::string& path, TrainConfig base) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("[config] cannot read config file \"" + path + "\"");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::invalid_argument("[config] cannot read config file \"" + path + "\"");
  return parse_train_config(text.str(), path, std::move(base));
}

std::optional<TrainConfig> parse_train_args(int argc, const char* const* argv) {
  TrainConfig flags;
  std::string config_path;
  CLI::App app("GPT training on dtensor: data parallel (DDP, FSDP, HSDP), tensor parallel and pipeline parallel.",
               "train_gpt");
  app.add_option("--config", config_path, "JSON file with any of the keys below (without the dashes); flags win");
  add_train_flags(app, flags);
  app.allow_extras();                                             // reported below, by name and in order
  if (!parse_command_line(app, argc, argv)) return std::nullopt;  // --help
  const std::vector<std::string> extras = app.remaining();
  for (const std::string& arg : extras) {
    if (arg.rfind("-", 0) == 0) {
      throw std::invalid_argument("unknown flag " + arg.substr(0, arg.find('=')) + " (see --help)");
    }
  }
  if (!extras.empty()) {
    throw std::invalid_argument("unexpected argument '" + extras.front() + "' (flags start with --; see --help)");
  }
  if (config_path.empty()) return flags;
  TrainConfig config = load_train_config(config_path);
  apply_given_flags(app, flags, config);
  return config;
}

}  // namespace dtensor::tools
