// Strategy enumeration (einsum rule), choice by cost, and the per-rank decision cache.
#include "dist_tensor/dispatch.h"
#include "dtensor/autograd.h"
#include "dtensor/dispatch_trace.h"
#include "dtensor/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <unordered_map>

#include "dist_tensor/dist_tensor_impl.h"
#include "dist_tensor/step_plan_hooks.h"
#include "placements/planner.h"
#include "util/check.h"

namespace dtensor::dispatch {
namespace {

// The placements one mesh dim gives each input and the output.
struct MeshDimOption {
  std::vector<Placement> inputs;
  Placement output;
};

// The output's global shape from the spec: each letter's size where an input has it.
Shape output_shape(const EinsumSpec& spec, const std::vector<DistTensor>& inputs) {
  Shape shape(spec.output.size(), 1);
  for (size_t d = 0; d < spec.output.size(); ++d) {
    for (size_t j = 0; j < inputs.size(); ++j) {
      const size_t pos = spec.inputs[j].find(spec.output[d]);
      if (spec.output[d] != '_' && pos != std::string::npos) {
        shape[d] = inputs[j].size(static_cast<int64_t>(pos));
        break;
      }
    }
  }
  return shape;
}

std::vector<MeshDimOption> options_for_mesh_dim(const EinsumSpec& spec, const std::vector<DistTensor>& inputs,
                                                int mesh_dim, int64_t out_numel) {
  const size_t n = inputs.size();
  std::vector<MeshDimOption> options;
  options.push_back({std::vector<Placement>(n, Replicate()), Replicate()});
  if (inputs[0].mesh().size(mesh_dim) == 1) return options;  // nothing to split

  std::string letters;
  for (const std::string& in : spec.inputs) {
    for (char c : in) {
      if (c != '_' && letters.find(c) == std::string::npos && spec.unshardable.find(c) == std::string::npos) {
        letters += c;
      }
    }
  }
  for (char letter : letters) {
    MeshDimOption option{std::vector<Placement>(n, Replicate()), Replicate()};
    for (size_t j = 0; j < n; ++j) {
      const size_t pos = spec.inputs[j].find(letter);
      if (pos != std::string::npos) option.inputs[j] = Shard(static_cast<int64_t>(pos));
    }
    const size_t out_pos = spec.output.find(letter);
    option.output = out_pos == std::string::npos ? Partial(spec.contraction) : Shard(static_cast<int64_t>(out_pos));
    options.push_back(option);
  }

  // Partial pass-through, offered only where an input already is Partial there,
  // and only when the output is no larger than that input: a Partial is resolved
  // at the smallest tensor it passes through (reduce at the cheapest point), so an
  // op that would grow it (a Partial gradient times a gathered weight, an expand)
  // reduces its input first.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    auto is_partial = [&](size_t j) {
      const Placement& p = inputs[j].placements()[mesh_dim];
      const bool allowed = spec.partial_inputs.empty() || spec.partial_inputs[j];
      return allowed && p.is_partial() && p.reduce_op() == op;
    };
    if (spec.partial == PartialRule::AllSame) {
      int64_t largest = -1;
      for (size_t j = 0; j < n; ++j) {
        if (is_partial(j)) largest = std::max(largest, inputs[j].numel());
      }
      if (largest >= out_numel) options.push_back({std::vector<Placement>(n, Partial(op)), Partial(op)});
    } else if (spec.partial == PartialRule::OneOf) {
      for (size_t j = 0; j < n; ++j) {
        if (!is_partial(j) || inputs[j].numel() < out_numel) continue;
        MeshDimOption option{std::vector<Placement>(n, Replicate()), Partial(op)};
        option.inputs[j] = Partial(op);
        options.push_back(option);
      }
    }
  }
  return options;
}

// Where several mesh dims shard one letter, every input with the letter and the
// output must nest them in one order, or their blocks do not line up. The order
// comes from an input already sharded by exactly those mesh dims (keeping it
// costs that input nothing: FSDP over TP), else it is the default (mesh dim 0
// outermost); inputs arriving in another order are moved to it.
void unify_nesting(Strategy& s, const EinsumSpec& spec, const std::vector<DistTensor>& inputs) {
  const size_t mesh_ndim = s.output.size();
  std::string letter_of(mesh_ndim, '\0');  // the letter each mesh dim shards
  for (size_t m = 0; m < mesh_ndim; ++m) {
    for (size_t j = 0; j < inputs.size() && !letter_of[m]; ++j) {
      const Placement& p = s.inputs[j][m];
      if (p.is_shard()) letter_of[m] = spec.inputs[j][static_cast<size_t>(p.dim())];
    }
  }
  std::string done;
  for (char letter : letter_of) {
    if (!letter || done.find(letter) != std::string::npos) continue;
    done += letter;
    if (std::count(letter_of.begin(), letter_of.end(), letter) < 2) continue;
    std::vector<int> order(mesh_ndim, 0);
    for (size_t j = 0; j < inputs.size(); ++j) {
      const size_t pos = spec.inputs[j].find(letter);
      if (pos == std::string::npos) continue;
      const Placements& have = inputs[j].placements();
      bool same_splitters = true;
      for (size_t m = 0; m < mesh_ndim; ++m) {
        same_splitters &= have[m].is_shard(static_cast<int64_t>(pos)) == (letter_of[m] == letter);
      }
      if (!same_splitters) continue;
      for (size_t m = 0; m < mesh_ndim; ++m) order[m] = have[m].order();
      break;
    }
    auto apply = [&](Placements& placements, size_t pos) {
      for (size_t m = 0; m < mesh_ndim; ++m) {
        if (letter_of[m] == letter) placements[m] = Shard(static_cast<int64_t>(pos), order[m]);
      }
    };
    for (size_t j = 0; j < inputs.size(); ++j) {
      const size_t pos = spec.inputs[j].find(letter);
      if (pos != std::string::npos) apply(s.inputs[j], pos);
    }
    const size_t out_pos = spec.output.find(letter);
    if (out_pos != std::string::npos) apply(s.output, out_pos);
  }
}

// What a strategy that leaves its output Partial defers, for the mesh dims where it
// creates the Partial (a contraction over a sharded letter; a Partial passed through
// from an input was already owed): resolving a Partial costs an all-reduce where a
// sharded output would cost an all-gather, twice the bytes; the difference in
// bandwidth is charged. Latency is not: a Partial that later ops absorb or shrink is
// reduced once, maybe never at this size, so only where it is reduced (how many
// bytes) depends on this choice. This makes x @ w with w sharded on the contracted
// dim move a small w (an all-to-all) rather than leave a large activation Partial,
// while a vocab-parallel lookup (a large table, a smaller activation) stays Partial.
double deferred_reduction_cost(const Strategy& s, const Shape& out_shape, const std::vector<DistTensor>& inputs) {
  const DeviceMesh& mesh = inputs[0].mesh();
  // The planner's model (placements/planner.cpp): threads ranks share one host.
  const std::string backend = mesh.group().backend();
  const CostModel model = CostModel::for_backend(backend, backend == "threads" ? mesh.size() : 1);
  double seconds = 0;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (!s.output[m].is_partial() || mesh.size(m) == 1) continue;
    bool passed_through = false;
    for (const Placements& in : s.inputs) passed_through |= in[m].is_partial();
    if (passed_through) continue;
    const int64_t bytes = shape_numel(local_shape(out_shape, mesh.shape(), s.output, std::vector<int64_t>(mesh.ndim(), 0))) *
                          static_cast<int64_t>(dtype_size(inputs[0].dtype()));
    seconds += (model.all_reduce(bytes, mesh.size(m)) - model.all_reduce(0, mesh.size(m))) -
               (model.all_gather(bytes, mesh.size(m)) - model.all_gather(0, mesh.size(m)));
  }
  return seconds;
}

double move_cost(const DistTensor& t, const Placements& from, const Placements& to) {
  return move_seconds(t.shape(), t.dtype(), t.mesh(), from, to);
}

// ---- the per-rank cache ------------------------------------------------------------

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : key) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

thread_local std::unordered_map<std::vector<int64_t>, Strategy, KeyHash> strategy_cache;
constexpr size_t kMaxCachedStrategies = 1 << 14;
thread_local DispatchTrace* active_trace = nullptr;

void encode(std::vector<int64_t>& key, const Placements& placements) {
  for (const Placement& p : placements) {
    key.push_back(static_cast<int64_t>(p.kind()) | (p.dim() << 4) | (static_cast<int64_t>(p.order()) << 20) |
                  (static_cast<int64_t>(p.reduce_op()) << 28));
  }
}

bool debug_dispatch() {
  static const bool on = [] {
    const char* env = std::getenv("DTENSOR_DEBUG");
    return env && std::string_view(env).find("dispatch") != std::string_view::npos;
  }();
  return on;
}

}  // namespace

double move_seconds(const Shape& shape, DType dtype, const DeviceMesh& mesh, const Placements& from,
                    const Placements& to, int* steps) {
  if (steps) *steps = 0;
  if (from == to) return 0;
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const Placements source = redistribution::canonicalize(from, ndim);
  const Placements target = redistribution::canonicalize(to, ndim);
  if (redistribution::layout_key(source, mesh.shape(), ndim) ==
      redistribution::layout_key(target, mesh.shape(), ndim)) {
    return 0;
  }
  const auto plan = redistribution::find_plan(source, target, shape, mesh, dtype);
  if (steps) *steps = static_cast<int>(plan->steps.size());
  return plan->predicted_seconds;
}

std::vector<Strategy> einsum_strategies(const EinsumSpec& spec, const std::vector<DistTensor>& inputs,
                                        const std::optional<Shape>& known_out_shape) {
  const int mesh_ndim = inputs[0].mesh().ndim();
  const Shape out_shape = known_out_shape ? *known_out_shape : output_shape(spec, inputs);
  std::vector<std::vector<MeshDimOption>> per_dim;
  for (int m = 0; m < mesh_ndim; ++m) per_dim.push_back(options_for_mesh_dim(spec, inputs, m, shape_numel(out_shape)));
  std::vector<Strategy> strategies{Strategy{std::vector<Placements>(inputs.size()), {}}};
  for (int m = 0; m < mesh_ndim; ++m) {
    std::vector<Strategy> next;
    for (const Strategy& prefix : strategies) {
      for (const MeshDimOption& option : per_dim[m]) {
        Strategy s = prefix;
        for (size_t j = 0; j < inputs.size(); ++j) s.inputs[j].push_back(option.inputs[j]);
        s.output.push_back(option.output);
        next.push_back(std::move(s));
      }
    }
    strategies = std::move(next);
  }
  // Several mesh dims may not give one input Partials of different kinds.
  std::erase_if(strategies, [](const Strategy& s) { return !redistribution::partials_compatible(s.output); });
  for (Strategy& s : strategies) {
    unify_nesting(s, spec, inputs);
    s.deferred_seconds = grad_enabled() ? deferred_reduction_cost(s, out_shape, inputs) : 0.0;
  }
  return strategies;
}

namespace {
bool gets_gradient(const DistTensor& t) { return t.requires_grad() && grad_enabled(); }
}  // namespace

size_t choose_strategy(const std::vector<Strategy>& strategies, const std::vector<DistTensor>& inputs) {
  DT_CHECK_SUPPORTED(!strategies.empty(), "dispatch", "the op offered no sharding strategy");
  // Costs within 1% (or 10 ns) are a tie: then fewer changed inputs win, then the
  // output with fewer replicated mesh dims (less memory, no later re-sharding), then
  // the first listed.
  auto replicated = [](const Placements& p) {
    return std::count_if(p.begin(), p.end(), [](const Placement& x) { return x.is_replicate(); });
  };
  // An input that will receive a gradient also pays for its gradient's way back: each
  // op's backward runs against the inputs as they were, so a gradient computed in the
  // moved layout travels back. Priced as the larger of the move and its reverse plan:
  // an all-to-all comes back as an all-to-all, an all-gather S -> R as a
  // reduce-scatter of a Partial gradient (the reverse plan, R -> S, would say free),
  // a free chunk R -> S as an all-gather, a move to a Partial (a bias added to a
  // Partial) as itself (its gradient is not reduced). Without this, moving an
  // activation and a weight looks cheaper than Megatron's row-parallel Partial
  // output, and backward then pays both moves again.
  auto way_back = [&](size_t j, const Placements& moved, double forward) {
    if (!gets_gradient(inputs[j]) || forward == 0) return 0.0;
    if (std::any_of(moved.begin(), moved.end(), [](const Placement& p) { return p.is_partial(); })) return forward;
    return std::max(forward, move_cost(inputs[j], moved, inputs[j].placements()));
  };
  size_t best = 0;
  double best_cost = 0;
  int best_changes = 0;
  for (size_t i = 0; i < strategies.size(); ++i) {
    double cost = strategies[i].deferred_seconds;
    int changes = 0;
    for (size_t j = 0; j < inputs.size(); ++j) {
      const double forward = move_cost(inputs[j], inputs[j].placements(), strategies[i].inputs[j]);
      cost += forward + way_back(j, strategies[i].inputs[j], forward);
      changes += strategies[i].inputs[j] != inputs[j].placements();
    }
    const double tolerance = std::max(1e-8, 0.01 * std::min(cost, best_cost));
    const bool tie = i > 0 && std::abs(cost - best_cost) <= tolerance;
    const bool better = i == 0 || (!tie && cost < best_cost) ||
                        (tie && (changes < best_changes ||
                                 (changes == best_changes &&
                                  replicated(strategies[i].output) < replicated(strategies[best].output))));
    if (better) {
      best = i;
      best_cost = cost;
      best_changes = changes;
    }
  }
  return best;
}

namespace {
thread_local MoveMemo* active_memo = nullptr;
}  // namespace

MoveMemo::MoveMemo() : previous_(active_memo) { active_memo = this; }
MoveMemo::~MoveMemo() { active_memo = previous_; }
MoveMemo* MoveMemo::active() { return active_memo; }

const Tensor* MoveMemo::find(const DistTensor& t, const Placements& placements) const {
  for (const Entry& e : entries_) {
    if (e.source.impl() == t.impl() && e.placements == placements) return &e.moved;
  }
  return nullptr;
}

void MoveMemo::add(const DistTensor& t, const Placements& placements, const Tensor& moved) {
  entries_.push_back({t, placements, moved});
}

std::vector<Tensor> local_inputs(const Strategy& strategy, const std::vector<DistTensor>& inputs) {
  NoGradGuard no_grad;
  std::vector<Tensor> locals;
  locals.reserve(inputs.size());
  for (size_t j = 0; j < inputs.size(); ++j) {
    const Placements& want = strategy.inputs[j];
    if (inputs[j].placements() == want) {
      locals.push_back(local_of(inputs[j]));
      continue;
    }
    if (active_memo) {
      if (const Tensor* moved = active_memo->find(inputs[j], want)) {
        locals.push_back(*moved);
        continue;
      }
    }
    step_plan::InternalMoveScope own_move;  // the op's own move, priced with the op
    locals.push_back(local_of(inputs[j].redistribute(want)));
    if (active_memo) active_memo->add(inputs[j], want, locals.back());
  }
  return locals;
}

namespace detail {

thread_local std::vector<int64_t> scratch_key;

const Strategy* lookup(std::string_view op, const std::vector<int64_t>& attributes,
                       const std::vector<DistTensor>& inputs) {
  std::vector<int64_t>& key = scratch_key;
  key.clear();
  key.push_back(static_cast<int64_t>(std::hash<std::string_view>()(op)));
  key.insert(key.end(), attributes.begin(), attributes.end());
  key.push_back(grad_enabled());  // deferred Partial costs are charged only then
  const DeviceMesh& mesh = inputs[0].mesh();
  key.insert(key.end(), mesh.shape().begin(), mesh.shape().end());
  for (const DistTensor& t : inputs) {
    key.push_back(-1 - static_cast<int64_t>(t.dtype()));
    key.insert(key.end(), t.shape().begin(), t.shape().end());
    encode(key, t.placements());
    key.push_back(gets_gradient(t));  // its moves are priced with their way back
  }
  auto it = strategy_cache.find(key);
  if (it == strategy_cache.end()) return nullptr;
  if (active_trace) active_trace->add(describe(op, it->second, inputs));
  return &it->second;
}

const Strategy& insert(std::string_view op, std::vector<Strategy> strategies,
                       const std::vector<DistTensor>& inputs) {
  const size_t chosen = choose_strategy(strategies, inputs);
  const DeviceMesh& mesh = inputs[0].mesh();
  if (debug_dispatch() && mesh.linear_index() == 0) std::cerr << describe(op, strategies[chosen], inputs) << "\n";
  if (active_trace) active_trace->add(describe(op, strategies[chosen], inputs));
  // Programs whose shapes keep changing (variable lengths) would grow the cache
  // without bound; starting over costs one strategy search per op and layout.
  if (strategy_cache.size() >= kMaxCachedStrategies) strategy_cache.clear();
  return strategy_cache.emplace(scratch_key, std::move(strategies[chosen])).first->second;
}

const Strategy& planned(std::string_view op, const std::vector<int64_t>& attributes,
                        const std::vector<DistTensor>& inputs, const Builder& build) {
  return step_plan::dispatch(op, attributes, inputs, build);
}

void trace(std::string_view op, const Strategy& s, const std::vector<DistTensor>& inputs, std::string_view note) {
  if (active_trace) active_trace->add(describe(op, s, inputs) + std::string(note));
}

}  // namespace detail

DistTensor wrap(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                const Shape& global_shape) {
  auto impl = std::make_shared<DistTensor::Impl>();
  impl->local = local;
  impl->mesh = mesh;
  impl->placements = placements;
  impl->global_shape = global_shape;
  if (step_plan::active) step_plan::on_wrap(impl);
  return DistTensor(std::move(impl));
}

const DeviceMesh& common_mesh(const std::vector<DistTensor>& inputs, const char* op) {
  DT_CHECK_ARG(!inputs.empty() && inputs[0].defined(), op, "expected defined DistTensors");
  const DeviceMesh& mesh = inputs[0].mesh();
  DT_CHECK_ARG(mesh.is_member(), op, "this rank is not in mesh ", mesh.to_string(),
               ", where the operands live: compute on their mesh's ranks, or move them here with "
               "redistribute(mesh, placements)");
  for (size_t j = 1; j < inputs.size(); ++j) {
    DT_CHECK_ARG(inputs[j].defined(), op, "input ", j, " is an undefined DistTensor");
    DT_CHECK_ARG(inputs[j].mesh() == mesh, op, "operands live on different meshes: input 0 on ",
                 mesh.to_string(), ", input ", j, " on ", inputs[j].mesh().to_string());
  }
  return mesh;
}

std::string broadcast_letters(const Shape& input, const Shape& output) {
  std::string letters;
  const size_t lead = output.size() - input.size();
  for (size_t j = 0; j < input.size(); ++j) {
    const bool broadcast = input[j] == 1 && output[lead + j] != 1;
    letters += broadcast ? '_' : static_cast<char>('a' + lead + j);
  }
  return letters;
}

std::string describe(std::string_view op, const Strategy& s, const std::vector<DistTensor>& inputs) {
  std::ostringstream os;
  os << "[dispatch] " << op << ":";
  double total = 0;
  for (size_t j = 0; j < inputs.size(); ++j) {
    const double c = move_cost(inputs[j], inputs[j].placements(), s.inputs[j]);
    total += c;
    os << " in" << j << " " << shape_to_string(inputs[j].shape()) << " "
       << placements_to_string(inputs[j].placements());
    if (s.inputs[j] != inputs[j].placements()) os << "->" << placements_to_string(s.inputs[j]);
  }
  os << " => out " << placements_to_string(s.output) << ", redistribution cost " << total * 1e6 << " us";
  if (s.deferred_seconds > 0) os << " (+" << s.deferred_seconds * 1e6 << " us to resolve the Partial output)";
  return os.str();
}

size_t strategy_cache_size() { return strategy_cache.size(); }
void clear_strategy_cache() { strategy_cache.clear(); }

}  // namespace dtensor::dispatch

namespace dtensor {

DispatchTrace::DispatchTrace() : previous_(dispatch::active_trace) { dispatch::active_trace = this; }
DispatchTrace::~DispatchTrace() { dispatch::active_trace = previous_; }
std::string DispatchTrace::to_string() const {
  std::string out;
  for (const std::string& line : decisions_) out += line + "\n";
  return out;
}

}  // namespace dtensor
