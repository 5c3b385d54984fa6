// The pipeline: stage meshes, the Pipeline of one rank (checks, steps, tied
// parameters, gradient norm) and the gathered timeline. One step's runtime is in
// pipeline_runtime.cpp, its transfers in pipeline_wire.cpp.
#include "dtensor/parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dtensor/ops.h"
#include "dtensor/optim.h"
#include "parallel/pipeline_runtime.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "pipeline";

}  // namespace

std::vector<int64_t> micro_batch_rows(int64_t rows, int64_t micro_batches) {
  DT_CHECK_ARG(micro_batches >= 1 && micro_batches <= rows, "micro_batch_rows", "expected between 1 and ", rows,
               " micro-batches of ", rows, " rows (each at least one row), got ", micro_batches);
  std::vector<int64_t> sizes;
  sizes.reserve(static_cast<size_t>(micro_batches));
  for (int64_t i = 0; i < micro_batches; ++i)
    sizes.push_back(rows / micro_batches + (i < rows % micro_batches ? 1 : 0));
  return sizes;
}

// ---- PipelineMesh ----------------------------------------------------------------------------

PipelineMesh::PipelineMesh(const DeviceMesh& mesh, const std::string& pp_dim) : mesh_(mesh), pp_dim_(pp_dim) {
  DT_CHECK_ARG(mesh.defined() && mesh.is_member(), kOp, "expected a mesh this rank belongs to");
  const std::vector<std::string>& names = mesh.names();
  DT_CHECK_ARG(std::find(names.begin(), names.end(), pp_dim) != names.end(), kOp, "the mesh ", mesh.to_string(),
               " has no '", pp_dim, "' dim: a pipeline runs its stages along it (e.g. ", pp_dim, "=2,",
               mesh.to_string(), ")");
  const int d = mesh.dim_index(pp_dim);
  Shape rest;
  std::vector<std::string> rest_names;
  for (int k = 0; k < mesh.ndim(); ++k) {
    if (k == d) continue;
    rest.push_back(mesh.size(k));
    rest_names.push_back(names[static_cast<size_t>(k)]);
  }
  if (rest.empty()) {
    rest = {1};
    rest_names = {"stage"};
  }
  const int p = static_cast<int>(mesh.size(d));
  std::vector<std::vector<int>> ranks(static_cast<size_t>(p));
  std::vector<int64_t> coordinate(static_cast<size_t>(mesh.ndim()), 0);
  for (int64_t linear = 0; linear < mesh.size(); ++linear) {
    int64_t rem = linear;
    for (int k = mesh.ndim() - 1; k >= 0; --k) {
      coordinate[static_cast<size_t>(k)] = rem % mesh.size(k);
      rem /= mesh.size(k);
    }
    ranks[static_cast<size_t>(coordinate[static_cast<size_t>(d)])].push_back(mesh.rank_at(coordinate));
  }
  for (int c = 0; c < p; ++c) {
    stage_meshes_.push_back(DeviceMesh::from_ranks(mesh.world(), ranks[static_cast<size_t>(c)], rest, rest_names));
  }
}

int PipelineMesh::size() const { return static_cast<int>(mesh_.size(pp_dim_)); }
int PipelineMesh::coordinate() const { return static_cast<int>(mesh_.coordinate(mesh_.dim_index(pp_dim_))); }
const DeviceMesh& PipelineMesh::stage_mesh() const { return stage_meshes_.at(static_cast<size_t>(coordinate())); }
const DeviceMesh& PipelineMesh::stage_mesh(int c) const {
  DT_CHECK_ARG(c >= 0 && c < size(), kOp, "pipeline coordinate ", c, " is outside ", pp_dim_, "=", size());
  return stage_meshes_[static_cast<size_t>(c)];
}
const Group& PipelineMesh::group() const { return mesh_.group(pp_dim_); }

// ---- Pipeline -----------------------------------------------------------------------------------

Pipeline::Pipeline(const PipelineMesh& mesh, std::vector<PipelineStage> stages, Schedule schedule, PipelineData data,
                   std::vector<TiedParameter> tied)
    : mesh_(mesh),
      schedule_(std::move(schedule)),
      data_(std::move(data)),
      stages_(std::move(stages)),
      tied_(std::move(tied)) {
  DT_CHECK_ARG(schedule_.ranks == mesh_.size(), kOp, "the schedule ", schedule_.name, " runs on ", schedule_.ranks,
               " pipeline ranks, the mesh ", mesh_.mesh().to_string(), " has ", mesh_.pp_dim(), "=", mesh_.size());
  check_schedule(schedule_);
  const int me = mesh_.coordinate();
  std::vector<int> want = schedule_.stages_of(me), got;
  for (const PipelineStage& s : stages_) {
    DT_CHECK_ARG(s.module, kOp, "stage ", s.stage, " has no module");
    got.push_back(s.stage);
    const std::vector<DistTensor> params = s.module->parameters();
    for (const DistTensor& p : params) {
      DT_CHECK_ARG(p.mesh() == mesh_.stage_mesh(), kOp, "stage ", s.stage, "'s parameters must live on its stage mesh ",
                   mesh_.stage_mesh().to_string(), " (the ranks at ", mesh_.pp_dim(), " coordinate ", me,
                   "), got one on ", p.mesh().to_string());
    }
  }
  std::sort(got.begin(), got.end());
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (size_t k = 0; k < v.size(); ++k) out += (k ? (k + 1 == v.size() ? " and " : ", ") : "") + std::to_string(v[k]);
    return out.empty() ? std::string("none") : out;
  };
  DT_CHECK_ARG(got == want, kOp, "pipeline rank ", me, " runs stage", want.size() > 1 ? "s " : " ", list(want), " of ",
               schedule_.name, " (", schedule_.stages, " stages on ", schedule_.ranks, " ranks), got stages ",
               list(got));
  const bool first = me == schedule_.rank_of(0), last = me == schedule_.rank_of(schedule_.stages - 1);
  DT_CHECK_ARG(!first || data_.inputs, kOp, "the first stage needs PipelineData::inputs");
  DT_CHECK_ARG(!last || !schedule_.has_backward() || data_.loss, kOp, "the last stage needs PipelineData::loss");
  DT_CHECK_ARG(data_.weights.empty() || static_cast<int>(data_.weights.size()) == schedule_.micro_batches, kOp,
               "expected one loss weight per micro-batch (", schedule_.micro_batches, "), got ", data_.weights.size());
  for (const TiedParameter& t : tied_) {
    DT_CHECK_ARG(t.stages.size() >= 2, kOp, "tied parameter '", t.name, "' needs at least two stages, got ",
                 t.stages.size());
    DT_CHECK_ARG(t.names.empty() || t.names.size() == t.stages.size(), kOp, "tied parameter '", t.name,
                 "': expected one name per holder (", t.stages.size(), ") or none, got ", t.names.size());
    bool here = false;
    for (int s : t.stages) {
      DT_CHECK_ARG(s >= 0 && s < schedule_.stages, kOp, "tied parameter '", t.name, "' names stage ", s, " of ",
                   schedule_.stages);
      if (schedule_.rank_of(s) != me) continue;
      here = true;
      const PipelineStage* holder = nullptr;
      for (const PipelineStage& st : stages_) holder = st.stage == s ? &st : holder;
      bool found = false;
      for (const auto& [name, _] : holder->module->named_parameters()) found |= name == t.name_in(s);
      DT_CHECK_ARG(found, kOp, "tied parameter '", t.name, "': stage ", s, " has no parameter named '", t.name_in(s),
                   "'");
    }
    tied_groups_.push_back(mesh_.group().split(here ? 0 : -1, me));
  }
}

Pipeline::~Pipeline() = default;

const std::string& TiedParameter::name_in(int stage) const {
  if (names.empty()) return name;
  for (size_t k = 0; k < stages.size() && k < names.size(); ++k) {
    if (stages[k] == stage) return names[k];
  }
  return name;
}

double Pipeline::run(int64_t step, const std::function<DistTensor(const DistTensor&)>& to_backward,
                     std::optional<DType> compute_dtype) {
  DT_CHECK_ARG(schedule_.has_backward(), kOp, "the ", schedule_.name, " schedule has no backward; use forward()");
  Runtime rt(*this, step, true, to_backward, compute_dtype);
  return rt.run();
}

double Pipeline::train_step(int64_t step, std::optional<DType> compute_dtype) {
  return run(step, nullptr, compute_dtype);
}

std::vector<DistTensor> Pipeline::forward(int64_t step, std::optional<DType> compute_dtype) {
  DT_CHECK_ARG(!schedule_.has_backward(), kOp, "forward() runs forward-only schedules, got ", schedule_.name);
  Runtime rt(*this, step, false, nullptr, compute_dtype);
  rt.run();
  return rt.outputs;
}

Device PipelineStage::compute_device() const {
  if (device) return *device;
  const std::vector<DistTensor> params = module->parameters();
  return params.empty() ? Device::cpu() : params.front().device();
}

void Pipeline::finish_gradient_sync() {
  for (const PipelineStage& s : stages_) {
    if (s.sync) s.sync->finish_gradient_sync();
  }
  const int me = mesh_.coordinate();
  for (size_t k = 0; k < tied_.size(); ++k) {
    const TiedParameter& t = tied_[k];
    std::vector<DistTensor> copies;
    for (const PipelineStage& s : stages_) {
      if (std::find(t.stages.begin(), t.stages.end(), s.stage) == t.stages.end()) continue;
      for (const auto& [name, p] : s.module->named_parameters()) {
        if (name == t.name_in(s.stage)) copies.push_back(p);
      }
    }
    if (copies.empty()) continue;
    // Summed in the parameter's layout, which every copy shares.
    Tensor sum;
    for (const DistTensor& p : copies) {
      const DistTensor g = gradient_in_param_layout(p);
      const Tensor local = g.defined() ? g.to_local() : Tensor::zeros(p.to_local().shape(), p.dtype(), p.device());
      sum = sum.defined() ? add(sum, local) : local.clone();
    }
    const Group& g = tied_groups_[k];
    if (g.size() > 1) {
      if (!tied_checked_) {
        // Every holder must hold the same piece: compare sizes and layouts once.
        const std::string layout = placements_to_string(copies[0].placements()) + " " + shape_to_string(sum.shape());
        const std::vector<Tensor> all =
            all_gather_list(g, Tensor::from_vector<int64_t>(std::vector<int64_t>(layout.begin(), layout.end()),
                                                            {static_cast<int64_t>(layout.size())}));
        for (const Tensor& other : all) {
          const std::vector<int64_t> chars = other.to_vector<int64_t>();
          const std::string theirs(chars.begin(), chars.end());
          DT_CHECK_ARG(theirs == layout, kOp, "tied parameter '", t.name, "' is held as ", layout, " on pipeline rank ",
                       me, " and as ", theirs, " on another: wrap its holders alike");
        }
      }
      all_reduce_(g, sum, ReduceOp::Sum);
    }
    for (const DistTensor& p : copies) {
      p.set_grad(DistTensor::from_local(sum.clone(), p.mesh(), p.placements(), p.shape()));
    }
  }
  tied_checked_ = true;
}

double Pipeline::grad_norm(const std::vector<DistTensor>& params) {
  // The copies of tied parameters other than their first holder's count nowhere.
  std::set<const DistTensor::Impl*> duplicates;
  for (const TiedParameter& t : tied_) {
    for (const PipelineStage& s : stages_) {
      if (s.stage == t.stages.front() || std::find(t.stages.begin(), t.stages.end(), s.stage) == t.stages.end()) {
        continue;
      }
      for (const auto& [name, p] : s.module->named_parameters()) {
        if (name == t.name_in(s.stage)) duplicates.insert(p.impl().get());
      }
    }
  }
  std::vector<DistTensor> counted;
  for (const DistTensor& p : params) {
    if (!duplicates.count(p.impl().get())) counted.push_back(p);
  }
  const double stage_norm = dtensor::grad_norm(counted);
  Tensor total = Tensor::full({1}, stage_norm * stage_norm, DType::F64);
  all_reduce_(mesh_.group(), total, ReduceOp::Sum);
  return std::sqrt(total.item<double>());
}

Timeline Pipeline::gather_timeline(const std::string& title) const {
  std::vector<double> flat{step_start_, static_cast<double>(entries_.size())};
  for (const TimelineEntry& e : entries_) {
    flat.insert(flat.end(), {static_cast<double>(e.action.kind), static_cast<double>(e.action.stage),
                             static_cast<double>(e.action.micro), e.start, e.end});
  }
  const std::vector<Tensor> all =
      all_gather_list(mesh_.group(), Tensor::from_vector<double>(flat, {static_cast<int64_t>(flat.size())}));
  Timeline t;
  t.title = title.empty() ? schedule_.name : title;
  t.ranks = static_cast<int>(all.size());
  double origin = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    const double start = all[r].to_vector<double>()[0];
    origin = r == 0 ? start : std::min(origin, start);
  }
  t.entries.resize(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    const std::vector<double> v = all[r].to_vector<double>();
    const double shift = v[0] - origin;
    for (size_t k = 2; k + 5 <= v.size(); k += 5) {
      const Action a{static_cast<ActionKind>(static_cast<int>(v[k])), static_cast<int>(v[k + 1]),
                     static_cast<int>(v[k + 2])};
      t.entries[r].push_back({a, v[k + 3] + shift, v[k + 4] + shift});
    }
  }
  return t;
}

}  // namespace dtensor::parallel
