// Dijkstra over layouts: states are placement lists (with their shard nesting),
// edges are the moves the transforms offer, weights their predicted seconds under
// the alpha-beta model plus a nanosecond per step so that, at equal cost, fewer
// steps win. Ties are broken by the layout key, so every rank picks the same plan.
#include "placements/planner.h"
#include "util/check.h"

#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace dtensor::redistribution {
namespace {

constexpr double kStepPenalty = 1e-9;
constexpr size_t kMaxStates = 200000;
constexpr size_t kMaxCachedPlans = 1 << 14;

struct Node {
  double cost = 0;
  Placements placements;
  std::string parent;  // key of the previous layout ("" at the start)
  PlannedStep step;    // how we got here
};

std::string cache_key(const Placements& from, const Placements& to, const Shape& shape, const DeviceMesh& mesh,
                      DType dtype) {
  std::ostringstream key;
  key << placements_to_string(from) << '>' << placements_to_string(to) << '|' << shape_to_string(shape) << '|'
      << shape_to_string(mesh.shape()) << '|' << dtype_size(dtype) << '|' << mesh.world().backend();
  return key.str();
}

// Partials of different kinds cannot be resolved together, except on size-1 mesh
// dims, where a Partial reduces nothing: the relabelled start below may carry the
// target's P(sum) there beside a P(max) still to resolve on another dim.
bool partials_compatible_on(Placements placements, const Shape& mesh_shape) {
  for (size_t i = 0; i < placements.size(); ++i) {
    if (mesh_shape[i] == 1) placements[i] = Replicate();
  }
  return partials_compatible(placements);
}

std::shared_ptr<const Plan> search(const Placements& from, const Placements& to, const Shape& shape,
                                   const DeviceMesh& mesh, DType dtype) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const Shape& mesh_shape = mesh.shape();
  // Threads ranks all share this host; MPI ranks are assumed one per core.
  const std::string backend = mesh.world().backend();
  const CostModel model = CostModel::for_backend(backend, backend == "threads" ? mesh.size() : 1);
  const Placements target = canonicalize(to, ndim);
  const std::string goal = layout_key(target, mesh_shape, ndim);

  // A size-1 mesh dim splits nothing and reduces nothing: its placement can be
  // relabelled to the target's for free.
  Placements start = from;
  for (size_t i = 0; i < start.size(); ++i) {
    if (mesh_shape[i] == 1) start[i] = target[i];
  }
  start = canonicalize(start, ndim);

  std::unordered_map<std::string, Node> best;
  using Entry = std::pair<double, std::string>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> frontier;
  const std::string start_key = layout_key(start, mesh_shape, ndim);
  best[start_key] = Node{0, start, "", {}};
  frontier.push({0, start_key});
  std::vector<Move> moves;
  while (!frontier.empty()) {
    const auto [cost, key] = frontier.top();
    frontier.pop();
    if (cost > best[key].cost) continue;  // stale entry
    if (key == goal) break;
    const Placements here = best[key].placements;
    for (const Transform* transform : all_transforms()) {
      moves.clear();
      transform->moves(here, target, mesh_shape, ndim, moves);
      for (const Move& move : moves) {
        if (!partials_compatible_on(move.after, mesh_shape)) continue;
        const StepContext ctx{mesh, shape, dtype, here, move.after, move.mesh_dim};
        const double seconds = transform->predict(ctx, model);
        const double next_cost = cost + seconds + kStepPenalty;
        const std::string next_key = layout_key(move.after, mesh_shape, ndim);
        auto it = best.find(next_key);
        if (it != best.end() && it->second.cost <= next_cost) continue;
        best[next_key] =
            Node{next_cost, move.after, key, PlannedStep{move.kind, move.mesh_dim, here, move.after, seconds}};
        frontier.push({next_cost, next_key});
      }
    }
    DT_CHECK_SUPPORTED(best.size() < kMaxStates, "redistribute", "the planner explored ", best.size(),
                       " layouts without reaching ", placements_to_string(to));
  }
  DT_CHECK_SUPPORTED(best.count(goal), "redistribute", "no path from ", placements_to_string(from), " to ",
                     placements_to_string(to));

  auto plan = std::make_shared<Plan>();
  for (std::string key = goal; key != start_key; key = best[key].parent) {
    plan->steps.push_back(best[key].step);
  }
  std::reverse(plan->steps.begin(), plan->steps.end());
  for (const PlannedStep& step : plan->steps) plan->predicted_seconds += step.predicted_seconds;
  return plan;
}

// Plans by key; an entry appears when its search starts, so ranks of one process
// (threads backend) that need the same plan wait for the first one's search
// instead of repeating it (on a 2x2x2 mesh eight ranks would otherwise search the
// same layouts eight times at once).
using PlanFuture = std::shared_future<std::shared_ptr<const Plan>>;
std::mutex cache_mutex;
std::map<std::string, PlanFuture>& cache() {
  static std::map<std::string, PlanFuture> plans;
  return plans;
}

}  // namespace

std::shared_ptr<const Plan> find_plan(const Placements& from_given, const Placements& to_given, const Shape& shape,
                                      const DeviceMesh& mesh, DType dtype) {
  // One plan per pair of layouts, however they are spelled: a DistTensor may carry a
  // Shard order that canonicalize drops (S(0, order=1) as the only split of its dim),
  // and the search's moves compare placements with their orders, so the raw and the
  // canonical spelling could plan differently, and explain_redistribute (canonical)
  // would promise other collectives than redistribute runs.
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const Placements from = canonicalize(from_given, ndim), to = canonicalize(to_given, ndim);
  const std::string key = cache_key(from, to, shape, mesh, dtype);
  std::promise<std::shared_ptr<const Plan>> promise;
  PlanFuture planned;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache().find(key);
    if (it != cache().end()) {
      planned = it->second;
    } else {
      // Bounded: programs with ever-changing shapes start over instead of growing.
      if (cache().size() >= kMaxCachedPlans) cache().clear();
      cache().emplace(key, promise.get_future().share());
    }
  }
  if (planned.valid()) return planned.get();  // waits while another rank searches
  try {
    std::shared_ptr<const Plan> plan = search(from, to, shape, mesh, dtype);
    promise.set_value(plan);
    return plan;
  } catch (...) {
    // Errors are not cached: waiters see this one, a later call searches again.
    promise.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache().erase(key);
    throw;
  }
}

size_t plan_cache_size() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache().size();
}

void clear_plan_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache().clear();
}

}  // namespace dtensor::redistribution
