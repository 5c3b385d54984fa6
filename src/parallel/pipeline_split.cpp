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
  // Every stage's parameters (every rank holds the whole model), to find the ties.
  std::map<const void*, std::vector<std::pair<int, std::string>>> holders;
  for (int s = 0; s < stages; ++s) {
    const StageLayers& r = split_[static_cast<size_t>(s)];
    const std::shared_ptr<nn::Sequential> slice =
        model->slice(static_cast<size_t>(r.first), static_cast<size_t>(r.end));
    for (const auto& [name, p] : slice->named_parameters()) {
      auto& list = holders[p.impl().get()];
      if (list.empty() || list.back().first != s) list.emplace_back(s, name);
    }
  }
  for (const auto& [_, list] : holders) {
    if (list.size() < 2) continue;
    TiedParameter tie{list.front().second, {}};
    std::vector<int> coordinates;
    bool renamed = false;
    for (const auto& [s, name] : list) {
      tie.stages.push_back(s);
      tie.names.push_back(name);
      renamed |= name != tie.name;
      coordinates.push_back(schedule_.rank_of(s));
    }
    if (!renamed) tie.names.clear();
    std::sort(coordinates.begin(), coordinates.end());
    if (std::adjacent_find(coordinates.begin(), coordinates.end()) != coordinates.end()) {
      throw std::runtime_error(std::string("[") + kOp + "] parameter '" + tie.name +
                               "' is shared by two stages on one pipeline rank; split so that its holders run on "
                               "different ranks");
    }
    tied_.push_back(std::move(tie));
  }
  for (int s : schedule_.stages_of(mesh.coordinate())) {
    const StageLayers& r = split_[static_cast<size_t>(s)];
    stages_.push_back(model->slice(static_cast<size_t>(r.first), static_cast<size_t>(r.end)));
    indices_.push_back(s);
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

std::unique_ptr<Pipeline> SequentialPipeline::make_pipeline(const std::vector<GradientSync*>& syncs,
                                                            PipelineData data) const {
  DT_CHECK_ARG(syncs.empty() || syncs.size() == stages_.size(), kOp, "expected one sync per local stage (",
               stages_.size(), ") or none, got ", syncs.size());
  std::vector<PipelineStage> stages;
  for (size_t k = 0; k < stages_.size(); ++k) {
    stages.push_back({stages_[k].get(), indices_[k], syncs.empty() ? nullptr : syncs[k], {}, std::nullopt});
  }
  return std::make_unique<Pipeline>(mesh_, std::move(stages), schedule_, std::move(data), tied_);
}

}  // namespace dtensor::parallel
