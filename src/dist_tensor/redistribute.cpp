// DistTensor::redistribute, full_tensor, async redistribution and
// explain_redistribute: run or describe the planner's plan.
#include <sstream>

#include "comm/call_context.h"
#include "dist_tensor/dist_tensor_impl.h"
#include "dist_tensor/step_plan_hooks.h"
#include "dtensor/autograd.h"
#include "dtensor/dist_tensor.h"
#include "placements/cross_mesh.h"
#include "placements/planner.h"
#include "util/check.h"

namespace dtensor {

using redistribution::find_plan;
using redistribution::Plan;
using redistribution::StepContext;
using redistribution::transform_for;

namespace {

Placements checked_target(const DistTensor& t, const Placements& placements) {
  return redistribution::canonicalize(
      validate_placements(placements, t.mesh().ndim(), t.dim(), "redistribute"), t.dim());
}

DistTensor wrap(const Tensor& local, const DeviceMesh& mesh, const Placements& placements, const Shape& shape) {
  auto impl = std::make_shared<DistTensor::Impl>();
  impl->local = local;
  impl->mesh = mesh;
  impl->placements = placements;
  impl->global_shape = shape;
  return DistTensor(std::move(impl));
}

DistTensor wrap(const Tensor& local, const DistTensor& like, const Placements& placements) {
  return wrap(local, like.mesh(), placements, like.shape());
}

// The tensor on a rank outside its mesh: shape and layout, no data.
DistTensor elsewhere(const DeviceMesh& mesh, const Placements& placements, const Shape& shape, DType dtype) {
  return wrap(Tensor::empty({0}, dtype), mesh, placements, shape);
}

Placements partials_replicated(Placements placements) {
  for (Placement& p : placements) {
    if (p.is_partial()) p = Replicate();
  }
  return placements;
}

bool same_layout(const DistTensor& t, const Placements& to) {
  return redistribution::layout_key(t.placements(), t.mesh().shape(), t.dim()) ==
         redistribution::layout_key(to, t.mesh().shape(), t.dim());
}

StepContext context_for(const DistTensor& t, const redistribution::PlannedStep& step) {
  return StepContext{t.mesh(), t.shape(), t.dtype(), step.before, step.after, step.mesh_dim};
}

// "redistribute S(0)->R", the user-level call named by mismatched collectives' errors.
std::string call_name(const DistTensor& t, const Placements& to) {
  return "redistribute " + placements_to_string(t.placements()) + "->" + placements_to_string(to);
}

// Runs the plan's steps from `first` on, starting from `local` (a piece of `t`).
Tensor run_steps(Tensor local, const DistTensor& t, const Plan& plan, size_t first) {
  for (size_t i = first; i < plan.steps.size(); ++i) {
    local = transform_for(plan.steps[i].kind).apply(local, context_for(t, plan.steps[i]));
  }
  return local;
}

}  // namespace

// The backward of redistribute (DESIGN.md): the gradient goes back to the source
// layout, with a Partial source taken as Replicate (the gradient of every partial
// contribution is the full gradient). So S->R's backward reduce-scatters a Partial
// gradient (or chunks a Replicate one), R->S's all-gathers, P->R's is free.
// The gradient goes back to the source mesh too: a cross-mesh move's backward is
// the move the other way.
// Before moving back across meshes, the gradient takes the output's layout (Partial
// as Replicate): ranks outside the target mesh cannot know the layout in which the
// gradient arrives there, and the move's schedule must be the same on every rank.
static DistTensor record_redistribute(DistTensor out, const DistTensor& source) {
  if (!autograd::needs_grad({source})) return out;
  const Placements back = partials_replicated(source.placements());
  const DeviceMesh back_mesh = source.mesh();
  const bool across = !(out.mesh() == back_mesh);
  const Placements arrived = partials_replicated(out.placements());
  std::vector<DistTensor> outs{out};
  autograd::record("redistribute", {source}, outs, [back, back_mesh, across, arrived](const std::vector<DistTensor>& g) {
    const DistTensor grad = across ? g[0].redistribute(arrived) : g[0];
    return std::vector<DistTensor>{grad.redistribute(back_mesh, back)};
  });
  return outs[0];
}

DistTensor DistTensor::redistribute(const Placements& placements) const {
  const Placements to = checked_target(*this, placements);
  if (step_plan::active) step_plan::on_redistribute(*this, to);
  // Ranks outside the mesh take no part; their tensor only changes its layout.
  if (!mesh().is_member()) return record_redistribute(elsewhere(mesh(), to, shape(), dtype()), *this);
  if (same_layout(*this, to)) return record_redistribute(wrap(local_of(*this), *this, to), *this);
  std::shared_ptr<const Plan> plan = find_plan(this->placements(), to, shape(), mesh(), dtype());
  const std::string name = call_name(*this, to);
  comm::UserCallScope scope(name);
  return record_redistribute(wrap(run_steps(local_of(*this), *this, *plan, 0), *this, to), *this);
}

// Across meshes over one world: Partials are resolved on the source mesh, the
// blocks move point to point (cross_mesh.h: each rank sends exactly what a target
// rank needs and does not hold), and the target's Partials are formed locally.
DistTensor DistTensor::redistribute(const DeviceMesh& mesh, const Placements& placements) const {
  const char* op = "redistribute";
  DT_CHECK_ARG(defined(), op, "expected a defined DistTensor");
  DT_CHECK_ARG(mesh.defined(), op, "expected a defined target mesh");
  if (mesh == this->mesh()) return redistribute(placements);
  DT_CHECK_ARG(mesh.world() == this->mesh().world(), op, "the meshes are over different worlds: the tensor's mesh ",
               this->mesh().to_string(), " is over ", this->mesh().world().name(), ", the target mesh ",
               mesh.to_string(), " over ", mesh.world().name());
  const Placements to = redistribution::canonicalize(validate_placements(placements, mesh.ndim(), dim(), op), dim());
  if (step_plan::active) step_plan::on_keep(*this, "moved to another mesh");
  step_plan::InternalMoveScope own_moves;
  const Placements from_whole = partials_replicated(this->placements());
  const Placements to_whole = partials_replicated(to);
  // Named in the messages of its calls (mismatched, stuck or deadlocked).
  const std::string name = detail::concat("redistribute ", this->mesh().to_string(), " ",
                                          placements_to_string(this->placements()), " -> ", mesh.to_string(), " ",
                                          placements_to_string(to));
  comm::UserCallScope scope(name);
  DistTensor out;
  {
    NoGradGuard no_grad;  // one node for the whole move (record_redistribute)
    Tensor source;
    if (this->mesh().is_member()) source = local_of(redistribute(from_whole));
    const Tensor moved = redistribution::cross_mesh_transfer(source, dtype(), shape(), {this->mesh(), from_whole},
                                                             {mesh, to_whole});
    out = mesh.is_member() ? wrap(moved, mesh, to_whole, shape()) : elsewhere(mesh, to_whole, shape(), dtype());
    if (to_whole != to) out = out.redistribute(to);  // R -> P, local
  }
  return record_redistribute(out, *this);
}

Tensor DistTensor::full_tensor() const {
  DT_CHECK_ARG(defined() && mesh().is_member(), "full_tensor", "this rank is not in mesh ",
               defined() ? mesh().to_string() : std::string("(undefined)"),
               ": the tensor's data lives on the mesh's ranks (move it here with redistribute(mesh, placements))");
  return redistribute(Placements(mesh().ndim(), Replicate())).to_local();
}

// ---- async ---------------------------------------------------------------------------

struct PendingRedistribute::State {
  DistTensor source;
  Placements to;
  std::shared_ptr<const Plan> plan;
  redistribution::StartedStep first;
  bool consumed = false;
};

PendingRedistribute DistTensor::redistribute_async(const Placements& placements) const {
  auto state = std::make_shared<PendingRedistribute::State>();
  state->source = *this;
  state->to = checked_target(*this, placements);
  if (step_plan::active) step_plan::on_redistribute(*this, state->to);
  if (!same_layout(*this, state->to)) {
    state->plan = find_plan(this->placements(), state->to, shape(), mesh(), dtype());
    // A plan may have no steps (Partial -> Replicate on a mesh dim of size 1).
    if (!state->plan->steps.empty()) {
      const auto& step = state->plan->steps.front();
      const std::string name = call_name(*this, state->to);
      comm::UserCallScope scope(name);
      state->first = transform_for(step.kind).start(local_of(*this), context_for(*this, step));
    }
  }
  return PendingRedistribute(std::move(state));
}

DistTensor PendingRedistribute::wait() {
  DT_CHECK_ARG(state_ && !state_->consumed, "redistribute_async",
               "wait() called on a finished or empty handle");
  state_->consumed = true;
  const DistTensor& source = state_->source;
  if (!state_->plan) return wrap(local_of(source), source, state_->to);
  if (state_->plan->steps.empty()) return record_redistribute(wrap(local_of(source), source, state_->to), source);
  const std::string name = call_name(source, state_->to);
  comm::UserCallScope scope(name);
  const Tensor local = run_steps(state_->first.finish(), source, *state_->plan, 1);
  return record_redistribute(wrap(local, source, state_->to), source);
}

bool PendingRedistribute::is_first_step_completed() const {
  return !state_ || !state_->plan || state_->first.work.is_completed();
}

// ---- explain ---------------------------------------------------------------------------

int64_t RedistributePlan::bytes_sent() const {
  int64_t total = 0;
  for (const RedistributeStep& step : steps) total += step.bytes_sent;
  return total;
}

namespace {
std::string format_bytes(int64_t bytes) {
  std::ostringstream os;
  if (bytes >= (1 << 20)) {
    os << static_cast<double>(bytes) / (1 << 20) << " MiB";
  } else if (bytes >= 1024) {
    os << static_cast<double>(bytes) / 1024 << " KiB";
  } else {
    os << bytes << " B";
  }
  return os.str();
}
std::string format_seconds(double s) {
  std::ostringstream os;
  os.precision(3);
  if (s >= 1e-3) {
    os << s * 1e3 << " ms";
  } else {
    os << s * 1e6 << " us";
  }
  return os.str();
}
}  // namespace

std::string RedistributeStep::to_string() const {
  std::ostringstream os;
  os << transform_name(kind);
  if (kind == TransformKind::CrossMesh) {
    os << " " << meshes;
  } else if (mesh_dim >= 0) {
    os << " on mesh dim " << mesh_dim;
  } else {
    os << " over the whole mesh";
  }
  os << ": " << placements_to_string(before) << " -> " << placements_to_string(after);
  if (collective.empty()) {
    os << ", local";
  } else if (collective_calls == 0) {
    os << ", nothing to send from this rank";
  } else {
    os << ", " << collective_calls << " " << collective << ", sends " << format_bytes(bytes_sent);
  }
  os << ", predicted " << format_seconds(predicted_seconds);
  return os.str();
}

std::string RedistributePlan::to_string() const {
  std::ostringstream os;
  os << placements_to_string(from) << " -> " << placements_to_string(to) << ": ";
  if (steps.empty()) {
    os << "nothing to do\n";
    return os.str();
  }
  os << steps.size() << " step" << (steps.size() > 1 ? "s" : "") << ", sends "
     << format_bytes(bytes_sent()) << " from this rank, predicted " << format_seconds(predicted_seconds)
     << "\n";
  for (size_t i = 0; i < steps.size(); ++i) os << "  " << i + 1 << ". " << steps[i].to_string() << "\n";
  return os.str();
}

namespace {

// Appends the planned steps from `from` to `to` on `mesh` (validated, canonical);
// a rank outside the mesh issues nothing in them.
void append_steps(RedistributePlan& out, const Placements& from, const Placements& to, const Shape& shape,
                  const DeviceMesh& mesh, DType dtype) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  if (redistribution::layout_key(from, mesh.shape(), ndim) == redistribution::layout_key(to, mesh.shape(), ndim)) {
    return;
  }
  std::shared_ptr<const Plan> plan = find_plan(from, to, shape, mesh, dtype);
  for (const auto& step : plan->steps) {
    const StepContext ctx{mesh, shape, dtype, step.before, step.after, step.mesh_dim};
    const redistribution::Footprint fp =
        mesh.is_member() ? transform_for(step.kind).footprint(ctx) : redistribution::Footprint{};
    out.steps.push_back(RedistributeStep{step.kind, step.mesh_dim, step.before, step.after, fp.bytes_sent,
                                         fp.collective, fp.calls, step.predicted_seconds, ""});
  }
  out.predicted_seconds += plan->predicted_seconds;
}

}  // namespace

RedistributePlan explain_redistribute(const Placements& from, const Placements& to,
                                      const Shape& shape, const DeviceMesh& mesh, DType dtype) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  RedistributePlan out;
  out.from = redistribution::canonicalize(validate_placements(from, mesh.ndim(), ndim, "explain_redistribute"), ndim);
  out.to = redistribution::canonicalize(validate_placements(to, mesh.ndim(), ndim, "explain_redistribute"), ndim);
  append_steps(out, out.from, out.to, shape, mesh, dtype);
  return out;
}

RedistributePlan explain_redistribute(const Placements& from, const DeviceMesh& from_mesh, const Placements& to,
                                      const DeviceMesh& to_mesh, const Shape& shape, DType dtype) {
  const char* op = "explain_redistribute";
  if (from_mesh == to_mesh) return explain_redistribute(from, to, shape, from_mesh, dtype);
  DT_CHECK_ARG(from_mesh.world() == to_mesh.world(), op, "the meshes are over different worlds");
  const int64_t ndim = static_cast<int64_t>(shape.size());
  RedistributePlan out;
  out.from = redistribution::canonicalize(validate_placements(from, from_mesh.ndim(), ndim, op), ndim);
  out.to = redistribution::canonicalize(validate_placements(to, to_mesh.ndim(), ndim, op), ndim);
  const Placements from_whole = partials_replicated(out.from), to_whole = partials_replicated(out.to);
  append_steps(out, out.from, from_whole, shape, from_mesh, dtype);
  const std::string backend = from_mesh.world().backend();
  const CostModel model = CostModel::for_backend(backend, backend == "threads" ? from_mesh.world().size() : 1);
  const redistribution::CrossMeshCost cost =
      redistribution::cross_mesh_cost(dtype, shape, {from_mesh, from_whole}, {to_mesh, to_whole}, model);
  out.steps.push_back(RedistributeStep{TransformKind::CrossMesh, -1, from_whole, to_whole, cost.bytes_sent,
                                       "send", cost.messages, cost.predicted_seconds,
                                       "from " + from_mesh.to_string() + " to " + to_mesh.to_string()});
  out.predicted_seconds += cost.predicted_seconds;
  append_steps(out, to_whole, out.to, shape, to_mesh, dtype);
  return out;
}

}  // namespace dtensor
