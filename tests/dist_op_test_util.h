// The op-conformance harness (ggml test-backend-ops style): one small case per op,
// run for every input placement combination on 1-D (2, 3 ranks) and 2-D (2x2)
// meshes, compared with the same computation on full tensors on one rank, forward
// and backward; and the one-rank backward compared with finite differences in F64.
#pragma once

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dtensor/autograd.h"
#include "dtensor/comm_debug.h"
#include "dtensor/ops.h"
#include "test_helpers.h"

namespace dtensor::testing {

struct OpCase {
  std::string name;
  std::vector<Tensor> inputs;  // full tensors
  // Inputs that get gradients (floating ones by default).
  std::vector<bool> differentiable;
  std::function<DistTensor(const std::vector<DistTensor>&)> dist_fn;
  // The forward on plain tensors (the independent reference); may be empty.
  std::function<Tensor(const std::vector<Tensor>&)> local_fn;
  double rtol = 1e-4, atol = 1e-5;
  // Offer Partial(sum) inputs (genuinely split values) for floating inputs.
  bool partial_inputs = true;
  // At most this many placement combinations per mesh (sampled, fixed seed).
  int64_t max_combinations = 200;
};

// Placement choices for one input on one mesh dim.
inline std::vector<Placement> choices_for(const Tensor& t, bool partial) {
  std::vector<Placement> out{Replicate()};
  for (int64_t d = 0; d < t.dim(); ++d) out.push_back(Shard(d));
  if (partial && is_floating(t.dtype())) out.push_back(Partial());
  return out;
}

// A DistTensor of `full` with `placements` whose Partial dims hold genuinely
// partial values: for sum/avg, coordinate c holds (c+1)/T of the value
// (T = n(n+1)/2, times n for avg); for max, the value minus c; for min, plus c.
inline DistTensor make_input(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  Placements replicated = placements;
  for (Placement& p : replicated) {
    if (p.is_partial()) p = Replicate();
  }
  Tensor local = distribute(full, mesh, replicated).to_local();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_partial()) continue;
    const double c = static_cast<double>(mesh.coordinate(static_cast<int>(i)));
    const double n = static_cast<double>(mesh.size(static_cast<int>(i)));
    switch (placements[i].reduce_op()) {
      case ReduceOp::Max: local = sub(local, c); break;
      case ReduceOp::Min: local = add(local, c); break;
      case ReduceOp::Avg: local = mul(local, n * (c + 1) / (n * (n + 1) / 2)); break;
      default: local = mul(local, (c + 1) / (n * (n + 1) / 2));
    }
  }
  return DistTensor::from_local(local.contiguous(), mesh, placements, full.shape());
}

// Forward output (full) and input gradients (full; undefined where none) of the
// case's dist_fn on `mesh` with `layouts`, for the upstream gradient seed.
struct RunResult {
  Tensor output;
  std::vector<Tensor> grads;
};

inline RunResult run_case(const OpCase& c, const DeviceMesh& mesh, const std::vector<Placements>& layouts) {
  std::vector<DistTensor> inputs;
  for (size_t j = 0; j < c.inputs.size(); ++j) {
    DistTensor t = make_input(c.inputs[j], mesh, layouts[j]);
    const bool diff = c.differentiable.empty() ? is_floating(c.inputs[j].dtype()) : c.differentiable[j];
    if (diff) t.set_requires_grad();
    inputs.push_back(t);
  }
  DistTensor out = c.dist_fn(inputs);
  RunResult result;
  result.output = out.full_tensor();
  if (out.requires_grad()) {
    const Tensor upstream = Tensor::randn(out.shape(), 1234, out.dtype());
    out.backward(distribute(upstream, mesh, Placements(mesh.ndim(), Replicate())));
  }
  for (const DistTensor& t : inputs) result.grads.push_back(t.grad().defined() ? t.grad().full_tensor() : Tensor());
  return result;
}

inline std::vector<std::vector<Placements>> combinations(const OpCase& c, int mesh_ndim) {
  std::vector<std::vector<Placements>> all{{}};
  for (const Tensor& t : c.inputs) {
    // Every placement list for this input.
    std::vector<Placements> lists{{}};
    for (int m = 0; m < mesh_ndim; ++m) {
      std::vector<Placements> next;
      for (const Placements& prefix : lists) {
        for (const Placement& p : choices_for(t, c.partial_inputs)) {
          Placements l = prefix;
          l.push_back(p);
          next.push_back(l);
        }
      }
      lists = next;
    }
    std::vector<std::vector<Placements>> next;
    for (const auto& prefix : all) {
      for (const Placements& l : lists) {
        auto combo = prefix;
        combo.push_back(l);
        next.push_back(combo);
      }
    }
    all = next;
  }
  if (static_cast<int64_t>(all.size()) > c.max_combinations) {
    std::mt19937 rng(5);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(c.max_combinations);
  }
  return all;
}

inline std::string describe_layouts(const std::vector<Placements>& layouts) {
  std::string s;
  for (const Placements& l : layouts) s += "[" + placements_to_string(l) + "] ";
  return s;
}

inline void expect_close(const Tensor& got, const Tensor& want, const OpCase& c, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << c.name << " " << what;
  if (!want.defined()) return;
  ASSERT_TRUE(allclose(got.to(DType::F64), want.to(DType::F64), c.rtol, c.atol))
      << c.name << " " << what << ": " << compare(got.to(DType::F64), want.to(DType::F64), c.rtol, c.atol).to_string();
}

// Forward and backward on every layout combination of each mesh, against one rank.
inline void run_conformance(const OpCase& c) {
  RunResult reference;
  launch(1, [&](Group world) { reference = run_case(c, DeviceMesh(world, {1}), {c.inputs.size(), {Replicate()}}); });
  if (c.local_fn) expect_close(reference.output, c.local_fn(c.inputs), c, "one-rank forward vs local reference");
  struct MeshCase {
    int world;
    Shape shape;
  };
  for (const MeshCase& m : {MeshCase{2, {2}}, MeshCase{3, {3}}, MeshCase{4, {2, 2}}}) {
    const auto combos = combinations(c, static_cast<int>(m.shape.size()));
    launch(m.world, [&](Group world) {
      DeviceMesh mesh(world, m.shape);
      for (const auto& layouts : combos) {
        const RunResult got = run_case(c, mesh, layouts);
        const std::string where = "on mesh " + mesh.to_string() + " with inputs " + describe_layouts(layouts);
        expect_close(got.output, reference.output, c, "forward " + where);
        for (size_t j = 0; j < got.grads.size(); ++j) {
          expect_close(got.grads[j], reference.grads[j], c, "grad of input " + std::to_string(j) + " " + where);
        }
      }
    });
  }
}

// Layouts in which several mesh dims shard one tensor dim in a non-default nesting
// order (Shard(d, order)), with partners of every kind: each input in turn gets
// every such nesting of each of its dims, the other inputs all Replicate, all
// Partial(sum), the same tensor dim with the default order (when their shapes have
// it), or placements drawn at random (fixed seed). Dispatch must give every
// input of a strategy and its output one nesting per letter.
inline std::vector<std::vector<Placements>> nested_combinations(const OpCase& c, int mesh_ndim, int64_t max_count) {
  // Every ordered choice of >= 2 mesh dims, outermost first, that is not the
  // default order (mesh dim 0 outer).
  std::vector<std::vector<int>> orders;
  for (int mask = 0; mask < (1 << mesh_ndim); ++mask) {
    std::vector<int> dims;
    for (int m = 0; m < mesh_ndim; ++m) {
      if (mask & (1 << m)) dims.push_back(m);
    }
    if (dims.size() < 2) continue;
    std::sort(dims.begin(), dims.end());
    while (std::next_permutation(dims.begin(), dims.end())) orders.push_back(dims);  // skips the sorted one
  }
  auto nested = [&](int64_t d, const std::vector<int>& outer_first, bool default_order) {
    Placements l(static_cast<size_t>(mesh_ndim), Replicate());
    for (size_t k = 0; k < outer_first.size(); ++k) {
      l[static_cast<size_t>(outer_first[k])] = Shard(d, default_order ? 0 : static_cast<int>(k));
    }
    return l;
  };
  std::mt19937 rng(11);
  auto random_layout = [&](const Tensor& t) {
    const std::vector<Placement> choices = choices_for(t, c.partial_inputs);
    Placements l;
    for (int m = 0; m < mesh_ndim; ++m) l.push_back(choices[rng() % choices.size()]);
    return l;
  };
  std::vector<std::vector<Placements>> out;
  for (size_t j = 0; j < c.inputs.size(); ++j) {
    for (int64_t d = 0; d < c.inputs[j].dim(); ++d) {
      for (const std::vector<int>& order : orders) {
        const Placements primary = nested(d, order, false);
        // Partners: 0 all Replicate, 1 all Partial, 2 the same right-aligned dim in
        // the default order, 3 random.
        for (int kind = 0; kind < 4; ++kind) {
          std::vector<Placements> layouts;
          for (size_t o = 0; o < c.inputs.size(); ++o) {
            const Tensor& t = c.inputs[o];
            const int64_t aligned = d - c.inputs[j].dim() + t.dim();
            Placements l(static_cast<size_t>(mesh_ndim), Replicate());
            if (o == j) {
              l = primary;
            } else if (kind == 1 && c.partial_inputs && is_floating(t.dtype())) {
              l = Placements(static_cast<size_t>(mesh_ndim), Partial());
            } else if (kind == 2 && aligned >= 0 && t.size(aligned) == c.inputs[j].size(d)) {
              l = nested(aligned, order, true);
            } else if (kind == 3) {
              l = random_layout(t);
            }
            layouts.push_back(l);
          }
          out.push_back(layouts);
        }
      }
    }
  }
  if (static_cast<int64_t>(out.size()) > max_count) {
    std::shuffle(out.begin(), out.end(), rng);
    out.resize(static_cast<size_t>(max_count));
  }
  return out;
}

// The case on meshes 2x2, 2x3 and 2x2x2 with nested shard orders (above), forward
// and gradients against one rank, at most `max_per_mesh` layout combinations per
// mesh (`max_3d` on 2x2x2, where first-time planning of 4-D tensors is slow).
// Uneven pieces come from the 3-wide dim.
inline void run_nested_conformance(const OpCase& c, int64_t max_per_mesh = 24, int64_t max_3d = 24) {
  RunResult reference;
  launch(1, [&](Group world) { reference = run_case(c, DeviceMesh(world, {1}), {c.inputs.size(), {Replicate()}}); });
  for (const Shape& shape : {Shape{2, 2}, Shape{2, 3}, Shape{2, 2, 2}}) {
    const int64_t max_count = shape.size() == 3 ? max_3d : max_per_mesh;
    const auto combos = nested_combinations(c, static_cast<int>(shape.size()), max_count);
    launch(static_cast<int>(shape_numel(shape)), [&](Group world) {
      DeviceMesh mesh(world, shape);
      for (const auto& layouts : combos) {
        const RunResult got = run_case(c, mesh, layouts);
        const std::string where = "on mesh " + mesh.to_string() + " with inputs " + describe_layouts(layouts);
        expect_close(got.output, reference.output, c, "forward " + where);
        for (size_t j = 0; j < got.grads.size(); ++j) {
          expect_close(got.grads[j], reference.grads[j], c, "grad of input " + std::to_string(j) + " " + where);
        }
      }
    });
  }
}

// The one-rank backward against central finite differences in F64 (the case's
// inputs converted to F64; checks up to `max_elements` elements per input).
inline void check_finite_differences(const OpCase& c, int64_t max_elements = 12, double tolerance = 1e-6) {
  OpCase f64 = c;
  for (Tensor& t : f64.inputs) {
    if (is_floating(t.dtype())) t = t.to(DType::F64);
  }
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    const Placements r{Replicate()};
    const RunResult analytic = run_case(f64, mesh, {f64.inputs.size(), r});
    const Tensor upstream = Tensor::randn(analytic.output.shape(), 1234, DType::F64);
    auto objective = [&](const std::vector<Tensor>& values) {
      std::vector<DistTensor> in;
      for (const Tensor& v : values) in.push_back(distribute(v, mesh, r));
      NoGradGuard no_grad;
      const Tensor out = f64.dist_fn(in).full_tensor();
      return sum(mul(out.to(DType::F64), upstream)).item<double>();
    };
    for (size_t j = 0; j < f64.inputs.size(); ++j) {
      if (!analytic.grads[j].defined()) continue;
      const std::vector<double> grad = analytic.grads[j].to(DType::F64).to_vector<double>();
      for (int64_t i = 0; i < std::min<int64_t>(max_elements, f64.inputs[j].numel()); ++i) {
        const double h = 1e-6;
        std::vector<Tensor> plus = f64.inputs, minus = f64.inputs;
        plus[j] = plus[j].clone();
        minus[j] = minus[j].clone();
        const double x = f64.inputs[j].reshape({-1}).select(0, i).item<double>();
        plus[j].reshape({-1}).select(0, i).fill_(x + h);
        minus[j].reshape({-1}).select(0, i).fill_(x - h);
        const double numeric = (objective(plus) - objective(minus)) / (2 * h);
        ASSERT_NEAR(grad[i], numeric, tolerance * std::max(1.0, std::fabs(numeric)))
            << c.name << ": d/d input " << j << "[" << i << "]";
      }
    }
  });
}

}  // namespace dtensor::testing
