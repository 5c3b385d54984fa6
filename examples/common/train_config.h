// The settings of examples/train_gpt as a plain struct, the one table of keys that
// its command-line flags and its JSON config file share, and the config loader.
//
//   TrainConfig c = load_train_config("examples/configs/small.json");  // defaults + file
//   std::optional<TrainConfig> s = parse_train_args(argc, argv);          // + --config + flags
//
// A config file is a JSON object whose keys are the flags' names without the dashes
// ({"steps": 100, "lr": 0.002, "precision": "bf16"}). Every error is one line that
// names the file: a key that is not in the table, a value of the wrong type or
// outside the key's choices, JSON that does not parse (with line and column), a file
// that cannot be read; all std::invalid_argument.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dtensor::tools {

struct TrainConfig {
  std::string mesh = "dp=2";
  std::string plan = "none";  // auto: choose the layout for --mesh's ranks (dtensor/parallel/plan.h)
  std::string profile;        // a dtensor-plan --calibrate file (--plan auto without one: measure now)
  std::string schedule;       // with pp; empty: 1f1b
  int64_t microbatches = 0;
  int64_t virtual_stages = 1;
  std::string timeline;
  bool sequence_parallel = false;
  bool gather_logits = false;
  std::string backend = "threads";
  std::string device = "auto";
  int64_t steps = 200;
  int64_t batch = 16;
  int64_t seq_len = 32;
  int64_t layers = 2;
  int64_t dim = 64;
  int64_t heads = 4;
  int64_t mlp_hidden = 0;
  std::string activation = "gelu";
  std::string norm = "layernorm";
  double dropout = 0;
  bool tie_weights = true;
  int64_t vocab = 32;
  std::string data;
  double lr = 0.003;
  double min_lr = 0.0003;
  int64_t warmup = 20;
  double weight_decay = 0.01;
  double clip = 1.0;
  std::string precision = "fp32";
  int64_t grad_accum = 1;
  bool checkpoint_activations = false;
  int64_t moe_experts = 0;
  int64_t moe_top_k = 2;
  double moe_capacity = 0;
  bool moe_shared_expert = false;
  double bucket_mb = 25;
  int64_t fsdp = 0;
  bool hsdp = false;
  bool offload = false;
  double offload_fraction = 1.0;
  int64_t delayed_update = -1;
  std::string fsdp_unit = "block";
  int64_t fsdp_prefetch = 1;
  bool fsdp_reshard_after_forward = true;
  int64_t seed = 1234;
  std::string trace;
  std::string trace_steps = "2:2";
  std::string save;
  std::string save_dir;
  int64_t save_every = 0;
  int64_t keep = 0;
  bool async_save = false;
  std::string resume;
  std::string export_path;
  std::string init_from;
  std::string out = "train_gpt_loss.csv";
  std::string log = "auto";
};

// One key: its name (the flag is --name), the member it sets, its help text and,
// for a string, the values it may take (empty: any).
struct TrainKey {
  using Member =
      std::variant<std::string TrainConfig::*, int64_t TrainConfig::*, double TrainConfig::*, bool TrainConfig::*>;
  const char* name;
  Member member;
  const char* help;
  std::vector<std::string> choices = {};
};

// Every key, in --help order.
const std::vector<TrainKey>& train_keys();

// The JSON text `text` (named `source` in errors) applied over `base`.
TrainConfig parse_train_config(std::string_view text, const std::string& source, TrainConfig base = {});
// The JSON file at `path` applied over `base` (the defaults unless given).
TrainConfig load_train_config(const std::string& path, TrainConfig base = {});

// train_gpt's command line (CLI11): the defaults, then the file named by --config,
// then the flags given, which win. Each key of the table is a flag --name (booleans
// take no value); --help prints the table with types and defaults and gives
// nullopt. A flag that is not in the table, a value of the wrong type or outside
// its choices, and every config file error throw std::invalid_argument (one line).
std::optional<TrainConfig> parse_train_args(int argc, const char* const* argv);

}  // namespace dtensor::tools
