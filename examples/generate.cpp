// Text generation with a GPT that train_gpt trained and saved, its layers spread over
// pipeline stages (forward-only pipelined inference, as accelerate's device_map or
// DeepSpeed's ZeRO-Inference place a model layer by layer across devices).
//
//   ./build/examples/train_gpt --mesh pp=2 --data notes.txt --save gpt.dtstate
//   ./build/examples/generate --load gpt.dtstate --mesh pp=2 --samples 4 --microbatches 2 --prompt "The "
//   ./build/examples/generate --load gpt.dtstate --mesh pp=2,tp=2 --check   # and compare with one rank
//   ./build/examples/generate --load gpt.dtstate --mesh pp=1 --stream-weights --prefetch 1   # ZeRO-Inference
//
// Each new token is one forward-only pipeline step: the samples go through the stages
// in micro-batches (stage 1 works on micro-batch 0 while stage 0 starts micro-batch 1),
// the last stage samples the next token of every row from its logits, and the pp group
// broadcasts them to the first stage for the next step. No KV cache: every step runs
// the whole window (the last block_size tokens).
//
// --stream-weights keeps every transformer block's weights in host memory and copies
// each to the device just before its forward, freeing it after (parallel::stream_weights,
// DeepSpeed's ZeRO-Inference): a stage holds its embedding, head and 1 + --prefetch
// blocks on the device at a time, so a model larger than device memory generates. On a
// CPU model the host is cpu:1, counted apart, so the device peak below is the figure a
// GPU would show.
//
// --check runs the same model on one rank afterwards: its logits on the final window
// must match the pipeline's, and each generated token must follow from them by the
// same sampling rule and random draw.
#include <dtensor/dtensor.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cli.h"  // examples/common

using namespace dtensor;

namespace {

struct Settings {
  std::string load;
  MeshSpec mesh;
  int64_t samples = 4, micro_batches = 2, tokens = 48, top_k = 0;
  double temperature = 0.8;
  uint64_t seed = 1;
  std::string prompt;
  bool check = false;
  bool stream_weights = false;
  int prefetch = 1;
};

int64_t to_integer(const std::string& what, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end) throw std::invalid_argument(what + ": expected an integer, got '" + v + "'");
  return x;
}

// The command line (CLI11); nullopt after --help.
std::optional<Settings> parse(int argc, char** argv) {
  Settings s;
  std::string mesh = "pp=2";
  CLI::App app(
      "Pipelined inference: generates text with a GPT that train_gpt --save wrote, its layers spread "
      "over the pp ranks (and tp within each).",
      "generate");
  app.add_option("--load", s.load, "parameters written by train_gpt --save (required)");
  app.add_option("--mesh", mesh, "pipeline stages, and tensor parallelism within each: pp=N[,tp=M]")
      ->capture_default_str();
  app.add_option("--samples", s.samples, "sequences generated together")->capture_default_str();
  app.add_option("--microbatches", s.micro_batches, "micro-batches the samples are cut into (at most --samples)")
      ->capture_default_str();
  app.add_option("--tokens", s.tokens, "new tokens per sequence")->capture_default_str();
  app.add_option("--prompt", s.prompt,
                 "start of every sequence (character models; synthetic ones: token ids); empty: the first token");
  app.add_option("--temperature", s.temperature, "softmax temperature; 0 takes the most likely token")
      ->capture_default_str();
  app.add_option("--top-k", s.top_k, "sample among the K most likely tokens only (0: all)")->capture_default_str();
  app.add_option("--seed", s.seed, "seed of the random draws")->capture_default_str();
  app.add_flag("--check", s.check, "compare the logits and tokens with the same model on one rank");
  app.add_flag(
      "--stream-weights", s.stream_weights,
      "keep the blocks' weights in host memory, each fetched before its forward and freed after (ZeRO-Inference)");
  app.add_option("--prefetch", s.prefetch, "with --stream-weights: blocks fetched ahead of their forward")
      ->capture_default_str();
  if (!tools::parse_command_line(app, argc, argv)) return std::nullopt;  // --help
  s.mesh = parse_mesh_spec(mesh);
  if (s.load.empty()) throw std::invalid_argument("--load FILE is required (train_gpt --save FILE writes one)");
  for (const std::string& name : s.mesh.names) {
    if (name != "pp" && name != "tp") {
      throw std::invalid_argument("--mesh: dims are pp (pipeline stages) and tp (tensor parallel), got '" + name + "'");
    }
  }
  if (std::count(s.mesh.names.begin(), s.mesh.names.end(), "pp") == 0) {
    throw std::invalid_argument("--mesh " + s.mesh.to_string() + ": pipelined inference needs a 'pp' dim (e.g. pp=2)");
  }
  if (s.samples < 1 || s.micro_batches < 1 || s.micro_batches > s.samples) {
    throw std::invalid_argument("--microbatches " + std::to_string(s.micro_batches) + " must be in [1, --samples " +
                                std::to_string(s.samples) + "] (each micro-batch holds at least one sequence)");
  }
  if (s.tokens < 1) throw std::invalid_argument("--tokens: expected at least 1, got " + std::to_string(s.tokens));
  if (s.temperature < 0) throw std::invalid_argument("--temperature: expected >= 0, got " + std::to_string(s.temperature));
  if (s.top_k < 0) throw std::invalid_argument("--top-k: expected >= 0, got " + std::to_string(s.top_k));
  if (s.prefetch < 0) throw std::invalid_argument("--prefetch: expected >= 0, got " + std::to_string(s.prefetch));
  return s;
}

// The model configuration train_gpt wrote beside the parameters.
models::GPTConfig config_of(const nn::StateFile& f, const std::string& path) {
  const auto get = [&](const std::string& key) {
    const auto it = f.metadata.find(key);
    if (it == f.metadata.end()) throw std::invalid_argument(path + ": no '" + key + "' in the metadata (not saved by train_gpt?)");
    return it->second;
  };
  if (get("model") != "gpt") throw std::invalid_argument(path + ": holds a '" + get("model") + "' model, not a GPT");
  models::GPTConfig c;
  c.vocab = to_integer("vocab", get("vocab"));
  c.block_size = to_integer("block_size", get("block_size"));
  c.layers = to_integer("layers", get("layers"));
  c.heads = to_integer("heads", get("heads"));
  c.dim = to_integer("dim", get("dim"));
  c.mlp_hidden = to_integer("mlp_hidden", get("mlp_hidden"));
  c.activation = get("activation") == "swiglu" ? nn::Activation::SwiGlu : nn::Activation::Gelu;
  c.rms_norm = get("norm") == "rmsnorm";
  c.bias = get("bias") == "true";
  c.tie_weights = get("tie_weights") == "true";
  // A mixture-of-experts model (absent from files of dense models).
  if (f.metadata.count("moe_experts")) {
    c.moe_experts = to_integer("moe_experts", get("moe_experts"));
    c.moe_top_k = to_integer("moe_top_k", get("moe_top_k"));
    c.moe_hidden = to_integer("moe_hidden", get("moe_hidden"));
    c.moe_capacity_factor = std::stod(get("moe_capacity_factor"));
    c.moe_shared_expert = get("moe_shared_expert") == "true";
  }
  return c;
}

// How tokens are written and read: the characters of the training text, or the ids
// of the synthetic language.
struct Tokens {
  std::string vocabulary;  // empty: synthetic ids
  std::vector<int64_t> encode(const std::string& text, int64_t vocab) const {
    std::vector<int64_t> ids;
    if (!vocabulary.empty()) {
      for (const char c : text) {
        const size_t at = vocabulary.find(c);
        if (at == std::string::npos) throw std::invalid_argument(std::string("--prompt: the character '") + c + "' is not in the model's vocabulary");
        ids.push_back(static_cast<int64_t>(at));
      }
    } else {
      std::istringstream in(text);
      for (std::string word; in >> word;) ids.push_back(to_integer("--prompt", word));
    }
    for (const int64_t id : ids) {
      if (id < 0 || id >= vocab) throw std::invalid_argument("--prompt: token " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    std::string out;
    for (const int64_t id : ids) {
      if (!vocabulary.empty()) out += vocabulary[static_cast<size_t>(id)];
      else out += (out.empty() ? "" : " ") + std::to_string(id);
    }
    return out;
  }
};

// The next token from one row of logits: the most likely at temperature 0, else a
// draw u in [0, 1) through the cumulative softmax of logits / temperature over the
// top_k most likely (all when 0). Computed in double, the same on every rank.
int64_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k, double u) {
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (temperature == 0) return order[0];
  const size_t keep = top_k > 0 ? static_cast<size_t>(std::min(top_k, vocab)) : order.size();
  std::vector<double> weights(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    weights[i] = std::exp((static_cast<double>(logits[order[i]]) - logits[order[0]]) / temperature);
    total += weights[i];
  }
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += weights[i] / total;
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

double draw(uint64_t seed, int64_t step, int64_t row) {
  return random::uniform(seed, static_cast<uint64_t>(step) * 1000003ULL + static_cast<uint64_t>(row));
}

// What the pipeline produced, kept for the check.
struct Generated {
  std::vector<std::vector<int64_t>> rows;  // prompt + new tokens
  Tensor last_window;                      // the last step's input [samples, T] (I64)
  Tensor last_logits;                      // its logits [samples, T, vocab]
  int64_t window_start = 0;                // position of last_window's first token in the rows
  double seconds = 0;
  double bubble = 0;                       // of the last step, measured
  // Per rank: the device's peak during generation, and the bytes of weights resident on
  // it (those outside the streamed blocks, or all of them).
  std::vector<int64_t> device_peak, resident_weights;
  // --stream-weights, rank 0: host bytes, the largest block, and the copy counters.
  int64_t host_bytes = 0, largest_block = 0;
  parallel::WeightStreamStats streamed;
};

Generated generate(const Settings& s, const nn::StateFile& file, const models::GPTConfig& config,
                   const std::vector<int64_t>& prompt) {
  Generated result;
  const int ranks = static_cast<int>(shape_numel(s.mesh.shape));
  result.device_peak.assign(static_cast<size_t>(ranks), 0);
  result.resident_weights.assign(static_cast<size_t>(ranks), 0);
  std::mutex mutex;
  launch(ranks, [&](Group world) {
    DeviceMesh mesh(world, s.mesh.shape, s.mesh.names);
    parallel::PipelineMesh pm(mesh);
    const DeviceMesh& stage_mesh = pm.stage_mesh();
    models::GPTPipeline gpt(
        pm, config, /*seed, overwritten by the file*/ 0,
        {.schedule = parallel::ScheduleKind::ForwardOnly, .micro_batches = static_cast<int>(s.micro_batches)});
    const bool has_tp = std::count(s.mesh.names.begin(), s.mesh.names.end(), "tp") > 0;
    for (const auto& stage : gpt.stages()) {
      if (has_tp)
        parallel::parallelize_module(*stage, stage_mesh["tp"],
                                     parallel::restrict_plan(models::gpt_tp_plan(gpt.config()), *stage));
    }
    gpt.load_state_dict(file.tensors);
    // ZeRO-Inference: every block of this rank's stages streams from the host.
    std::vector<parallel::WeightStream> streams;
    if (s.stream_weights) {
      for (const auto& stage : gpt.stages()) {
        std::vector<nn::Module*> blocks;
        for (auto& [name, m] : stage->named_modules()) {
          if (dynamic_cast<nn::TransformerBlock*>(m)) blocks.push_back(m);
        }
        if (!blocks.empty()) streams.push_back(parallel::stream_weights(*stage, blocks, {.prefetch = s.prefetch}));
      }
    }
    int64_t resident = 0;
    for (const DistTensor& p : gpt.parameters()) {
      const Tensor local = p.to_local();
      if (local.storage() && local.storage()->holds_memory()) resident += static_cast<int64_t>(local.nbytes());
    }
    reset_peak_memory(Device::cpu());
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(s.samples), prompt);
    const std::vector<int64_t> sizes = parallel::micro_batch_rows(s.samples, s.micro_batches);
    std::vector<int64_t> offsets{0};
    for (const int64_t n : sizes) offsets.push_back(offsets.back() + n);
    const Placements replicated(static_cast<size_t>(stage_mesh.ndim()), Replicate());
    int64_t window_start = 0;
    // The window of rows [offsets[m], offsets[m+1]): the last block_size tokens.
    auto window = [&](int64_t first, int64_t count) {
      const int64_t length = static_cast<int64_t>(rows[0].size());
      window_start = std::max<int64_t>(0, length - config.block_size);
      std::vector<int64_t> ids;
      for (int64_t r = first; r < first + count; ++r) {
        ids.insert(ids.end(), rows[static_cast<size_t>(r)].begin() + window_start, rows[static_cast<size_t>(r)].end());
      }
      return Tensor::from_vector(ids, {count, length - window_start});
    };
    std::unique_ptr<parallel::Pipeline> pipe = gpt.make_pipeline(
        {},
        [&](int64_t, int64_t m) {
          return distribute(window(offsets[static_cast<size_t>(m)], sizes[static_cast<size_t>(m)]), stage_mesh,
                            replicated);
        },
        nullptr);
    const bool last = pm.coordinate() == pm.size() - 1;
    const auto start = std::chrono::steady_clock::now();
    std::vector<Tensor> logits;
    for (int64_t step = 0; step < s.tokens; ++step) {
      const std::vector<DistTensor> out = pipe->forward(step);
      Tensor next = Tensor::zeros({s.samples}, DType::I64);
      if (last) {
        logits.clear();
        for (int64_t m = 0; m < s.micro_batches; ++m) {
          const Tensor l = out[static_cast<size_t>(m)].full_tensor().contiguous();  // [rows, T, vocab]
          logits.push_back(l);
          const int64_t t = l.size(1), vocab = l.size(2);
          for (int64_t r = 0; r < l.size(0); ++r) {
            const int64_t row = offsets[static_cast<size_t>(m)] + r;
            const float* p = l.data<float>() + (r * t + t - 1) * vocab;
            next.data<int64_t>()[row] = sample_token(p, vocab, s.temperature, s.top_k, draw(s.seed, step, row));
          }
        }
      }
      // The last stage's choices to every stage (the first needs them next step).
      broadcast_(pm.group(), next, pm.size() - 1);
      if (step + 1 == s.tokens && last && stage_mesh.linear_index() == 0) {
        const std::lock_guard<std::mutex> lock(mutex);
        result.last_window = window(0, s.samples);
        result.window_start = window_start;
        result.last_logits = Tensor::empty({s.samples, logits[0].size(1), logits[0].size(2)});
        char* at = static_cast<char*>(result.last_logits.data_ptr());
        for (const Tensor& l : logits) at = static_cast<char*>(std::memcpy(at, l.data_ptr(), l.nbytes())) + l.nbytes();
      }
      for (int64_t r = 0; r < s.samples; ++r) rows[static_cast<size_t>(r)].push_back(next.data<int64_t>()[r]);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const parallel::Timeline timeline = pipe->gather_timeline();
    {
      const std::lock_guard<std::mutex> lock(mutex);
      result.device_peak[static_cast<size_t>(world.rank())] = memory_stats(Device::cpu()).peak_bytes;
      result.resident_weights[static_cast<size_t>(world.rank())] = resident;
    }
    if (world.rank() == 0) {
      const std::lock_guard<std::mutex> lock(mutex);
      for (const parallel::WeightStream& w : streams) {
        result.host_bytes += w.host_bytes();
        result.largest_block = std::max(result.largest_block, w.largest_unit_bytes());
        result.streamed.fetches += w.stats().fetches;
        result.streamed.prefetches += w.stats().prefetches;
        result.streamed.bytes_fetched += w.stats().bytes_fetched;
        result.streamed.fetch_seconds += w.stats().fetch_seconds;
      }
      result.rows = rows;
      result.seconds = seconds;
      result.bubble = timeline.bubble_fraction();
    }
  });
  return result;
}

// The same model on one rank: its logits on the last window, and every generated token
// of the window re-derived from them. Returns false (and says why) on a mismatch.
bool check_against_one_rank(const Settings& s, const nn::StateFile& file, const models::GPTConfig& config,
                            const Generated& g, int64_t prompt_length) {
  Tensor want;
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    models::GPT model(mesh, config, 0);
    model.load_state_dict(file.tensors);
    want = model(distribute(g.last_window, mesh, {Replicate()})).full_tensor().contiguous();
  });
  const Tensor got = g.last_logits;
  const double diff = amax(abs(sub(got, want))).item<double>();
  const double scale = amax(abs(want)).item<double>();
  bool ok = diff <= 1e-4 * std::max(1.0, scale);
  std::printf("check: logits of the last window (%lld x %lld tokens) differ from one rank's by %.3g (largest %.3g)%s\n",
              static_cast<long long>(want.size(0)), static_cast<long long>(want.size(1)), diff, scale,
              ok ? "" : ": MISMATCH");
  // Position t of the window predicts the token at window_start + t + 1.
  const int64_t t_len = want.size(1), vocab = want.size(2);
  int64_t checked = 0, differ = 0;
  for (int64_t r = 0; r < s.samples; ++r) {
    for (int64_t t = 0; t < t_len; ++t) {
      const int64_t position = g.window_start + t + 1;
      if (position < prompt_length) continue;  // a prompt token, not generated
      const int64_t step = position - prompt_length;
      const float* p = want.data<float>() + (r * t_len + t) * vocab;
      const int64_t expected = sample_token(p, vocab, s.temperature, s.top_k, draw(s.seed, step, r));
      ++checked;
      if (expected != g.rows[static_cast<size_t>(r)][static_cast<size_t>(position)]) ++differ;
    }
  }
  std::printf("check: %lld of %lld generated tokens re-derived on one rank differ\n", static_cast<long long>(differ),
              static_cast<long long>(checked));
  return ok && differ == 0 && checked > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  try {
    const std::optional<Settings> parsed = parse(argc, argv);
    if (!parsed) return 0;  // --help
    s = *parsed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 2;
  }
  try {
    const nn::StateFile file = nn::load_state_file(s.load);
    const models::GPTConfig config = config_of(file, s.load);
    Tokens tokens;
    if (file.metadata.count("vocabulary")) tokens.vocabulary = file.metadata.at("vocabulary");
    const std::vector<int64_t> prompt = s.prompt.empty() ? std::vector<int64_t>{0} : tokens.encode(s.prompt, config.vocab);
    if (prompt.empty()) throw std::invalid_argument("--prompt: no tokens");
    const Generated g = generate(s, file, config, prompt);
    std::printf("GPT of %lld layers (dim %lld, vocab %lld) from %s (trained on %s), on %s: %lld samples in %lld "
                "micro-batches, %lld tokens each in %.2f s (%.0f tokens/s), last step's bubble %.1f%%\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.dim),
                static_cast<long long>(config.vocab), s.load.c_str(),
                file.metadata.count("trained_on") ? file.metadata.at("trained_on").c_str() : "?",
                s.mesh.to_string().c_str(), static_cast<long long>(s.samples), static_cast<long long>(s.micro_batches),
                static_cast<long long>(s.tokens), g.seconds, static_cast<double>(s.samples * s.tokens) / g.seconds,
                100 * g.bubble);
    const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
    std::printf("device peak per rank (weights resident):");
    for (size_t r = 0; r < g.device_peak.size(); ++r) {
      std::printf("%s r%zu %.2f MiB (%.2f MiB)", r ? "," : "", r, mib(g.device_peak[r]), mib(g.resident_weights[r]));
    }
    std::printf("\n");
    if (s.stream_weights) {
      std::printf(
          "streamed weights, rank 0: %.2f MiB of blocks on the host (largest %.2f MiB), prefetch %d: %lld "
          "fetches (%lld ahead), %.1f MiB in %.3f s (%.1f%% of the time)\n",
          mib(g.host_bytes), mib(g.largest_block), s.prefetch, static_cast<long long>(g.streamed.fetches),
          static_cast<long long>(g.streamed.prefetches), mib(g.streamed.bytes_fetched), g.streamed.fetch_seconds,
          100 * g.streamed.fetch_seconds / g.seconds);
    }
    for (size_t r = 0; r < g.rows.size(); ++r) std::printf("[%zu] %s\n", r, tokens.decode(g.rows[r]).c_str());
    // The synthetic language: how many generated transitions the chain allows.
    if (file.metadata.count("data_seed")) {
      const SyntheticLanguage chain(config.vocab, config.block_size, 1,
                                    static_cast<uint64_t>(to_integer("data_seed", file.metadata.at("data_seed"))));
      int64_t allowed = 0, total = 0;
      for (const auto& row : g.rows) {
        for (size_t i = prompt.size(); i < row.size(); ++i) {
          const std::vector<int64_t> next = chain.successors(row[i - 1]);
          allowed += std::count(next.begin(), next.end(), row[i]) > 0;
          ++total;
        }
      }
      std::printf("%lld of %lld generated transitions (%.0f%%) are the synthetic chain's (an untrained model: %.0f%%)\n",
                  static_cast<long long>(allowed), static_cast<long long>(total), 100.0 * allowed / total,
                  100.0 * SyntheticLanguage::kSuccessors / config.vocab);
    }
    if (s.check && !check_against_one_rank(s, file, config, g, static_cast<int64_t>(prompt.size()))) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
