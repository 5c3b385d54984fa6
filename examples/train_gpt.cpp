// GPT training, data, tensor and pipeline parallel: the same model code on one rank or many.
//
//   ./build/examples/train_gpt --mesh dp=2 --steps 200
//   ./build/examples/train_gpt --mesh pp=4,dp=2,tp=2 --schedule 1f1b --microbatches 8   # 3-D, 16 ranks
//   ./build/examples/train_gpt --mesh pp=2 --schedule interleaved --virtual-stages 2 --layers 4
//   ./build/examples/train_gpt --config examples/configs/small.json --precision bf16
//   ./build/examples/train_gpt --mesh dp=4 --fsdp 3              # ZeRO-3 (FSDP)
//   ./build/examples/train_gpt --mesh dp=2,tp=2 --fsdp 3         # FSDP over tensor parallel
//   ./build/examples/train_gpt --mesh replicate=2,dp=2 --fsdp 3 --hsdp
//   ./build/examples/train_gpt --mesh dp=2 --fsdp 3 --offload     # ZeRO-Offload
//   ./build/examples/train_gpt --mesh dp=2 --fsdp 3 --offload --delayed-update 40   # ... one step stale
//   mpirun -np 2 ./build/examples/train_gpt --backend mpi --mesh dp=2
//   mpirun -np 8 ./build/examples/train_gpt --backend nccl --mesh dp=2,tp=4   # a process per GPU
//   ./build/examples/train_gpt --backend nccl --mesh dp=4 --fsdp 3            # a thread per GPU
//   ./build/examples/train_gpt --device cuda --mesh dp=2     # two ranks (threads) sharing cuda:0
//   ./build/examples/train_gpt --mesh pp=2 --save gpt.dtstate && ./build/examples/generate --load gpt.dtstate
//   ./build/examples/train_gpt --mesh dp=2 --steps 12 --save-dir ckpt --save-every 6
//   ./build/examples/train_gpt --mesh dp=4 --steps 12 --resume ckpt      # steps 7-12, on another mesh
//
// Every flag can also come from a JSON file (--config) with the same keys; flags
// given on the command line win. Run with --help for the list. The keys, their
// types, defaults and help are one table, examples/common/train_config.cpp.
#include <dtensor/dtensor.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "dtensor/parallel/machine_profile.h"
#include "dtensor/parallel/plan.h"
#include "train_config.h"  // the keys of the flags and the config file (examples/common)
#include "train_log.h"

using namespace dtensor;
using dtensor::tools::TrainConfig;
using dtensor::tools::TrainLog;

namespace {

// The mesh flag: "dp=2", "tp=2", "dp=2,tp=2", "replicate=2,dp=2" (HSDP), "dp=2,cp=2"
// (context parallel: the sequence sharded), "dp=2,ep=2" (expert parallel, with
// --moe-experts), "pp=4,dp=2,tp=2" (stages on pp, each on its own dp x cp x tp sub-mesh).
MeshSpec parse_mesh(const std::string& text) {
  MeshSpec mesh;
  try {
    mesh = parse_mesh_spec(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--mesh: ") + e.what());
  }
  for (const std::string& name : mesh.names) {
    if (name != "pp" && name != "dp" && name != "cp" && name != "ep" && name != "tp" && name != "replicate") {
      throw std::invalid_argument(
          "--mesh: dims are pp (pipeline stages), dp (data parallel), cp (context parallel), ep (expert parallel), tp "
          "(tensor parallel) and replicate (HSDP replica groups), got '" +
          name + "'");
    }
  }
  return mesh;
}

struct Settings {
  MeshSpec mesh;
  int64_t dp = 1, tp = 1, steps = 0, batch = 0, grad_accum = 1;  // dp: data-parallel ranks (dp x replicate x ep)
  int64_t pp = 1;                              // pipeline ranks; with a pp dim the micro-batches come from the schedule
  std::optional<parallel::Schedule> schedule;  // with a pp dim
  std::string timeline, save;
  std::string save_dir, resume;  // checkpoints of the whole training state
  std::string export_path;       // the parameters as one safetensors file
  std::string init_from;         // ... and the file to start from
  int64_t save_every = 0, keep = 0;
  bool async_save = false;
  int64_t fsdp = 0;
  bool hsdp = false, offload = false;
  double offload_fraction = 1.0;
  int64_t delayed_update = -1;  // warm-up steps; -1: off
  models::GPTParallelOptions::FSDPUnit fsdp_unit = models::GPTParallelOptions::FSDPUnit::Block;
  int64_t fsdp_prefetch = 1;
  std::optional<bool> fsdp_reshard_after_forward;
  bool sequence_parallel = false, loss_parallel = true;
  std::string backend, precision, data, trace, out, log;
  // --device: the CPU, or a GPU (cuda_index: every rank's on threads; -1: each rank
  // its own, Group::device() of nccl, or cuda:0 on threads).
  bool cuda = false;
  int cuda_index = -1;
  std::string profile;  // dtensor-plan --calibrate's file: the step time is estimated on its rates
  int64_t trace_first = 0, trace_count = 0;
  models::GPTConfig model;
  double lr = 0, min_lr = 0, weight_decay = 0, clip = 0, bucket_mb = 25;
  int64_t warmup = 0, vocab = 0;
  uint64_t seed = 0;
};

// --schedule, --microbatches and --virtual-stages against the mesh and the model: the
// schedule is built (and checked) here, so a bad combination fails before any rank
// starts. With a pp dim the micro-batches play grad-accum's part.
void read_pipeline_settings(const TrainConfig& o, Settings& s) {
  const std::string schedule = o.schedule;
  const int64_t micro_batches = o.microbatches, virtual_stages = o.virtual_stages;
  const std::string timeline = o.timeline;
  const bool has_pp = std::count(s.mesh.names.begin(), s.mesh.names.end(), "pp") > 0;
  if (!has_pp) {
    const char* asked = !schedule.empty()     ? "--schedule"
                        : micro_batches != 0  ? "--microbatches"
                        : virtual_stages != 1 ? "--virtual-stages"
                        : !timeline.empty()   ? "--timeline"
                                              : nullptr;
    if (asked) {
      throw std::invalid_argument(std::string(asked) + " is for pipeline parallelism: --mesh " + s.mesh.to_string() +
                                  " has no 'pp' dim (e.g. --mesh pp=2 or pp=4,dp=2,tp=2)");
    }
    return;
  }
  s.pp = s.mesh.size("pp");
  parallel::ScheduleKind kind = parallel::ScheduleKind::OneFOneB;
  try {
    if (!schedule.empty()) kind = parallel::parse_schedule_kind(schedule);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--schedule: ") + e.what());
  }
  if (kind == parallel::ScheduleKind::ForwardOnly) {
    throw std::invalid_argument("--schedule forward-only has no backward to train with (examples/generate uses it)");
  }
  if (virtual_stages < 1 || (virtual_stages > 1 && kind != parallel::ScheduleKind::Interleaved1F1B)) {
    throw std::invalid_argument("--virtual-stages " + std::to_string(virtual_stages) +
                                ": more than 1 stage per rank needs --schedule interleaved (and at least 1)");
  }
  if (s.grad_accum != 1) {
    throw std::invalid_argument("--grad-accum " + std::to_string(s.grad_accum) +
                                " with a pp dim: the pipeline's micro-batches accumulate, use --microbatches");
  }
  const int64_t stages = s.pp * virtual_stages;
  if (stages > s.model.layers) {
    throw std::invalid_argument("--mesh pp=" + std::to_string(s.pp) +
                                (virtual_stages > 1 ? " x --virtual-stages " + std::to_string(virtual_stages) : "") +
                                " makes " + std::to_string(stages) +
                                " stages of at least one block each, --layers is " + std::to_string(s.model.layers));
  }
  const int64_t m = micro_batches == 0 ? 2 * s.pp : micro_batches;
  if (m < 1) throw std::invalid_argument("--microbatches: expected at least 1, got " + std::to_string(m));
  try {
    s.schedule =
        parallel::make_schedule(kind, static_cast<int>(s.pp), static_cast<int>(m), static_cast<int>(virtual_stages));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("--schedule " + std::string(parallel::schedule_kind_name(kind)) + " --microbatches " +
                                std::to_string(m) + ": " + e.what());
  }
  s.grad_accum = m;  // the batch splits over dp, then over the micro-batches
  s.timeline = timeline;
}

// --device against --backend: GPU tensors travel on threads (in this process) and
// nccl; MPI moves host memory here. The GPU itself is checked when ranks start.
void read_device(const TrainConfig& o, Settings& s) {
  const std::string& d = o.device;
  const bool nccl = o.backend == "nccl";
  if (d == "auto" || d == "cpu") {
    s.cuda = d == "auto" && nccl;
  } else if (d == "cuda") {
    s.cuda = true;
  } else if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos &&
             d.size() < 10) {
    s.cuda = true;
    s.cuda_index = std::stoi(d.substr(5));
  } else {
    throw std::invalid_argument("--device: expected auto, cpu, cuda or cuda:N, got '" + d + "'");
  }
  if (nccl && !s.cuda) {
    throw std::invalid_argument(
        "--device cpu with --backend nccl: nccl communicates between GPUs (--device cuda), "
        "threads and mpi on the CPU");
  }
  if (nccl && s.cuda_index >= 0) {
    throw std::invalid_argument("--device " + d +
                                " with --backend nccl: each rank computes on its own GPU, the one "
                                "nccl takes for it; give --device cuda");
  }
  if (s.cuda && o.backend == "mpi") {
    throw std::invalid_argument("--device " + d +
                                " with --backend mpi: the mpi backend moves host memory; train on "
                                "GPUs across processes with --backend nccl under mpirun");
  }
  if (s.cuda && o.plan == "auto") {
    throw std::invalid_argument(
        "--plan auto chooses on this machine's CPU rates; give the layout flags with --device " + d);
  }
}

Settings read_settings(const TrainConfig& o) {
  Settings s;
  s.mesh = parse_mesh(o.mesh);
  s.dp = s.mesh.size("dp") * s.mesh.size("replicate") * s.mesh.size("ep");  // the batch splits over ep too
  s.tp = s.mesh.size("tp");
  const auto has = [&](const char* name) { return std::count(s.mesh.names.begin(), s.mesh.names.end(), name) > 0; };
  s.fsdp = o.fsdp;
  s.hsdp = o.hsdp;
  s.offload = o.offload;
  s.offload_fraction = o.offload_fraction;
  if (s.offload_fraction < 0 || s.offload_fraction > 1 || (!s.offload && s.offload_fraction != 1)) {
    throw std::invalid_argument("--offload-fraction: expected a value in [0, 1] with --offload, got " +
                                std::to_string(s.offload_fraction) + (s.offload ? "" : " without --offload"));
  }
  s.delayed_update = o.delayed_update;
  if (s.delayed_update < -1 || (s.delayed_update >= 0 && (!s.offload || s.offload_fraction != 1))) {
    throw std::invalid_argument(
        "--delayed-update: expected warm-up steps >= 0 (-1: off) with --offload of every "
        "block (fraction 1), got " +
        std::to_string(s.delayed_update) +
        (s.offload ? " with --offload-fraction " + std::to_string(s.offload_fraction) : " without --offload"));
  }
  if (s.offload && s.fsdp < 2) {
    throw std::invalid_argument("--offload needs --fsdp 2 or 3 (the optimizer steps on the host shards), got --fsdp " +
                                std::to_string(s.fsdp));
  }
  if (s.fsdp < 0 || s.fsdp > 3)
    throw std::invalid_argument("--fsdp: expected 0 (off, DDP), 1, 2 or 3, got " + std::to_string(s.fsdp));
  const bool fsdp_defaults = o.fsdp_unit == "block" && o.fsdp_prefetch == 1 && o.fsdp_reshard_after_forward;
  if (s.fsdp == 0 && !fsdp_defaults) {
    throw std::invalid_argument("--fsdp-unit, --fsdp-prefetch and --fsdp-reshard-after-forward need --fsdp 1|2|3");
  }
  if (o.fsdp_prefetch < 0) {
    throw std::invalid_argument("--fsdp-prefetch: expected 0 or more units, got " + std::to_string(o.fsdp_prefetch));
  }
  if (!o.fsdp_reshard_after_forward && s.fsdp != 3) {
    throw std::invalid_argument(
        "--fsdp-reshard-after-forward false needs --fsdp 3 (stages 1 and 2 keep the gathered "
        "parameters), got --fsdp " +
        std::to_string(s.fsdp));
  }
  if (o.fsdp_unit == "layer") s.fsdp_unit = models::GPTParallelOptions::FSDPUnit::Layer;
  s.fsdp_prefetch = o.fsdp_prefetch;
  if (!o.fsdp_reshard_after_forward) s.fsdp_reshard_after_forward = false;
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
  s.profile = o.profile;
  s.backend = o.backend;
  read_device(o, s);
  s.steps = o.steps;
  s.batch = o.batch;
  s.grad_accum = o.grad_accum;
  if (s.steps < 1) throw std::invalid_argument("--steps: expected at least 1, got " + std::to_string(s.steps));
  if (s.grad_accum < 1)
    throw std::invalid_argument("--grad-accum: expected at least 1, got " + std::to_string(s.grad_accum));
  s.model.layers = o.layers;
  read_pipeline_settings(o, s);
  if (s.batch < 1 || s.batch % (s.dp * s.grad_accum) != 0) {
    throw std::invalid_argument("--batch " + std::to_string(s.batch) + " must be a positive multiple of dp (" +
                                std::to_string(s.dp) + ") x " + (s.schedule ? "micro-batches (" : "grad-accum (") +
                                std::to_string(s.grad_accum) + ")");
  }
  s.model.block_size = o.seq_len;
  s.model.dim = o.dim;
  s.model.heads = o.heads;
  s.model.mlp_hidden = o.mlp_hidden;
  s.model.activation = o.activation == "gelu" ? nn::Activation::Gelu : nn::Activation::SwiGlu;
  s.model.rms_norm = o.norm == "rmsnorm";
  s.model.dropout = o.dropout;
  s.model.tie_weights = o.tie_weights;
  s.model.checkpoint_activations = o.checkpoint_activations;
  s.model.moe_experts = o.moe_experts;
  s.model.moe_top_k = o.moe_top_k;
  s.model.moe_capacity_factor = o.moe_capacity;
  s.model.moe_shared_expert = o.moe_shared_expert;
  if (o.moe_shared_expert && o.moe_experts == 0) {
    throw std::invalid_argument("--moe-shared-expert needs --moe-experts (a shared expert sits beside routed ones)");
  }
  if (o.moe_experts < 0 || (o.moe_experts > 0 && (o.moe_top_k < 1 || o.moe_top_k > o.moe_experts))) {
    throw std::invalid_argument("--moe-experts " + std::to_string(o.moe_experts) + " --moe-top-k " +
                                std::to_string(o.moe_top_k) + ": expected 1 <= top-k <= experts");
  }
  if (has("ep") && (o.moe_experts == 0 || o.moe_experts % s.mesh.size("ep") != 0)) {
    throw std::invalid_argument("--mesh " + o.mesh + ": an 'ep' dim needs --moe-experts, a multiple of ep, got " +
                                std::to_string(o.moe_experts));
  }
  if (has("cp") && o.sequence_parallel) {
    throw std::invalid_argument("--mesh " + o.mesh +
                                ": context parallelism (cp) and --sequence-parallel both shard the sequence; "
                                "drop one");
  }
  if (has("cp") && o.seq_len % (2 * s.mesh.size("cp")) != 0) {
    throw std::invalid_argument("--seq-len " + std::to_string(o.seq_len) + " with --mesh " + o.mesh +
                                ": the load-balanced context-parallel order cuts the sequence into 2 x cp = " +
                                std::to_string(2 * s.mesh.size("cp")) + " equal chunks");
  }
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
  if (colon == std::string::npos)
    throw std::invalid_argument("--trace-steps: expected FIRST:COUNT, got '" + steps + "'");
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
  s.save = o.save;
  s.save_dir = o.save_dir;
  s.save_every = o.save_every;
  s.keep = o.keep;
  s.async_save = o.async_save;
  s.resume = o.resume;
  s.export_path = o.export_path;
  s.init_from = o.init_from;
  if (s.save_every < 0 || s.keep < 0) {
    throw std::invalid_argument("--save-every and --keep: expected 0 or more, got " + std::to_string(s.save_every) +
                                " and " + std::to_string(s.keep));
  }
  if (s.save_dir.empty() && (s.save_every > 0 || s.keep > 0 || s.async_save)) {
    throw std::invalid_argument("--save-every, --keep and --async-save are for checkpoints: give --save-dir");
  }
  s.log = o.log;
  return s;
}

std::unique_ptr<TokenDataset> make_dataset(const Settings& s) {
  if (!s.data.empty()) return std::make_unique<CharDataset>(CharDataset::from_file(s.data, s.model.block_size));
  // Enough sequences that an epoch spans many steps.
  const int64_t sequences = std::max<int64_t>(s.batch * 64, 1024);
  return std::make_unique<SyntheticLanguage>(s.vocab, s.model.block_size, sequences, s.seed);
}

// What to write beside the parameters so that examples/generate can rebuild the model
// and read its tokens.
std::map<std::string, std::string> model_metadata(const models::GPTConfig& config, const Settings& s,
                                                  const TokenDataset& data) {
  std::map<std::string, std::string> m{
      {"model", "gpt"},
      {"vocab", std::to_string(config.vocab)},
      {"block_size", std::to_string(config.block_size)},
      {"layers", std::to_string(config.layers)},
      {"heads", std::to_string(config.heads)},
      {"dim", std::to_string(config.dim)},
      {"mlp_hidden", std::to_string(config.mlp_hidden)},
      {"activation", config.activation == nn::Activation::Gelu ? "gelu" : "swiglu"},
      {"norm", config.rms_norm ? "rmsnorm" : "layernorm"},
      {"bias", config.bias ? "true" : "false"},
      {"tie_weights", config.tie_weights ? "true" : "false"},
      {"trained_on", s.mesh.to_string()},
      {"steps", std::to_string(s.steps)},
  };
  if (config.moe_experts > 0) {
    m["moe_experts"] = std::to_string(config.moe_experts);
    m["moe_top_k"] = std::to_string(config.moe_top_k);
    m["moe_hidden"] = std::to_string(config.moe_hidden);
    m["moe_capacity_factor"] = std::to_string(config.moe_capacity_factor);
    m["moe_shared_expert"] = config.moe_shared_expert ? "true" : "false";
  }
  if (const auto* chars = dynamic_cast<const CharDataset*>(&data)) {
    m["data"] = "chars";
    m["vocabulary"] = chars->vocabulary();
  } else {
    m["data"] = "synthetic";
    m["data_seed"] = std::to_string(s.seed);
  }
  return m;
}

// Every stage's parameters in one map on the pp group's first rank (the stages'
// state_dict is collective over each stage mesh; each stage mesh's first rank sends
// its map as the bytes of a state file).
std::map<std::string, Tensor> gather_pipeline_state(const models::GPTPipeline& gpt) {
  const parallel::PipelineMesh& pm = gpt.mesh();
  std::map<std::string, Tensor> state = gpt.state_dict();
  if (pm.stage_mesh().linear_index() != 0) return {};
  const std::string bytes = nn::serialize_state(state);
  // As I64 words (the collectives move tensors), the length first.
  std::vector<int64_t> words(1 + (bytes.size() + 7) / 8, 0);
  words[0] = static_cast<int64_t>(bytes.size());
  std::memcpy(words.data() + 1, bytes.data(), bytes.size());
  const std::vector<Tensor> all = all_gather_list(pm.group(), Tensor::from_vector(words));
  if (pm.coordinate() != 0) return {};
  std::map<std::string, Tensor> merged;
  for (size_t r = 0; r < all.size(); ++r) {
    const std::vector<int64_t> w = all[r].to_vector<int64_t>();
    std::string theirs(static_cast<size_t>(w[0]), '\0');
    std::memcpy(theirs.data(), w.data() + 1, theirs.size());
    for (auto& [name, t] : nn::deserialize_state(theirs, "pipeline rank " + std::to_string(r)).tensors) {
      merged.emplace(name, std::move(t));  // a tied copy is equal to the first
    }
  }
  return merged;
}

// The checkpoint --resume names: a checkpoint directory itself, or the newest under a
// root of them; empty when there is none yet (a first run, or a restart loop's first try).
std::string checkpoint_to_resume(const std::string& resume) {
  if (resume.empty()) return "";
  if (std::ifstream(resume + "/manifest.json").good()) return resume;
  const checkpoint::CheckpointDir series(resume);
  const std::optional<int64_t> latest = series.latest();
  return latest ? series.path_of(*latest) : "";
}

// Every parameter of the modules once by name (the tied head's copy on a last pipeline
// stage has the embedding's name); a name met again on this rank (a tied copy on a
// rank holding both stages) is returned in `copies`.
checkpoint::StateDict named_parameters(const std::vector<nn::Module*>& modules,
                                       std::vector<std::pair<std::string, DistTensor>>* copies = nullptr) {
  checkpoint::StateDict parameters;
  for (nn::Module* m : modules) {
    for (const auto& [name, p] : m->named_parameters()) {
      if (!parameters.emplace(name, p).second && copies) copies->emplace_back(name, p);
    }
  }
  return parameters;
}

// --init-from: the parameters from a safetensors file, each rank reading its pieces.
void init_from_file(const std::string& path, const std::vector<nn::Module*>& modules, const Group& world) {
  std::vector<std::pair<std::string, DistTensor>> copies;
  checkpoint::StateDict parameters = named_parameters(modules, &copies);
  checkpoint::import_safetensors(path, parameters, world);
  for (const auto& [name, copy] : copies) {
    Tensor(copy.to_local()).copy_(std::get<DistTensor>(parameters.at(name)).to_local());
  }
  for (nn::Module* m : modules) m->notify_state_loaded();  // FSDP refreshes its gathered copies
}

// The estimator's view of this run (dtensor/parallel/plan.h): its configuration as a
// ParallelPlan and the estimate on this machine's preset, or (in `not_modelled`) what
// the estimator does not describe.
struct RunEstimate {
  std::optional<parallel::PlanEstimate> estimate;
  std::string not_modelled;
};

RunEstimate estimate_run(const Settings& s, const models::GPTConfig& config) {
  RunEstimate out;
  const std::pair<bool, const char*> unmodelled[] = {
      // The CPU's GEMMs run FP16 by converting their operands to FP32 (BF16 natively
      // where the CPU has AVX512-BF16 or AMX), a transient the estimate does not hold.
      {s.precision == "fp16" && !s.cuda, "FP16 on the CPU"},
  };
  for (const auto& [on, what] : unmodelled) {
    if (on) out.not_modelled += std::string(out.not_modelled.empty() ? "" : ", ") + what;
  }
  if (!out.not_modelled.empty()) return out;
  const int64_t seq = s.model.block_size;
  const parallel::ModelSpec model = models::gpt_model_spec(config, seq);
  parallel::ParallelPlan plan;
  plan.dp = s.dp;
  plan.tp = s.tp;
  plan.pp = s.pp;
  plan.cp = s.mesh.size("cp");
  plan.ep = s.mesh.size("ep");
  plan.zero = static_cast<int>(s.fsdp);
  plan.zero_shard = s.hsdp ? s.mesh.size("dp") : 0;  // the replicas all-reduce their shards
  plan.offload = s.offload;
  plan.offload_fraction = s.offload_fraction;
  plan.delayed_update = s.delayed_update >= 0;
  plan.micro_batches = s.schedule ? s.schedule->micro_batches : s.grad_accum;
  plan.micro_batch = s.batch / (s.dp * plan.micro_batches);
  if (s.schedule) {
    plan.schedule = s.schedule->kind == parallel::ScheduleKind::GPipe             ? parallel::PlanSchedule::GPipe
                    : s.schedule->kind == parallel::ScheduleKind::Interleaved1F1B ? parallel::PlanSchedule::Interleaved
                    : s.schedule->kind == parallel::ScheduleKind::ZeroBubble      ? parallel::PlanSchedule::ZeroBubble
                                                                                  : parallel::PlanSchedule::OneFOneB;
    plan.virtual_stages = s.schedule->virtual_stages();
  }
  plan.recompute = config.checkpoint_activations ? parallel::Recompute::Full : parallel::Recompute::None;
  plan.sequence_parallel = s.sequence_parallel;
  plan.loss_parallel = s.loss_parallel;
  plan.fsdp_layer_units = s.fsdp_unit == models::GPTParallelOptions::FSDPUnit::Layer;
  plan.fsdp_prefetch = s.fsdp_prefetch;
  plan.reshard_after_forward = s.fsdp_reshard_after_forward.value_or(true);
  const int64_t ranks = shape_numel(s.mesh.shape);
  // Memory does not depend on the machine's rates; the step time does (--profile).
  parallel::ClusterSpec cluster = s.profile.empty() ? parallel::ClusterSpec::preset("cpu", ranks)
                                                    : parallel::MachineProfile::load(s.profile).cluster(ranks);
  if (s.precision != "fp32") cluster.bytes_per_value = 2;  // activations in 16 bits over FP32 parameters
  out.estimate = parallel::estimate_plan(model, cluster, s.batch, plan);
  if (!out.estimate->rejected.empty() && out.estimate->fits) {
    out.not_modelled = out.estimate->rejected;
    out.estimate.reset();
  }
  return out;
}

// "cpu", "cuda:0 (every rank)", "cuda:0 (rank 0; each rank its own GPU)".
std::string device_summary(const Group& world, Device device) {
  if (device.is_cpu()) return device.to_string();
  return device.to_string() + (world.backend() == "nccl" ? " (rank 0; each rank its own GPU)"
                               : world.size() > 1        ? " (every rank)"
                                                         : "");
}

// --device cuda needs a GPU this process sees (checked before ranks start).
void check_gpu(const Settings& s) {
  if (!s.cuda) return;
  if (!cuda_is_available()) {
    throw std::runtime_error(
        "--device cuda: no GPU is visible to this process, or this build has no CUDA "
        "(the configure summary lists cuda when it has)");
  }
  if (s.backend == "nccl" && !is_available("nccl")) {
    throw std::runtime_error(
        "--backend nccl: this build has no NCCL (the configure summary lists nccl among the backends when it has)");
  }
  // mpirun (or a PMI launcher) started this process, but without MPI in the build
  // each process would start a whole job of its own on the same GPUs.
  if (s.backend == "nccl" && !is_available("mpi") &&
      (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK"))) {
    throw std::runtime_error("--backend nccl under mpirun needs a build with MPI (the configure summary lists mpi)");
  }
  const int visible = cuda_device_count();
  if (s.cuda_index >= visible) {
    throw std::invalid_argument("--device cuda:" + std::to_string(s.cuda_index) + ": this process sees " +
                                std::to_string(visible) + " GPU(s), cuda:0 to cuda:" + std::to_string(visible - 1));
  }
}

// The device this rank computes on (--device).
Device rank_device(const Group& world, const Settings& s) {
  if (!s.cuda) return Device::cpu();
  if (world.backend() == "nccl") return world.device();
  return Device::cuda(std::max(s.cuda_index, 0));
}

// One rank's training loop: the model (whole, or this rank's pipeline stages), its
// tensor and data parallelism, AdamW, the log on rank 0.
void train(Group world, const Settings& s, const TokenDataset& data) {
  const Device device = rank_device(world, s);
  DeviceMesh mesh(world, s.mesh.shape, s.mesh.names);
  if (!s.trace.empty()) Tracer::record_steps(s.trace_first, s.trace_count);
  models::GPTConfig config = s.model;
  config.vocab = data.vocab_size();
  const std::optional<DType> compute = s.precision == "bf16"   ? std::optional<DType>(DType::BF16)
                                       : s.precision == "fp16" ? std::optional<DType>(DType::F16)
                                                               : std::nullopt;
  // Tensor parallelism on tp, then DDP or FSDP on dp (over the tensor-parallel
  // layouts: dp shards each tp piece); with pp, this rank's stages on its stage mesh,
  // each wrapped so, run by the schedule.
  const std::unique_ptr<models::ParallelGPT> gpt = models::parallelize_gpt(
      mesh, config, s.seed,
      {.device = device,
       .tp = {.sequence_parallel = s.sequence_parallel, .loss_parallel = s.loss_parallel},
       .fsdp = static_cast<int>(s.fsdp),
       .hsdp = s.hsdp,
       .offload = s.offload,
       .offload_fraction = s.offload_fraction,
       .fsdp_param_dtype = compute,  // 16-bit compute: gather in it, reduce in F32
       .fsdp_unit = s.fsdp_unit,
       .fsdp_prefetch = static_cast<int>(s.fsdp_prefetch),
       .fsdp_reshard_after_forward = s.fsdp_reshard_after_forward,
       .bucket_mb = s.bucket_mb,
       .pipeline = {.schedule = s.schedule ? s.schedule->kind : parallel::ScheduleKind::OneFOneB,
                    .micro_batches = s.schedule ? s.schedule->micro_batches : 1,
                    .virtual_stages = s.schedule ? s.schedule->virtual_stages() : 1}});
  const int64_t num_parameters = gpt->num_parameters();
  DistributedSampler sampler(data.size(), s.batch, gpt->dp_rank(), s.dp, s.seed, true, s.grad_accum);
  std::unique_ptr<parallel::Pipeline> pipe;
  if (gpt->pipeline()) {
    auto tokens = [&](int64_t step, int64_t micro, bool targets) {
      const TokenBatch batch = data.get_batch(sampler.micro_batch_at(step, micro));
      return gpt->batch_from_local(targets ? batch.targets : batch.inputs);
    };
    pipe = gpt->make_pipeline([tokens](int64_t step, int64_t micro) { return tokens(step, micro, false); },
                              [tokens](int64_t step, int64_t micro) { return tokens(step, micro, true); });
  }
  AdamW optimizer(gpt->parameters(), {.lr = s.lr, .weight_decay = s.weight_decay});
  // Short runs (tests, smoke checks) shorten the warmup rather than fail.
  const WarmupCosine schedule(s.lr, std::min(s.warmup, s.steps), s.steps, s.min_lr);
  const bool leader = world.rank() == 0;
  std::unique_ptr<TrainLog> log;
  if (leader && s.log != "quiet") {
    log = std::make_unique<TrainLog>(s.steps, s.log == "plain" ? TrainLog::Mode::Plain : TrainLog::Mode::Auto);
    std::printf("%s\n", cpu::summary().c_str());  // the CPU, its kernels and GEMM engines
    for (const std::string& w : cpu::warnings()) std::printf("warning: %s\n", w.c_str());
    const std::string parallelism = gpt->describe();
    std::printf(
        "GPT %lld parameters (%lld layers, dim %lld, %lld heads, vocab %lld, seq %lld) on %s (%s), %s backend, "
        "%s, %s%s\n",
        static_cast<long long>(num_parameters), static_cast<long long>(config.layers),
        static_cast<long long>(config.dim), static_cast<long long>(config.heads), static_cast<long long>(config.vocab),
        static_cast<long long>(config.block_size), mesh.to_string().c_str(), parallelism.c_str(),
        world.backend().c_str(), device_summary(world, device).c_str(), s.precision.c_str(),
        config.checkpoint_activations ? ", activation checkpointing" : "");
  }
  // A pipeline accumulates its own micro-batches and synchronises each stage.
  parallel::TrainerOptions training{.grad_accum = pipe ? 1 : s.grad_accum,
                                    .clip_grad_norm = s.clip,
                                    .compute_dtype = s.fsdp > 0 ? std::nullopt : compute,
                                    .schedule = &schedule,
                                    .sync = gpt->sync(),
                                    .tokens_per_step = s.batch * config.block_size};
  if (s.precision == "fp16") training.loss_scaling = LossScalerOptions{};
  std::optional<parallel::DelayedUpdate> delayed;
  if (s.delayed_update >= 0) {
    delayed.emplace(optimizer, gpt->modules(), parallel::DelayedUpdateOptions{.warmup_steps = s.delayed_update});
    training.delayed_update = &*delayed;
  }
  parallel::Trainer trainer(optimizer, training);
  // The whole training state (checkpoint.h): parameters and optimizer state by name,
  // the loss scale, the data position; saved under --save-dir, resumed on any mesh.
  checkpoint::TrainState state{
      .modules = gpt->modules(), .optimizer = &optimizer, .scaler = trainer.scaler(), .sampler = &sampler};
  const std::string resume_from = checkpoint_to_resume(s.resume);
  if (!resume_from.empty()) {
    checkpoint::load(resume_from, state, world);
    if (leader) {
      std::printf("resumed from %s: %lld of %lld steps done\n", resume_from.c_str(), static_cast<long long>(state.step),
                  static_cast<long long>(s.steps));
    }
  } else {
    if (leader && !s.resume.empty())
      std::printf("no checkpoint under %s yet: starting from step 1\n", s.resume.c_str());
    if (!s.init_from.empty()) {
      init_from_file(s.init_from, state.modules, world);
      if (leader) std::printf("parameters from %s\n", s.init_from.c_str());
    }
  }
  std::optional<checkpoint::CheckpointDir> checkpoints;
  if (!s.save_dir.empty()) checkpoints.emplace(s.save_dir, static_cast<int>(s.keep));
  std::optional<checkpoint::AsyncSaver> saver;
  if (s.async_save) saver.emplace(world);
  // Context parallelism: the sequence order (load-balanced) every step runs in.
  const ContextParallelScope sequence_order(gpt->context_parallel());
  for (int64_t step = state.step; step < s.steps; ++step) {
    const parallel::StepReport report = pipe ? trainer.step(step, *pipe) : trainer.step(step, [&](int64_t micro) {
      const TokenBatch batch = data.get_batch(sampler.micro_batch_at(step, micro));
      const DistTensor ids = gpt->batch_from_local(batch.inputs), targets = gpt->batch_from_local(batch.targets);
      return gpt->model()->loss(ids, targets);
    });
    if (log) log->step(report.stats);
    // DTENSOR_PLAN=step: what the first step recorded and planned, and any step that
    // did not replay the plan.
    if (log && report.plan && report.plan->phase != StepPlanReport::Phase::Replayed)
      log->note(report.plan->to_string());
    const int64_t done = step + 1;
    if (checkpoints && ((s.save_every > 0 && done % s.save_every == 0) || done == s.steps)) {
      state.step = done;
      // The update in flight lands first: the run that goes on and one resumed from
      // here take the same steps.
      if (delayed) delayed->finish();
      const checkpoint::StateDict dict = checkpoint::train_state_dict(state);
      const std::string path =
          saver ? checkpoints->save_async(*saver, done, dict) : checkpoints->save(done, dict, world);
      if (log) log->note((saver ? "checkpoint (writing in the background): " : "checkpoint: ") + path);
    }
  }
  if (saver) saver->wait();  // the last checkpoint committed (or its error) before the summary
  if (delayed) {
    delayed->finish();  // the last step's update
    const parallel::DelayedUpdateStats& d = delayed->stats();
    if (leader && log) {
      std::printf(
          "delayed update: %lld of %lld steps one step stale; host optimizer %.3f s, of it %.3f s waited for "
          "(%.0f%% hidden behind forward and backward)\n",
          static_cast<long long>(d.delayed_steps), static_cast<long long>(d.steps), d.update_seconds, d.wait_seconds,
          d.update_seconds > 0 ? 100 * std::max(0.0, 1 - d.wait_seconds / d.update_seconds) : 0.0);
    }
  }
  if (!s.export_path.empty()) {
    // Every parameter once, written where it lies, nothing gathered.
    checkpoint::export_safetensors(s.export_path, named_parameters(state.modules), world,
                                   {.metadata = model_metadata(config, s, data), .overwrite = true});
    if (leader) std::printf("parameters: %s (safetensors)\n", s.export_path.c_str());
  }
  std::optional<parallel::Timeline> timeline;
  if (pipe)
    timeline = pipe->gather_timeline(pipe->schedule().name + " on " + mesh.to_string() + ", last step, measured");
  if (!s.save.empty()) {
    const std::map<std::string, Tensor> state =
        gpt->pipeline() ? gather_pipeline_state(*gpt->pipeline()) : gpt->model()->state_dict();
    if (leader) {
      nn::save_state_file(s.save, state, model_metadata(config, s, data));
      std::printf("parameters: %s (%zu tensors)\n", s.save.c_str(), state.size());
    }
  }
  if (log) {
    log->finish();
    const std::string svg =
        log->write_loss_curve(s.out, "GPT training loss (" + mesh.to_string() + ", " + s.precision + ")");
    std::printf("loss curve: %s and %s\n", s.out.c_str(), svg.c_str());
    if (const LossScaler* scaler = trainer.scaler()) {
      std::printf("fp16 loss scale %g, %lld skipped steps\n", scaler->scale_value(),
                  static_cast<long long>(scaler->skipped_steps()));
    }
    if (timeline) {
      const parallel::Schedule& sched = pipe->schedule();
      std::printf(
          "pipeline: last step's bubble %.1f%% measured, %.1f%% in theory for equal stages (%s, p=%d, m=%d%s)\n",
          100 * timeline->bubble_fraction(),
          100 * parallel::theoretical_bubble(sched.kind, sched.ranks, sched.micro_batches, sched.virtual_stages()),
          sched.name.c_str(), sched.ranks, sched.micro_batches,
          sched.virtual_stages() > 1 ? (", v=" + std::to_string(sched.virtual_stages())).c_str() : "");
    }
  }
  if (log && !log->history().empty() && !log->history().back().peak_memory_bytes.empty()) {
    // The last step's peak against the estimator's for this configuration.
    const std::vector<int64_t>& peaks = log->history().back().peak_memory_bytes;
    const auto most = std::max_element(peaks.begin(), peaks.end());
    const RunEstimate predicted = estimate_run(s, config);
    if (predicted.estimate) {
      const double estimated = predicted.estimate->memory_bytes;
      std::printf("memory: peak %s on rank %lld in the last step; estimated %s (dtensor-plan's model, %+.1f%%)\n",
                  format_bytes(*most).c_str(), static_cast<long long>(most - peaks.begin()),
                  format_bytes(static_cast<int64_t>(estimated)).c_str(),
                  100 * (estimated / static_cast<double>(*most) - 1));
      // The median step after the first (which records plans and warms caches).
      std::vector<double> seconds;
      for (size_t i = 1; i < log->history().size(); ++i) seconds.push_back(log->history()[i].seconds);
      if (!s.profile.empty() && !seconds.empty() && s.precision != "fp32") {
        std::printf("step: not estimated in 16 bits (the profile measures this machine's FP32 rates)\n");
      } else if (!s.profile.empty() && !seconds.empty()) {
        std::nth_element(seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2),
                         seconds.end());
        const double median = seconds[seconds.size() / 2], predicted_step = predicted.estimate->step_seconds;
        std::printf("step: median %.4f s (steps 2-%zu); estimated %.4f s on %s's rates (%+.1f%%)\n", median,
                    log->history().size(), predicted_step, s.profile.c_str(), 100 * (predicted_step / median - 1));
        std::printf("  estimate: %s\n", predicted.estimate->to_string().c_str());
      }
    } else {
      std::printf("memory: peak %s on rank %lld in the last step (not estimated: %s)\n", format_bytes(*most).c_str(),
                  static_cast<long long>(most - peaks.begin()), predicted.not_modelled.c_str());
    }
  }
  if (leader && timeline && !s.timeline.empty()) {
    const size_t dot = s.timeline.rfind('.');
    const std::string trace = (dot == std::string::npos ? s.timeline : s.timeline.substr(0, dot)) + ".json";
    timeline->write_svg(s.timeline);
    timeline->write_chrome_trace(trace);
    std::printf("pipeline timeline: %s and %s (Perfetto)\n", s.timeline.c_str(), trace.c_str());
  }
}

// --plan auto: the estimator's fastest configuration (dtensor/parallel/plan.h) of this
// model on --mesh's number of ranks, on this machine's measured rates (--profile, or a
// short calibration now), written over the layout flags. The ranked list is printed;
// a configuration train_gpt cannot run (its own checks say why) passes to the next.
TrainConfig choose_plan(const TrainConfig& given, const Group* mpi_world) {
  const Settings base = read_settings(given);  // the user's flags must stand on their own
  const int64_t ranks = shape_numel(base.mesh.shape);
  models::GPTConfig config = base.model;
  config.vocab = given.vocab;
  parallel::ModelSpec model = models::gpt_model_spec(config, base.model.block_size);
  model.name = "train_gpt's GPT";
  const bool leader = !mpi_world || mpi_world->rank() == 0;
  parallel::MachineProfile profile;
  if (!given.profile.empty()) {
    profile = parallel::MachineProfile::load(given.profile);
  } else {
    parallel::CalibrationOptions calibration;
    calibration.backend = mpi_world ? "mpi" : "threads";
    calibration.ranks = mpi_world ? 0 : ranks;
    calibration.seconds_per_sample = 0.02;
    if (leader) std::printf("--plan auto: measuring this machine (dtensor-plan --calibrate saves it)\n");
    profile = parallel::calibrate(calibration);  // the same samples, and so the same choice, on every rank
  }
  parallel::ClusterSpec cluster = profile.cluster(ranks);
  // 16-bit compute: memory in 16-bit activations over FP32 parameters; the rates stay
  // the profile's FP32 ones.
  if (base.precision != "fp32") cluster.bytes_per_value = 2;
  parallel::PlanSearchOptions options;
  options.loss_parallel = base.loss_parallel;
  // The run keeps the user's FSDP options and offload share: the search estimates them.
  options.fsdp_layer_units = base.fsdp_unit == models::GPTParallelOptions::FSDPUnit::Layer;
  options.fsdp_prefetch = base.fsdp_prefetch;
  options.reshard_after_forward = base.fsdp_reshard_after_forward.value_or(true);
  options.offload_fraction = base.offload_fraction;
  options.recompute = {parallel::Recompute::None, parallel::Recompute::Full};  // --checkpoint-activations
  options.max_micro_batch = given.batch;                                       // any micro-batch size runs here
  const parallel::PlanSearch found = parallel::search_plans(model, cluster, given.batch, options);
  if (leader) {
    std::printf("--plan auto: %s on %lld ranks; %s\n", model.name.c_str(), static_cast<long long>(ranks),
                profile.to_string().c_str());
  }
  std::string refused;
  for (size_t i = 0; i < found.ranked.size(); ++i) {
    const parallel::ParallelPlan& p = found.ranked[i].plan;
    TrainConfig c = given;
    std::string mesh;
    // The plan's dp counts the expert-parallel ranks and HSDP's replicas among the
    // data-parallel ones.
    const int64_t shard = p.zero_shard > 0 ? p.zero_shard : p.dp / p.ep;
    for (const auto& [name, size] : {std::pair<const char*, int64_t>{"pp", p.pp},
                                     {"replicate", p.dp / p.ep / shard},
                                     {"dp", shard},
                                     {"cp", p.cp},
                                     {"ep", p.ep},
                                     {"tp", p.tp}}) {
      if (size > 1) mesh += (mesh.empty() ? "" : ",") + std::string(name) + "=" + std::to_string(size);
    }
    c.mesh = mesh.empty() ? "dp=1" : mesh;
    c.fsdp = p.zero;
    c.hsdp = p.zero_shard > 0;
    c.offload = p.offload;
    c.sequence_parallel = p.sequence_parallel;
    c.checkpoint_activations = p.recompute == parallel::Recompute::Full;
    c.schedule = p.pp == 1                                           ? ""
                 : p.schedule == parallel::PlanSchedule::GPipe       ? "gpipe"
                 : p.schedule == parallel::PlanSchedule::Interleaved ? "interleaved"
                                                                     : "1f1b";
    c.microbatches = p.pp > 1 ? p.micro_batches : 0;
    c.virtual_stages = p.pp > 1 ? p.virtual_stages : 1;
    c.grad_accum = p.pp > 1 ? 1 : p.micro_batches;
    try {
      (void)read_settings(c);
    } catch (const std::invalid_argument& e) {
      refused += std::string("\n  train_gpt cannot run ") + p.to_string() + ": " + e.what();
      continue;
    }
    if (leader) {
      for (size_t j = 0; j < found.ranked.size() && j < 5; ++j) {
        std::printf("  %zu. %s\n", j + 1, found.ranked[j].to_string().c_str());
      }
      if (!refused.empty()) std::printf("skipped:%s\n", refused.c_str());
      std::printf("--plan auto chose #%zu: --mesh %s --fsdp %lld%s%s%s%s%s (%zu configurations fit, %zu rejected)\n",
                  i + 1, c.mesh.c_str(), static_cast<long long>(c.fsdp), c.hsdp ? " --hsdp" : "",
                  c.offload ? " --offload" : "",
                  c.grad_accum > 1 ? (" --grad-accum " + std::to_string(c.grad_accum)).c_str() : "",
                  p.pp > 1 ? (" --schedule " + c.schedule + " --microbatches " + std::to_string(c.microbatches) +
                              (c.virtual_stages > 1 ? " --virtual-stages " + std::to_string(c.virtual_stages) : ""))
                                 .c_str()
                           : "",
                  std::string(c.checkpoint_activations ? " --checkpoint-activations" : "")
                      .append(c.sequence_parallel ? " --sequence-parallel" : "")
                      .c_str(),
                  found.ranked.size(), found.rejected.size());
    }
    return c;
  }
  throw std::invalid_argument("--plan auto: no configuration of " + std::to_string(ranks) + " ranks fits and runs (" +
                              std::to_string(found.rejected.size()) + " rejected" +
                              (found.rejected.empty() ? "" : ", e.g. " + found.rejected.front().rejected) + ")" +
                              refused);
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  std::optional<TrainConfig> config;
  try {
    // Defaults, then the config file (--config), then the flags given here.
    config = tools::parse_train_args(argc, argv);
    if (!config) return 0;  // --help
    if (config->plan == "auto" && config->backend == "threads") {
      settings = read_settings(choose_plan(*config, nullptr));
    } else {
      settings = read_settings(*config);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 2;
  }
  try {
    const std::unique_ptr<TokenDataset> data = make_dataset(settings);
    check_gpu(settings);
    // nccl: one process per GPU when mpirun started this one, else a thread per GPU.
    const bool nccl = settings.backend == "nccl";
    const bool processes = settings.backend == "mpi" || (nccl && init("any").backend() == "mpi");
    if (processes) {
      Group world = init(settings.backend);
      if (config->plan == "auto") settings = read_settings(choose_plan(*config, &world));
      const int64_t ranks = shape_numel(settings.mesh.shape);
      if (world.size() != ranks) {
        throw std::invalid_argument("--mesh " + settings.mesh.to_string() + " needs " + std::to_string(ranks) +
                                    " ranks, mpirun started " + std::to_string(world.size()));
      }
      std::string trace = settings.trace;
      // One file per process: trace.json -> trace.0.json, trace.1.json, ...
      if (!trace.empty() && trace.find("{rank}") == std::string::npos) {
        const size_t dot = trace.rfind('.');
        trace = dot == std::string::npos || dot < trace.rfind('/') + 1
                    ? trace + ".{rank}"
                    : trace.substr(0, dot) + ".{rank}" + trace.substr(dot);
      }
      if (!trace.empty()) Tracer::start(trace);
      train(world, settings, *data);
      if (!trace.empty()) std::printf("trace: %s\n", Tracer::stop().c_str());
    } else {
      if (!settings.trace.empty()) Tracer::start(settings.trace);
      launch(static_cast<int>(shape_numel(settings.mesh.shape)),
             [&](Group world) { train(nccl ? init("nccl") : world, settings, *data); });
      if (!settings.trace.empty()) std::printf("trace: %s (open in Perfetto)\n", Tracer::stop().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
