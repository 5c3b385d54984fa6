// Whole-step layout planning (dtensor/step_plan.h): the recording of a step, the joint
// choice of every op's strategy, and its replay.
//
// The recorded step is a graph: its nodes are the dispatched ops, each with its
// domain (every strategy the op offers for any layout its producers may give its
// inputs) and the strategy greedy dispatch chose; its edges are the inputs (a move
// from the producer's output layout to the layout the consumer's strategy needs) and
// the moves the code asks for (redistribute, autograd's sums, a leaf gradient's way to
// its parameter's layout). A plan is one strategy per node; it costs the predicted
// seconds of every edge's move. The search starts from greedy's choice and keeps the
// best plan found, so it never plans worse than greedy under the model:
//  - dynamic programming over a spanning forest of the graph (each node keeps one
//    input, its "parent", as a tree edge; its other edges are priced against the
//    current plan): exact on chains and trees, repeated with different parents
//    (largest input, earliest producer, latest producer) while it improves;
//  - then coordinate descent: each node alone moves to its cheapest strategy given its
//    neighbours, until none does.
#include "dtensor/step_plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "dist_tensor/dist_tensor_impl.h"
#include "dist_tensor/step_plan_hooks.h"
#include "dtensor/group.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {

namespace step_plan {

thread_local Recorder* active = nullptr;

namespace {
thread_local bool internal_move = false;
std::atomic<uint32_t> next_serial{1};
}  // namespace

// One dispatched op of the recorded step.
struct OpRecord {
  std::string op;
  std::vector<int64_t> attributes;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  Shape out_shape;  // once its output was wrapped
  DeviceMesh mesh;
  std::vector<int> producers;        // the op that made each input, or -1
  // Which of the producer's layouts it has: 0 its output, r its input r-1 as its
  // strategy needs it (a gradient a non-dispatched backward wraps in that layout).
  std::vector<int> producer_roles;
  std::vector<Placements> recorded;  // each input's layout when recorded
  std::vector<dispatch::Strategy> domain;
  int greedy = 0;        // greedy dispatch's choice, an index into domain
  bool pinned = false;   // the plan keeps greedy's choice
  bool wrapped = false;  // an output was seen (on_wrap)
  std::string pin_reason;
  // Code chose a path by these functions of the output's layout: the plan keeps them.
  std::vector<std::pair<int, std::function<bool(const Placements&)>>> decisions;  // (role, decides)
};

// A move the code asked for: from a tensor (made by op `from`, or of fixed layout) to
// `to_layout`, or to the output layout of op `to`.
struct MoveRecord {
  int from = -1, from_role = 0, to_role = 0;
  Placements from_layout;
  int to = -1;
  Placements to_layout;
  Shape shape;
  DType dtype = DType::F32;
  DeviceMesh mesh;
  bool expected = false;  // a leaf gradient's way to its parameter's layout
  bool dropped = false;   // an expected move the code then made itself
};

struct Graph {
  std::vector<OpRecord> ops;
  std::vector<MoveRecord> moves;
};

struct Recorder {
  enum class Mode { Record, Replay, Greedy };
  Mode mode = Mode::Greedy;
  uint32_t serial = 0;
  Graph graph;                              // Record: the step so far
  std::shared_ptr<const Graph> plan_graph;  // Replay: the plan's recording
  const std::vector<int>* plan_choice = nullptr;
  size_t next = 0;  // Replay: the next op's index
  int open = -1;    // the op whose outputs wraps belong to
  int64_t ops = 0;
  std::string note;
  // Record: every tagged output (those still alive when the step ends escaped it), and
  // the ops whose outputs became leaf gradients (their layout is the library's choice).
  std::vector<std::pair<std::weak_ptr<DistTensor::Impl>, int>> outputs;
  std::vector<int> gradient_ops;
  // Record: the op whose autograd function is running (its backward's wraps and moves
  // in the op's layouts follow the op's strategy), and each function's op.
  int backward_of = -1;
  std::unordered_map<const void*, int> function_ops;
};

namespace {

bool same_strategy(const dispatch::Strategy& a, const dispatch::Strategy& b) {
  return a.inputs == b.inputs && a.output == b.output;
}

// A tag: the recording's serial (high 32 bits), the role (8 bits), the op + 1 (24 bits).
int producer_of(const Recorder& r, const DistTensor::Impl& impl) {
  if (impl.plan_tag == 0 || static_cast<uint32_t>(impl.plan_tag >> 32) != r.serial) return -1;
  return static_cast<int>(impl.plan_tag & 0xffffffu) - 1;
}
int role_of(const DistTensor::Impl& impl) { return static_cast<int>((impl.plan_tag >> 24) & 0xffu); }

uint64_t tag_for(const Recorder& r, int op, int role = 0) {
  return (static_cast<uint64_t>(r.serial) << 32) | (static_cast<uint64_t>(role) << 24) | static_cast<uint64_t>(op + 1);
}

const Placements& layout_of(const dispatch::Strategy& s, int role) {
  return role == 0 ? s.output : s.inputs[static_cast<size_t>(role - 1)];
}

// A stand-in with t's shape, dtype and mesh in other placements, for asking an op what
// it would do with such an input (strategy builders read nothing else).
DistTensor stand_in(const Shape& shape, DType dtype, const DeviceMesh& mesh, const Placements& placements) {
  auto impl = std::make_shared<DistTensor::Impl>();
  impl->local = Tensor::empty({0}, dtype);
  impl->mesh = mesh;
  impl->placements = placements;
  impl->global_shape = shape;
  return DistTensor(std::move(impl));
}

// The op's domain: every strategy it offers for some combination of its inputs'
// possible layouts (each producer's candidate output layouts; a fixed layout for an
// input no recorded op made). Combinations beyond kMaxCombinations vary one input at
// a time from the recorded layouts.
void fill_domain(OpRecord& rec, const Graph& graph, const dispatch::Builder& build) {
  constexpr size_t kMaxCombinations = 64;
  const size_t n = rec.shapes.size();
  std::vector<std::vector<Placements>> choices(n);
  size_t combinations = 1;
  for (size_t j = 0; j < n; ++j) {
    choices[j].push_back(rec.recorded[j]);
    if (rec.producers[j] >= 0) {
      for (const dispatch::Strategy& s : graph.ops[static_cast<size_t>(rec.producers[j])].domain) {
        const Placements& p = layout_of(s, rec.producer_roles[j]);
        if (std::find(choices[j].begin(), choices[j].end(), p) == choices[j].end()) choices[j].push_back(p);
      }
    }
    combinations = std::min(combinations * choices[j].size(), kMaxCombinations + 1);
  }
  auto offer = [&](const std::vector<Placements>& layouts) {
    std::vector<DistTensor> stand_ins;
    for (size_t j = 0; j < n; ++j) stand_ins.push_back(stand_in(rec.shapes[j], rec.dtypes[j], rec.mesh, layouts[j]));
    std::vector<dispatch::Strategy> offered;
    try {
      offered = build(stand_ins);
    } catch (const std::exception&) {
      return;  // the op refuses these layouts outright; they are not in its domain
    }
    for (dispatch::Strategy& s : offered) {
      const bool known = std::any_of(rec.domain.begin(), rec.domain.end(),
                                     [&](const dispatch::Strategy& d) { return same_strategy(d, s); });
      if (!known) rec.domain.push_back(std::move(s));
    }
  };
  std::vector<Placements> layouts = rec.recorded;
  if (combinations <= kMaxCombinations) {
    std::vector<size_t> index(n, 0);
    while (true) {
      for (size_t j = 0; j < n; ++j) layouts[j] = choices[j][index[j]];
      offer(layouts);
      size_t j = 0;
      while (j < n && ++index[j] == choices[j].size()) index[j++] = 0;
      if (j == n) break;
    }
  } else {
    offer(layouts);
    for (size_t j = 0; j < n; ++j) {
      for (size_t c = 1; c < choices[j].size(); ++c) {
        std::vector<Placements> varied = rec.recorded;
        varied[j] = choices[j][c];
        offer(varied);
      }
    }
  }
}

// ---- the search ---------------------------------------------------------------------

constexpr double kPerStep = 1e-10;  // seconds a move's transform adds to break ties

// The graph as cost tables: each op's distinct output layouts, each input's distinct
// required layouts, and the seconds of every (from, to) pair on every edge.
class Problem {
 public:
  explicit Problem(const Graph& graph) : graph_(graph) {
    const size_t n = graph.ops.size();
    out_index_.resize(n);
    outs_.resize(n);
    edges_.resize(n);
    consumers_.resize(n);
    moves_of_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const OpRecord& op = graph.ops[i];
      out_index_[i].resize(op.shapes.size() + 1);
      outs_[i].resize(op.shapes.size() + 1);
      for (size_t role = 0; role <= op.shapes.size(); ++role) {
        for (const dispatch::Strategy& s : op.domain) {
          out_index_[i][role].push_back(intern(outs_[i][role], layout_of(s, static_cast<int>(role))));
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const OpRecord& op = graph.ops[i];
      for (size_t j = 0; j < op.shapes.size(); ++j) {
        Edge e;
        e.producer = op.producers[j];
        e.role = op.producer_roles[j];
        std::vector<Placements> required;
        for (const dispatch::Strategy& s : op.domain) e.required.push_back(intern(required, s.inputs[j]));
        const std::vector<Placements> sources =
            e.producer >= 0 ? outs_[static_cast<size_t>(e.producer)][static_cast<size_t>(e.role)]
                            : std::vector<Placements>{op.recorded[j]};
        e.seconds = table(sources, required, op.shapes[j], op.dtypes[j], op.mesh);
        if (e.producer >= 0)
          consumers_[static_cast<size_t>(e.producer)].push_back({static_cast<int>(i), static_cast<int>(j)});
        edges_[i].push_back(std::move(e));
      }
    }
    for (size_t m = 0; m < graph.moves.size(); ++m) {
      const MoveRecord& mv = graph.moves[m];
      if (mv.dropped) continue;
      Move move;
      move.from = mv.from;
      move.to = mv.to;
      move.from_role = mv.from_role;
      move.to_role = mv.to_role;
      const std::vector<Placements> sources =
          mv.from >= 0 ? outs_[static_cast<size_t>(mv.from)][static_cast<size_t>(mv.from_role)]
                       : std::vector<Placements>{mv.from_layout};
      const std::vector<Placements> targets = mv.to >= 0
                                                  ? outs_[static_cast<size_t>(mv.to)][static_cast<size_t>(mv.to_role)]
                                                  : std::vector<Placements>{mv.to_layout};
      move.seconds = table(sources, targets, mv.shape, mv.dtype, mv.mesh);
      if (mv.from >= 0) moves_of_[static_cast<size_t>(mv.from)].push_back(moves_.size());
      if (mv.to >= 0 && mv.to != mv.from) moves_of_[static_cast<size_t>(mv.to)].push_back(moves_.size());
      moves_.push_back(std::move(move));
    }
  }

  size_t size() const { return graph_.ops.size(); }
  size_t domain(size_t i) const { return graph_.ops[i].domain.size(); }

  // What the whole step's moves cost under `plan`.
  double total(const std::vector<int>& plan) const {
    double seconds = 0;
    for (size_t i = 0; i < size(); ++i) {
      for (size_t j = 0; j < edges_[i].size(); ++j) seconds += input(i, j, plan[i], plan);
    }
    for (const Move& m : moves_) seconds += move(m, plan, -1, 0);
    return seconds;
  }

  // What op i's own edges cost with strategy s (its inputs, its consumers' inputs, the
  // moves that touch it), the rest of `plan` fixed.
  double local(size_t i, int s, const std::vector<int>& plan) const {
    double seconds = 0;
    for (size_t j = 0; j < edges_[i].size(); ++j) seconds += input(i, j, s, plan);
    for (const auto& [k, j] : consumers_[i]) {
      const Edge& e = edges_[static_cast<size_t>(k)][static_cast<size_t>(j)];
      seconds += e.seconds[out(i, e.role, s)][e.required[static_cast<size_t>(plan[static_cast<size_t>(k)])]];
    }
    for (size_t m : moves_of_[i]) seconds += move(moves_[m], plan, static_cast<int>(i), s);
    return seconds;
  }

  // One pass of dynamic programming over the forest in which each op's input
  // `parent[k]` is its tree edge. Returns the plan it leads to from `plan`.
  std::vector<int> forest_pass(const std::vector<int>& plan, const std::vector<int>& parent, int64_t& work) const {
    const size_t n = size();
    std::vector<std::vector<double>> below(n);  // below[i][s]: the cheapest cost of i's subtree
    for (size_t i = n; i-- > 0;) {
      below[i].assign(domain(i), 0.0);
      for (size_t s = 0; s < domain(i); ++s) {
        double seconds = 0;
        for (size_t m : moves_of_[i]) seconds += move(moves_[m], plan, static_cast<int>(i), static_cast<int>(s));
        for (const auto& [k, j] : consumers_[i]) {
          const size_t kk = static_cast<size_t>(k);
          const Edge& e = edges_[kk][static_cast<size_t>(j)];
          if (parent[kk] != j) {
            seconds += e.seconds[out(i, e.role, static_cast<int>(s))][e.required[static_cast<size_t>(plan[kk])]];
            continue;
          }
          double best = std::numeric_limits<double>::infinity();
          for (size_t t = 0; t < domain(kk); ++t) {
            double c = e.seconds[out(i, e.role, static_cast<int>(s))][e.required[t]] + below[kk][t];
            for (size_t jj = 0; jj < edges_[kk].size(); ++jj) {
              if (static_cast<int>(jj) != j) c += input(kk, jj, static_cast<int>(t), plan);
            }
            best = std::min(best, c);
          }
          work += static_cast<int64_t>(domain(kk));
          seconds += best;
        }
        below[i][s] = seconds;
      }
    }
    std::vector<int> next = plan;
    for (size_t i = 0; i < n; ++i) {
      int best = next[i];
      double best_cost = std::numeric_limits<double>::infinity();
      for (size_t s = 0; s < domain(i); ++s) {
        double c = below[i][s];
        for (size_t j = 0; j < edges_[i].size(); ++j) c += input(i, j, static_cast<int>(s), next);
        if (c < best_cost - 1e-15 || (c <= best_cost + 1e-15 && static_cast<int>(s) == plan[i])) {
          best = static_cast<int>(s);
          best_cost = c;
        }
      }
      work += static_cast<int64_t>(domain(i));
      next[i] = best;
    }
    return next;
  }

  // Tree edges by a rule: 0 the largest input, 1 the earliest producer, 2 the latest;
  // from 3 on, an input drawn by a hash of (op, rule) (the same on every rank).
  std::vector<int> parents(int rule) const {
    std::vector<int> parent(size(), -1);
    for (size_t k = 0; k < size(); ++k) {
      const OpRecord& op = graph_.ops[k];
      int best = -1;
      if (rule >= 3) {
        std::vector<int> made;
        for (size_t j = 0; j < op.producers.size(); ++j) {
          if (op.producers[j] >= 0) made.push_back(static_cast<int>(j));
        }
        const uint64_t draw =
            (static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(rule) * 0xBF58476D1CE4E5B9ull);
        if (!made.empty()) parent[k] = made[static_cast<size_t>((draw >> 17) % made.size())];
        continue;
      }
      for (size_t j = 0; j < op.producers.size(); ++j) {
        const int p = op.producers[j];
        if (p < 0) continue;
        if (best < 0) {
          best = static_cast<int>(j);
          continue;
        }
        const int q = op.producers[static_cast<size_t>(best)];
        const bool better = rule == 0   ? shape_numel(op.shapes[j]) > shape_numel(op.shapes[static_cast<size_t>(best)])
                            : rule == 1 ? p < q
                                        : p > q;
        if (better) best = static_cast<int>(j);
      }
      parent[k] = best;
    }
    return parent;
  }

 private:
  struct Edge {
    int producer = -1, role = 0;
    std::vector<int> required;                 // per strategy of the consumer
    std::vector<std::vector<double>> seconds;  // [source layout][required layout]
  };
  struct Move {
    int from = -1, to = -1, from_role = 0, to_role = 0;
    std::vector<std::vector<double>> seconds;  // [source layout][target layout]
  };

  static int intern(std::vector<Placements>& list, const Placements& p) {
    const auto it = std::find(list.begin(), list.end(), p);
    if (it != list.end()) return static_cast<int>(it - list.begin());
    list.push_back(p);
    return static_cast<int>(list.size()) - 1;
  }

  std::vector<std::vector<double>> table(const std::vector<Placements>& from, const std::vector<Placements>& to,
                                         const Shape& shape, DType dtype, const DeviceMesh& mesh) {
    std::vector<std::vector<double>> t(from.size(), std::vector<double>(to.size(), 0.0));
    for (size_t a = 0; a < from.size(); ++a) {
      for (size_t b = 0; b < to.size(); ++b) {
        if (from[a] == to[b]) continue;
        std::ostringstream key;
        key << mesh.to_string() << shape_to_string(shape) << static_cast<int>(dtype) << placements_to_string(from[a])
            << ">" << placements_to_string(to[b]);
        auto [it, fresh] = seconds_.try_emplace(key.str(), 0.0);
        if (fresh) {
          int steps = 0;
          it->second = dispatch::move_seconds(shape, dtype, mesh, from[a], to[b], &steps);
          // Where bandwidth and latency tie (a reduce-scatter and an all-gather, or
          // one all-reduce), the fewer calls win.
          it->second += kPerStep * steps;
        }
        t[a][b] = it->second;
      }
    }
    return t;
  }

  size_t out(size_t i, int role, int s) const {
    return static_cast<size_t>(out_index_[i][static_cast<size_t>(role)][static_cast<size_t>(s)]);
  }

  double input(size_t i, size_t j, int s, const std::vector<int>& plan) const {
    const Edge& e = edges_[i][j];
    const size_t source =
        e.producer >= 0 ? out(static_cast<size_t>(e.producer), e.role, plan[static_cast<size_t>(e.producer)]) : 0;
    return e.seconds[source][static_cast<size_t>(e.required[static_cast<size_t>(s)])];
  }

  // The move's cost under `plan`, with op `who` (if >= 0) at strategy s instead.
  double move(const Move& m, const std::vector<int>& plan, int who, int s) const {
    auto at = [&](int op) { return op == who ? s : plan[static_cast<size_t>(op)]; };
    const size_t a = m.from >= 0 ? out(static_cast<size_t>(m.from), m.from_role, at(m.from)) : 0;
    const size_t b = m.to >= 0 ? out(static_cast<size_t>(m.to), m.to_role, at(m.to)) : 0;
    return m.seconds[a][b];
  }

  const Graph& graph_;
  std::vector<std::vector<std::vector<int>>> out_index_;    // [op][role][strategy] -> index into outs_[op][role]
  std::vector<std::vector<std::vector<Placements>>> outs_;  // [op][role]: its distinct layouts
  std::vector<std::vector<Edge>> edges_;
  std::vector<std::vector<std::pair<int, int>>> consumers_;
  std::vector<Move> moves_;
  std::vector<std::vector<size_t>> moves_of_;
  std::unordered_map<std::string, double> seconds_;
};

struct Solution {
  std::vector<int> plan;
  double greedy_seconds = 0, planned_seconds = 0;
  int64_t evaluations = 0;
};

Solution solve(Graph& graph, int64_t max_evaluations) {
  // A pinned op keeps greedy's strategy: its domain is that strategy alone.
  for (OpRecord& op : graph.ops) {
    if (!op.wrapped && !op.pinned) {
      op.pinned = true;
      op.pin_reason = "no output seen";
    }
    if (op.pinned && op.domain.size() > 1) {
      op.domain = {op.domain[static_cast<size_t>(op.greedy)]};
      op.greedy = 0;
    }
    if (!op.decisions.empty() && op.domain.size() > 1) {
      // Only strategies whose layouts take the recorded paths.
      const dispatch::Strategy recorded = op.domain[static_cast<size_t>(op.greedy)];
      std::vector<dispatch::Strategy> kept;
      for (size_t i = 0; i < op.domain.size(); ++i) {
        bool same = true;
        for (const auto& [role, decides] : op.decisions) {
          same &= decides(layout_of(op.domain[i], role)) == decides(layout_of(recorded, role));
        }
        if (static_cast<int>(i) == op.greedy) op.greedy = static_cast<int>(kept.size());
        if (same) kept.push_back(op.domain[i]);
      }
      op.domain = std::move(kept);
    }
  }
  const Problem problem(graph);
  Solution out;
  for (const OpRecord& op : graph.ops) out.plan.push_back(op.greedy);
  out.greedy_seconds = problem.total(out.plan);
  double best = out.greedy_seconds;
  auto improves = [&](double c) { return c < best - 1e-12 - 1e-9 * best; };
  auto forest = [&](int rule) {
    std::vector<int> next = problem.forest_pass(out.plan, problem.parents(rule), out.evaluations);
    const double c = problem.total(next);
    if (!improves(c)) return false;
    out.plan = std::move(next);
    best = c;
    return true;
  };
  // Coordinate descent: each op alone to its cheapest strategy, until none moves.
  auto descend = [&] {
    bool any = false, moved = true;
    while (moved && out.evaluations < max_evaluations) {
      moved = false;
      for (size_t i = 0; i < problem.size(); ++i) {
        if (problem.domain(i) < 2) continue;
        const double current = problem.local(i, out.plan[i], out.plan);
        for (size_t s = 0; s < problem.domain(i); ++s) {
          if (problem.local(i, static_cast<int>(s), out.plan) < current - 1e-12 - 1e-9 * current) {
            out.plan[i] = static_cast<int>(s);
            moved = any = true;
            break;
          }
        }
        out.evaluations += static_cast<int64_t>(problem.domain(i));
      }
    }
    best = problem.total(out.plan);
    return any;
  };
  // The three rules while they improve, then descent; then rounds of the rules and
  // descent, and when nothing improves, up to 16 drawn forests before giving up.
  bool improved = true;
  while (improved && out.evaluations < max_evaluations) {
    improved = false;
    for (int rule = 0; rule < 3 && out.evaluations < max_evaluations; ++rule) improved |= forest(rule);
  }
  descend();
  constexpr int kDrawn = 16;
  improved = true;
  for (int round = 0; improved && out.evaluations < max_evaluations; ++round) {
    improved = false;
    for (int rule = 0; rule < 3 && out.evaluations < max_evaluations; ++rule) improved |= forest(rule);
    improved |= descend();
    for (int r = 0; !improved && r < kDrawn && out.evaluations < max_evaluations; ++r) {
      improved |= forest(3 + round * kDrawn + r);
    }
  }
  out.planned_seconds = problem.total(out.plan);
  return out;
}

// Ops whose outputs outlive the step keep their layout: the code that holds them may
// read their shards (a leaf's gradient excepted: its layout is the library's choice,
// and an optimizer moves it where it needs it).
void pin_escaped(Recorder& r) {
  std::vector<bool> gradient(r.graph.ops.size(), false);
  for (int op : r.gradient_ops) gradient[static_cast<size_t>(op)] = true;
  for (const auto& [impl, op] : r.outputs) {
    OpRecord& rec = r.graph.ops[static_cast<size_t>(op)];
    if (!impl.expired() && !gradient[static_cast<size_t>(op)] && !rec.pinned) {
      rec.pinned = true;
      rec.pin_reason = "alive after the step";
    }
  }
}

// What every rank must have recorded alike for their plans to agree: the ops, their
// shapes, producers, recorded layouts and domains, and the moves.
int64_t fingerprint(const Graph& graph) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  auto mix_placements = [&](const Placements& p) { mix(std::hash<std::string>()(placements_to_string(p))); };
  for (const OpRecord& op : graph.ops) {
    mix(std::hash<std::string>()(op.op));
    for (int64_t a : op.attributes) mix(static_cast<uint64_t>(a));
    for (size_t j = 0; j < op.shapes.size(); ++j) {
      for (int64_t d : op.shapes[j]) mix(static_cast<uint64_t>(d));
      mix(static_cast<uint64_t>(op.producers[j]));
      mix(static_cast<uint64_t>(op.producer_roles[j]));
      mix_placements(op.recorded[j]);
    }
    mix(static_cast<uint64_t>(op.greedy));
    for (const dispatch::Strategy& st : op.domain) {
      for (const Placements& p : st.inputs) mix_placements(p);
      mix_placements(st.output);
    }
  }
  for (const MoveRecord& m : graph.moves) {
    mix(static_cast<uint64_t>(m.from));
    mix(static_cast<uint64_t>(m.to));
    mix_placements(m.to_layout);
    mix(static_cast<uint64_t>(m.dropped));
  }
  return static_cast<int64_t>(h >> 1);
}

// One all-reduce over the world of the step's first mesh: whether every rank recorded
// the same graph (the fingerprint's max equals its min), and the union of the ranks'
// pins (an op one rank must keep, every rank keeps: a read on one rank only). Every
// rank that recorded ops joins it.
bool ranks_agree(Graph& graph) {
  std::vector<int64_t> v{fingerprint(graph), 0};
  v[1] = -v[0];
  for (const OpRecord& op : graph.ops) v.push_back(op.pinned ? 1 : 0);
  const Group world = graph.ops[0].mesh.world();
  std::vector<int64_t> r = all_reduce(world, Tensor::from_vector(v), ReduceOp::Max).to_vector<int64_t>();
  if (r[0] != -r[1]) return false;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    OpRecord& op = graph.ops[i];
    if (r[i + 2] != 0 && !op.pinned) {
      op.pinned = true;
      op.pin_reason = "kept on another rank";
    }
  }
  return true;
}

}  // namespace

const dispatch::Strategy& dispatch(std::string_view op, const std::vector<int64_t>& attributes,
                                   const std::vector<DistTensor>& inputs, const dispatch::Builder& build) {
  Recorder& r = *active;
  ++r.ops;
  r.open = -1;
  if (r.mode == Recorder::Mode::Replay) {
    const Graph& g = *r.plan_graph;
    bool same = r.next < g.ops.size();
    if (same) {
      const OpRecord& rec = g.ops[r.next];
      same = rec.op == op && rec.attributes == attributes && rec.shapes.size() == inputs.size() &&
             rec.mesh == inputs[0].mesh();
      for (size_t j = 0; same && j < inputs.size(); ++j) {
        same = rec.shapes[j] == inputs[j].shape() && rec.dtypes[j] == inputs[j].dtype();
      }
    }
    if (same) {
      const dispatch::Strategy& s = g.ops[r.next].domain[static_cast<size_t>((*r.plan_choice)[r.next])];
      r.open = static_cast<int>(r.next);
      ++r.next;
      dispatch::detail::trace(op, s, inputs, " [planned]");
      return s;
    }
    std::ostringstream why;
    why << "op " << r.next << " of the recorded step was "
        << (r.next < g.ops.size() ? g.ops[r.next].op : std::string("past its end")) << ", this step ran " << op
        << " (other ops or shapes): the rest of the step is greedy and the next step records again";
    r.note = why.str();
    r.mode = Recorder::Mode::Greedy;
  }
  const dispatch::Strategy* hit = dispatch::detail::lookup(op, attributes, inputs);
  const dispatch::Strategy& chosen = hit ? *hit : dispatch::detail::insert(op, build(inputs), inputs);
  if (r.mode != Recorder::Mode::Record) return chosen;

  OpRecord rec;
  rec.op = std::string(op);
  rec.attributes = attributes;
  rec.mesh = inputs[0].mesh();
  for (const DistTensor& t : inputs) {
    rec.shapes.push_back(t.shape());
    rec.dtypes.push_back(t.dtype());
    rec.producers.push_back(producer_of(r, *t.impl()));
    rec.producer_roles.push_back(rec.producers.back() >= 0 ? role_of(*t.impl()) : 0);
    rec.recorded.push_back(t.placements());
  }
  fill_domain(rec, r.graph, build);
  const auto it = std::find_if(rec.domain.begin(), rec.domain.end(),
                               [&](const dispatch::Strategy& s) { return same_strategy(s, chosen); });
  rec.greedy = static_cast<int>(it - rec.domain.begin());
  if (it == rec.domain.end()) rec.domain.push_back(chosen);
  r.graph.ops.push_back(std::move(rec));
  r.open = static_cast<int>(r.graph.ops.size()) - 1;
  return chosen;
}

void on_wrap(const std::shared_ptr<DistTensor::Impl>& impl) {
  Recorder& r = *active;
  if (r.mode == Recorder::Mode::Replay) {
    if (r.open < 0) return;
    // An output whose layout the plan changed: reading its shard is an error (on_observe).
    const OpRecord& op = r.plan_graph->ops[static_cast<size_t>(r.open)];
    const dispatch::Strategy& planned = op.domain[static_cast<size_t>((*r.plan_choice)[static_cast<size_t>(r.open)])];
    if (impl->placements == planned.output && planned.output != op.domain[static_cast<size_t>(op.greedy)].output) {
      impl->plan_tag = kChangedLayout;
    }
    return;
  }
  if (r.mode != Recorder::Mode::Record) return;
  if (r.open < 0) {
    // A wrap in an op's backward function: a gradient of one of the op's tensors (its
    // shape) in that tensor's layout follows the op's strategy (another layout, or a
    // tensor of another shape, as a norm's weight gradient in its output's placements,
    // is the code's, fixed).
    if (r.backward_of < 0) return;
    const OpRecord& op = r.graph.ops[static_cast<size_t>(r.backward_of)];
    const dispatch::Strategy& greedy = op.domain[static_cast<size_t>(op.greedy)];
    for (int role = 0; role <= static_cast<int>(greedy.inputs.size()); ++role) {
      const Shape& shape = role == 0 ? op.out_shape : op.shapes[static_cast<size_t>(role - 1)];
      if (impl->placements == layout_of(greedy, role) && impl->global_shape == shape) {
        impl->plan_tag = tag_for(r, r.backward_of, role);
        return;
      }
    }
    return;
  }
  OpRecord& op = r.graph.ops[static_cast<size_t>(r.open)];
  if (impl->placements == op.domain[static_cast<size_t>(op.greedy)].output) {
    impl->plan_tag = tag_for(r, r.open);
    op.wrapped = true;
    op.out_shape = impl->global_shape;
    r.outputs.emplace_back(impl, r.open);
  } else {
    op.pinned = true;
    op.pin_reason = "an output in another layout than its strategy's";
  }
}

void on_boundary() { active->open = -1; }

void on_function(const void* node, const std::vector<DistTensor>& outputs) {
  Recorder& r = *active;
  if (r.mode != Recorder::Mode::Record) return;
  for (const DistTensor& t : outputs) {
    if (!t.defined()) continue;
    const int op = producer_of(r, *t.impl());
    if (op >= 0 && role_of(*t.impl()) == 0) {
      r.function_ops[node] = op;
      return;
    }
  }
  r.function_ops.erase(node);  // an address reused by a function of no recorded op
}

void on_backward(const void* node) {
  Recorder& r = *active;
  r.open = -1;
  if (r.mode != Recorder::Mode::Record) return;
  const auto it = node ? r.function_ops.find(node) : r.function_ops.end();
  r.backward_of = it == r.function_ops.end() ? -1 : it->second;
}

void on_observe(const DistTensor::Impl& impl) {
  DT_CHECK_ARG(impl.plan_tag != kChangedLayout, "DistTensor::to_local", "this tensor's layout (",
               placements_to_string(impl.placements),
               ") is the one a planned step chose, not the recorded step's, which did not read it: read a tensor's "
               "shard in every step or in none (the recorded step then keeps its layout), or fix its layout with "
               "redistribute() before reading it");
  if (!active) return;
  Recorder& r = *active;
  if (r.mode != Recorder::Mode::Record) return;
  r.open = -1;  // not one of the last op's own wraps that follow
  const int op = producer_of(r, impl);
  if (op >= 0) {
    r.graph.ops[static_cast<size_t>(op)].pinned = true;
    r.graph.ops[static_cast<size_t>(op)].pin_reason = "read with to_local()";
  }
}

void on_redistribute(const DistTensor& source, const Placements& to) {
  Recorder& r = *active;
  if (internal_move) return;  // an op moving its own input: the op's wraps follow
  r.open = -1;
  if (r.mode != Recorder::Mode::Record) return;
  MoveRecord m;
  m.from = producer_of(r, *source.impl());
  if (m.from >= 0) m.from_role = role_of(*source.impl());
  m.from_layout = source.placements();
  m.to_layout = to;
  if (r.backward_of >= 0) {
    // An op's backward moving a gradient to one of the op's layouts: the target follows
    // the op's strategy.
    const OpRecord& op = r.graph.ops[static_cast<size_t>(r.backward_of)];
    const dispatch::Strategy& greedy = op.domain[static_cast<size_t>(op.greedy)];
    for (int role = 0; role <= static_cast<int>(greedy.inputs.size()) && m.to < 0; ++role) {
      if (to == layout_of(greedy, role)) {
        m.to = r.backward_of;
        m.to_role = role;
      }
    }
  }
  m.shape = source.shape();
  m.dtype = source.dtype();
  m.mesh = source.mesh();
  for (MoveRecord& e : r.graph.moves) {
    if (e.expected && !e.dropped && e.from == m.from && e.from_role == m.from_role && m.from >= 0 && e.to < 0 &&
        e.to_layout == to) {
      e.dropped = true;
    }
  }
  r.graph.moves.push_back(std::move(m));
}

void on_keep(const DistTensor& t, const char* why) {
  Recorder& r = *active;
  if (r.mode != Recorder::Mode::Record || !t.defined()) return;
  const int op = producer_of(r, *t.impl());
  if (op >= 0 && !r.graph.ops[static_cast<size_t>(op)].pinned) {
    r.graph.ops[static_cast<size_t>(op)].pinned = true;
    r.graph.ops[static_cast<size_t>(op)].pin_reason = why;
  }
}

void on_keep_decision(const DistTensor& t, std::function<bool(const Placements&)> decides) {
  Recorder& r = *active;
  if (r.mode != Recorder::Mode::Record || !t.defined()) return;
  const int op = producer_of(r, *t.impl());
  if (op >= 0) r.graph.ops[static_cast<size_t>(op)].decisions.emplace_back(role_of(*t.impl()), std::move(decides));
}

void on_accumulate(const DistTensor& a, const DistTensor& b, const DistTensor& result) {
  Recorder& r = *active;
  r.open = -1;
  if (r.mode != Recorder::Mode::Record) return;
  MoveRecord m;
  m.from = producer_of(r, *b.impl());
  if (m.from >= 0) m.from_role = role_of(*b.impl());
  m.from_layout = b.placements();
  m.to = producer_of(r, *a.impl());
  if (m.to >= 0) m.to_role = role_of(*a.impl());
  m.to_layout = a.placements();
  m.shape = b.shape();
  m.dtype = b.dtype();
  m.mesh = b.mesh();
  r.graph.moves.push_back(std::move(m));
  result.impl()->plan_tag = a.impl()->plan_tag;  // the sum has a's layout, whatever the plan makes it
}

void on_leaf_gradient(const DistTensor& leaf, const DistTensor& grad) {
  Recorder& r = *active;
  if (r.mode != Recorder::Mode::Record || !grad.defined() || !(leaf.mesh() == grad.mesh())) return;
  MoveRecord m;
  m.from = producer_of(r, *grad.impl());
  if (m.from < 0) return;
  m.from_role = role_of(*grad.impl());
  r.gradient_ops.push_back(m.from);
  m.from_layout = grad.placements();
  m.to_layout = leaf.placements();
  m.shape = grad.shape();
  m.dtype = grad.dtype();
  m.mesh = grad.mesh();
  m.expected = true;
  r.graph.moves.push_back(std::move(m));
}

InternalMoveScope::InternalMoveScope() : previous_(internal_move) { internal_move = true; }
InternalMoveScope::~InternalMoveScope() { internal_move = previous_; }

}  // namespace step_plan

// ---- the public side -----------------------------------------------------------------

PlanMode plan_mode_from_env() {
  const char* env = std::getenv("DTENSOR_PLAN");
  if (!env || !*env || std::string_view(env) == "greedy") return PlanMode::Greedy;
  if (std::string_view(env) == "step") return PlanMode::Step;
  DT_CHECK_ARG(false, "DTENSOR_PLAN", "expected \"greedy\" or \"step\", got \"", env, "\"");
  return PlanMode::Greedy;
}

std::string StepPlanReport::to_string() const {
  static const char* const phases[] = {"recorded", "replayed", "diverged", "greedy"};
  std::ostringstream os;
  os << "step plan: " << phases[static_cast<int>(phase)] << ", " << ops << " ops";
  if (phase == Phase::Recorded || phase == Phase::Replayed) {
    os << ", " << planned_ops << " planned, " << changed_ops << " changed from greedy; predicted communication "
       << greedy_seconds * 1e6 << " us greedy, " << planned_seconds * 1e6 << " us planned";
  }
  if (phase == Phase::Recorded)
    os << "; planning " << planning_seconds * 1e3 << " ms, " << evaluations << " evaluations";
  if (!note.empty()) os << "; " << note;
  return os.str();
}

struct StepPlanner::State {
  StepPlannerOptions options;
  std::shared_ptr<const step_plan::Graph> graph;  // the plan's recording
  std::vector<int> choice;                        // the plan: a strategy per recorded op
  int divergences = 0;
  bool given_up = false;
  StepPlanReport report;
  std::unique_ptr<step_plan::Recorder> recorder;  // the open step's
  int uncaught = 0;
};

StepPlanner::StepPlanner(StepPlannerOptions options) : state_(std::make_unique<State>()) {
  DT_CHECK_ARG(options.max_evaluations >= 0, "StepPlanner", "expected max_evaluations >= 0, got ",
               options.max_evaluations);
  state_->options = options;
}
StepPlanner::~StepPlanner() {
  // Destroyed with its step open (unwinding past the PlannedStep): the rank's hooks
  // must not reach the freed recorder.
  if (state_ && state_->recorder && step_plan::active == state_->recorder.get()) step_plan::active = nullptr;
}
const StepPlanReport& StepPlanner::last_report() const { return state_->report; }

std::string StepPlanner::describe() const {
  const State& st = *state_;
  if (!st.graph) return "no plan (the next step records)\n";
  auto strategy = [](const dispatch::Strategy& s) {
    std::string out;
    for (size_t j = 0; j < s.inputs.size(); ++j) out += (j ? " " : "") + placements_to_string(s.inputs[j]);
    return out + " => " + placements_to_string(s.output);
  };
  std::ostringstream os;
  for (size_t i = 0; i < st.graph->ops.size(); ++i) {
    const step_plan::OpRecord& op = st.graph->ops[i];
    const int chosen = st.choice[i];
    os << "#" << i << " " << op.op << ": " << strategy(op.domain[static_cast<size_t>(chosen)]);
    if (chosen != op.greedy) os << " (greedy: " << strategy(op.domain[static_cast<size_t>(op.greedy)]) << ")";
    if (op.pinned) os << " [kept: " << op.pin_reason << "]";
    os << "\n";
  }
  return os.str();
}
void StepPlanner::reset() {
  DT_CHECK_ARG(!state_->recorder, "StepPlanner::reset", "a step is open");
  state_->graph.reset();
  state_->choice.clear();
  state_->divergences = 0;
  state_->given_up = false;
}

PlannedStep::PlannedStep(StepPlanner& planner) : planner_(planner) {
  DT_CHECK_ARG(step_plan::active == nullptr, "PlannedStep", "a step is already open on this rank (steps do not nest)");
  StepPlanner::State& st = *planner.state_;
  DT_CHECK_ARG(!st.recorder, "PlannedStep",
               "this planner has a step open on another rank: each rank (thread) needs its own StepPlanner");
  auto r = std::make_unique<step_plan::Recorder>();
  if (st.given_up) {
    r->mode = step_plan::Recorder::Mode::Greedy;
  } else if (st.graph) {
    r->mode = step_plan::Recorder::Mode::Replay;
    r->plan_graph = st.graph;
    r->plan_choice = &st.choice;
  } else {
    r->mode = step_plan::Recorder::Mode::Record;
    r->serial = step_plan::next_serial.fetch_add(1);
  }
  st.uncaught = std::uncaught_exceptions();
  st.recorder = std::move(r);
  step_plan::active = st.recorder.get();
}

PlannedStep::~PlannedStep() {
  StepPlanner::State& st = *planner_.state_;
  step_plan::active = nullptr;
  std::unique_ptr<step_plan::Recorder> r = std::move(st.recorder);
  StepPlanReport report;
  report.ops = r->ops;
  report.note = r->note;
  using Mode = step_plan::Recorder::Mode;
  if (std::uncaught_exceptions() > st.uncaught) {
    report.phase = StepPlanReport::Phase::Greedy;
    report.note = "the step failed; its recording is dropped";
    st.report = report;
    return;
  }
  try {
    if (r->mode == Mode::Record) {
      const auto start = std::chrono::steady_clock::now();
      step_plan::pin_escaped(*r);
      auto graph = std::make_shared<step_plan::Graph>(std::move(r->graph));
      // Before the search: the ranks' pins are merged, so that every rank solves the same problem.
      const bool agreed = graph->ops.empty() || step_plan::ranks_agree(*graph);
      step_plan::Solution solution = step_plan::solve(*graph, st.options.max_evaluations);
      report.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      report.phase = StepPlanReport::Phase::Recorded;
      report.evaluations = solution.evaluations;
      report.greedy_seconds = solution.greedy_seconds;
      report.planned_seconds = solution.planned_seconds;
      for (size_t i = 0; i < graph->ops.size(); ++i) {
        report.planned_ops += graph->ops[i].domain.size() > 1;
        report.changed_ops += solution.plan[i] != graph->ops[i].greedy;
      }
      if (agreed) {
        st.graph = std::move(graph);
        st.choice = std::move(solution.plan);
      } else {
        st.given_up = true;
        report.note =
            "the ranks recorded different steps (not the same ops and shapes everywhere): dispatch stays greedy";
      }
    } else if (r->mode == Mode::Replay && r->next == st.graph->ops.size()) {
      report.phase = StepPlanReport::Phase::Replayed;
      report.greedy_seconds = st.report.greedy_seconds;
      report.planned_seconds = st.report.planned_seconds;
      report.planned_ops = st.report.planned_ops;
      report.changed_ops = st.report.changed_ops;
      st.divergences = 0;
    } else if (r->mode != Mode::Greedy || !st.given_up) {
      report.phase = StepPlanReport::Phase::Diverged;
      if (report.note.empty()) {
        report.note = "the step ran " + std::to_string(r->next) + " of the recorded step's " +
                      std::to_string(st.graph->ops.size()) + " ops: the next step records again";
      }
      st.graph.reset();
      st.choice.clear();
      if (++st.divergences >= 2) {
        st.given_up = true;
        report.note += "; twice in a row, so dispatch stays greedy for this planner";
      }
    }
  } catch (const std::exception& e) {
    st.graph.reset();
    st.choice.clear();
    report.phase = StepPlanReport::Phase::Greedy;
    report.note = std::string("planning failed (") + e.what() + "): the next step records again";
  }
  st.report = report;
}

}  // namespace dtensor
