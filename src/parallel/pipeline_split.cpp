// Pipeline splits: layer ranges, and the stages of an nn::Sequential.
#include "dtensor/parallel/pipeline_split.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "pipeline_split";

std::string split_to_string(const std::vector<StageLayers>& split) {
  std::string out;
  for (size_t k = 0; k < split.size(); ++k) {
    out += detail::concat(k ? ", " : "", "[", split[k].first, ", ", split[k].end, ")");
  }
  return out;
}

void check_stage_count(int64_t layers, int64_t stages) {
  DT_CHECK_ARG(stages >= 1, kOp, "expected at least 1 stage, got ", stages);
  DT_CHECK_ARG(stages <= layers, kOp, stages, " pipeline stages need at least ", stages,
               " layers (one per stage), the model has ", layers);
}

}  // namespace

// ---- splits ----------------------------------------------------------------------------------

std::vector<StageLayers> split_layers_evenly(int64_t layers, int64_t stages) {
  check_stage_count(layers, stages);
  std::vector<StageLayers> split;
  int64_t first = 0;
  for (int64_t k = 0; k < stages; ++k) {
    const int64_t size = layers / stages + (k < layers % stages ? 1 : 0);
    split.push_back({first, first + size});
    first += size;
  }
  return split;
}

std::vector<StageLayers> balance_layers(const std::vector<double>& block_costs, double first_extra, double last_extra,
                                        int64_t stages) {
  const auto layers = static_cast<int64_t>(block_costs.size());
  check_stage_count(layers, stages);
  for (double c : block_costs) DT_CHECK_ARG(c >= 0 && std::isfinite(c), kOp, "expected costs >= 0, got ", c);
  std::vector<double> prefix(static_cast<size_t>(layers) + 1, 0.0);
  for (int64_t k = 0; k < layers; ++k)
    prefix[static_cast<size_t>(k) + 1] = prefix[static_cast<size_t>(k)] + block_costs[static_cast<size_t>(k)];
  auto cost = [&](int64_t stage, int64_t a, int64_t b) {
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)] + (stage == 0 ? first_extra : 0) +
           (stage == stages - 1 ? last_extra : 0);
  };
  // best[k][j]: the smallest possible costliest stage when stages 0..k hold blocks [0, j).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages),
                                        std::vector<double>(static_cast<size_t>(layers) + 1, kInf));
  std::vector<std::vector<int64_t>> cut = std::vector<std::vector<int64_t>>(
      static_cast<size_t>(stages), std::vector<int64_t>(static_cast<size_t>(layers) + 1, 0));
  for (int64_t j = 1; j <= layers; ++j) best[0][static_cast<size_t>(j)] = cost(0, 0, j);
  for (int64_t k = 1; k < stages; ++k) {
    for (int64_t j = k + 1; j <= layers; ++j) {
      for (int64_t i = k; i < j; ++i) {
        const double v = std::max(best[static_cast<size_t>(k - 1)][static_cast<size_t>(i)], cost(k, i, j));
        // Ties go to the earlier cut: later stages keep more blocks.
        if (v < best[static_cast<size_t>(k)][static_cast<size_t>(j)] - 1e-12 * std::max(1.0, v)) {
          best[static_cast<size_t>(k)][static_cast<size_t>(j)] = v;
          cut[static_cast<size_t>(k)][static_cast<size_t>(j)] = i;
        }
      }
    }
  }
  std::vector<StageLayers> split(static_cast<size_t>(stages));
  int64_t end = layers;
  for (int64_t k = stages - 1; k >= 0; --k) {
    const int64_t first = k == 0 ? 0 : cut[static_cast<size_t>(k)][static_cast<size_t>(end)];
    split[static_cast<size_t>(k)] = {first, end};
    end = first;
  }
  return split;
}

void check_split(const std::vector<StageLayers>& split, int64_t layers, int64_t stages) {
  check_stage_count(layers, stages);
  DT_CHECK_ARG(static_cast<int64_t>(split.size()) == stages, kOp, "expected ", stages,
               " layer ranges (one per stage), got ", split.size(), ": ", split_to_string(split));
  int64_t next = 0;
  for (size_t k = 0; k < split.size(); ++k) {
    DT_CHECK_ARG(split[k].first == next && split[k].end > split[k].first, kOp, "stage ", k, " holds layers [",
                 split[k].first, ", ", split[k].end, "); expected a non-empty range starting at ", next,
                 " (the ranges must cover [0, ", layers, ") in order): ", split_to_string(split));
    next = split[k].end;
  }
  DT_CHECK_ARG(next == layers, kOp, "the ranges cover layers [0, ", next, "), the model has ", layers, ": ",
               split_to_string(split));
}

// ---- the stages of a Sequential -------------------------------------------------------------

namespace {

// The module at `path` under `root`, as the shared_ptr its parent holds.
std::shared_ptr<nn::Module> module_at(const nn::Module& root, const std::string& path) {
  for (const auto& [name, child] : root.children()) {
    if (path == name) return child;
    if (path.compare(0, name.size() + 1, name + ".") == 0) {
      if (auto found = module_at(*child, path.substr(name.size() + 1))) return found;
    }
  }
  return nullptr;
}

// Children [r.first, r.end) of `model` as a stage. A parameter the slice reaches under
// another name than the whole model's (the embedding a tied head holds) has its owner
// registered first under the whole model's path (Sequential::share), so that every
// parameter keeps its name.
std::shared_ptr<nn::Sequential> stage_of(nn::Sequential& model, const StageLayers& r) {
  const auto first = static_cast<size_t>(r.first), end = static_cast<size_t>(r.end);
  std::map<const void*, std::string> model_name;
  for (const auto& [name, p] : model.named_parameters()) model_name.emplace(p.impl().get(), name);
  std::vector<std::string> owners;
  for (const auto& [name, p] : model.slice(first, end)->named_parameters()) {
    const std::string& wanted = model_name.at(p.impl().get());
    if (wanted == name) continue;
    const std::string owner = wanted.substr(0, wanted.rfind('.'));
    if (std::find(owners.begin(), owners.end(), owner) == owners.end()) owners.push_back(owner);
  }
  if (owners.empty()) return model.slice(first, end);
  auto stage = std::make_shared<nn::Sequential>();
  for (const std::string& owner : owners) {
    stage->share(owner, module_at(model, owner));
  }
  for (size_t i = first; i < end; ++i) {
    stage->append(model.entries()[i].first, model.entries()[i].second, model.checkpointed(i));
  }
  for (const auto& [name, p] : stage->named_parameters()) {
    if (model_name.at(p.impl().get()) != name) {
      throw std::logic_error(std::string("[") + kOp + "] stage parameter '" + name + "' is '" +
                             model_name.at(p.impl().get()) + "' in the model");
    }
  }
  return stage;
}

}  // namespace

SequentialPipeline::SequentialPipeline(const PipelineMesh& mesh, std::shared_ptr<nn::Sequential> model,
                                       SequentialPipelineOptions options)
    : mesh_(mesh) {
  DT_CHECK_ARG(model != nullptr, kOp, "expected a model, got null");
  schedule_ = make_schedule(options.schedule, mesh.size(), options.micro_batches, options.virtual_stages);
  const auto layers = static_cast<int64_t>(model->size());
  const int64_t stages = schedule_.stages;
  check_stage_count(layers, stages);
  if (options.split_before.empty()) {
    std::vector<double> costs;
    for (const auto& [_, child] : model->entries()) costs.push_back(static_cast<double>(child->num_parameters() + 1));
    split_ = balance_layers(costs, 0, 0, stages);
  } else {
    DT_CHECK_ARG(static_cast<int64_t>(options.split_before.size()) == stages - 1, kOp, stages, " stages need ",
                 stages - 1, " split points, got ", options.split_before.size());
    int64_t first = 0;
    for (const std::string& name : options.split_before) {
      const auto at = static_cast<int64_t>(model->index_of(name));
      split_.push_back({first, at});
      first = at;
    }
    split_.push_back({first, layers});
    check_split(split_, layers, stages);
  }
  // Every stage (every rank holds the whole model), to find the ties.
  std::vector<std::shared_ptr<nn::Sequential>> all;
  for (const StageLayers& r : split_) all.push_back(stage_of(*model, r));
  // In the order the stages list them, the same on every rank (the pipeline reduces
  // the ties in this order).
  std::vector<std::pair<std::string, std::vector<int>>> holders;
  std::map<const void*, size_t> index;
  for (int s = 0; s < stages; ++s) {
    for (const auto& [name, p] : all[static_cast<size_t>(s)]->named_parameters()) {
      const auto [it, fresh] = index.emplace(p.impl().get(), holders.size());
      if (fresh) holders.push_back({name, {}});
      holders[it->second].second.push_back(s);
    }
  }
  for (const auto& [name, list] : holders) {
    if (list.size() < 2) continue;
    std::vector<int> coordinates;
    for (int s : list) coordinates.push_back(schedule_.rank_of(s));
    std::sort(coordinates.begin(), coordinates.end());
    if (std::adjacent_find(coordinates.begin(), coordinates.end()) != coordinates.end()) {
      throw std::runtime_error(std::string("[") + kOp + "] parameter '" + name +
                               "' is shared by two stages on one pipeline rank; split so that its holders run on "
                               "different ranks");
    }
    tied_.push_back({name, list});
  }
  for (int s : schedule_.stages_of(mesh.coordinate())) {
    stages_.push_back(all[static_cast<size_t>(s)]);
    indices_.push_back(s);
  }
}

std::vector<std::pair<std::string, DistTensor>> SequentialPipeline::named_parameters() const {
  std::vector<std::pair<std::string, DistTensor>> out;
  std::set<std::string> seen;
  for (const auto& stage : stages_) {
    for (const auto& [name, p] : stage->named_parameters()) {
      if (seen.insert(name).second) out.emplace_back(name, p);
    }
  }
  return out;
}

int64_t SequentialPipeline::num_parameters() const {
  int64_t mine = 0;
  for (size_t k = 0; k < stages_.size(); ++k) {
    for (const auto& named : stages_[k]->named_parameters()) {
      const bool copy = std::any_of(tied_.begin(), tied_.end(), [&](const TiedParameter& t) {
        return t.name == named.first && t.stages.front() != indices_[k];
      });
      if (!copy) mine += named.second.numel();
    }
  }
  return all_reduce(mesh_.group(), Tensor::scalar(mine)).item<int64_t>();
}

std::map<std::string, Tensor> SequentialPipeline::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& stage : stages_) {
    for (auto& [name, t] : stage->state_dict()) out.emplace(name, std::move(t));
  }
  return out;
}

void SequentialPipeline::load_state_dict(const std::map<std::string, Tensor>& state) {
  for (size_t k = 0; k < stages_.size(); ++k) {
    std::map<std::string, Tensor> mine;
    for (const auto& [name, _] : stages_[k]->named_parameters()) {
      const auto it = state.find(name);
      DT_CHECK_ARG(it != state.end(), kOp, "the state has no '", name, "', which stage ", indices_[k], " holds");
      mine.emplace(name, it->second);
    }
    stages_[k]->load_state_dict(mine);
  }
}

std::vector<DistTensor> SequentialPipeline::parameters() const {
  // A module two children share (a tied head) lists its parameters twice.
  std::vector<DistTensor> out;
  std::set<const DistTensor::Impl*> seen;
  for (const auto& s : stages_) {
    for (const DistTensor& p : s->parameters()) {
      if (seen.insert(p.impl().get()).second) out.push_back(p);
    }
  }
  return out;
}

std::unique_ptr<Pipeline> SequentialPipeline::make_pipeline(const std::vector<GradientSync*>& syncs, PipelineData data,
                                                            std::optional<Device> device) const {
  DT_CHECK_ARG(syncs.empty() || syncs.size() == stages_.size(), kOp, "expected one sync per local stage (",
               stages_.size(), ") or none, got ", syncs.size());
  std::vector<PipelineStage> stages;
  for (size_t k = 0; k < stages_.size(); ++k) {
    stages.push_back({stages_[k].get(), indices_[k], syncs.empty() ? nullptr : syncs[k], {}, device});
  }
  return std::make_unique<Pipeline>(mesh_, std::move(stages), schedule_, std::move(data), tied_);
}

}  // namespace dtensor::parallel
