// Tensor-parallel styles: parameter placements and input/output hooks, the plan
// matcher, and Megatron-LM's plan for models::GPT.
#include "dtensor/parallel/tensor_parallel.h"

#include "dtensor/nn/moe.h"

#include <algorithm>
#include <sstream>

#include "dtensor/autograd.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/moe.h"
#include "dtensor/ops.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

constexpr const char* kOp = "parallelize_module";

// The mesh dim of `module_mesh` that `tp_mesh` runs along.
int tp_dim_of(const DeviceMesh& module_mesh, const DeviceMesh& tp_mesh) {
  DT_CHECK_ARG(tp_mesh.defined() && tp_mesh.ndim() == 1, kOp, "expected a 1-D tensor-parallel mesh, got ",
               tp_mesh.defined() ? tp_mesh.to_string() : std::string("an undefined mesh"));
  if (module_mesh == tp_mesh) return 0;
  for (int d = 0; d < module_mesh.ndim(); ++d) {
    if (module_mesh.group(d) == tp_mesh.group(0)) return d;
  }
  throw std::invalid_argument(std::string("[") + kOp + "] the tensor-parallel mesh " + tp_mesh.to_string() +
                              " is neither the module's mesh " + module_mesh.to_string() +
                              " nor one of its dims (pass mesh[\"tp\"] of the module's mesh)");
}

// `t` with mesh dim `dim` moved to `p` (recorded for autograd; unchanged, and no
// node recorded, when it is there already). With `expected`, `t` must arrive in
// that placement on `dim` (the style's input_layouts / output_layouts).
DistTensor to_layout(const DistTensor& t, int dim, const Placement& p, const std::optional<Placement>& expected,
                     const std::string& where) {
  DT_CHECK_ARG(t.defined(), kOp, where, ": expected a defined DistTensor");
  DT_CHECK_ARG(dim < t.mesh().ndim(), kOp, where, ": the tensor lives on mesh ", t.mesh().to_string(),
               ", which has no mesh dim ", dim);
  const Placement have = t.placements()[static_cast<size_t>(dim)];
  if (expected) {
    const Placement want = expected->is_shard() ? expected->normalized(t.dim()) : *expected;
    DT_CHECK_ARG(have.kind() == want.kind() && (!have.is_shard() || have.dim() == want.dim()), kOp, where,
                 " is ", have.to_string(), " on mesh dim ", dim, ", the style says ", expected->to_string(),
                 " (shape ", t.shape(), ")");
  }
  const int64_t shard_dim = p.is_shard() && p.dim() < 0 ? p.dim() + t.dim() : p.dim();
  DT_CHECK_ARG(!p.is_shard() || (shard_dim >= 0 && shard_dim < t.dim()), kOp, where,
               ": cannot place a tensor of shape ", t.shape(), " as ", p.to_string());
  Placements want = t.placements();
  want[static_cast<size_t>(dim)] = p.is_shard() ? Shard(shard_dim) : p;
  if (want == t.placements()) return t;
  return t.redistribute(want);
}

// Sets parameter `local_name` of `module` to its current placements with `dim`
// replaced by `p`.
void place_parameter(nn::Module& module, const std::string& local_name, int dim, const Placement& p) {
  for (const auto& [name, param] : module.named_parameters()) {
    if (name != local_name) continue;
    Placements want = param.placements();
    want[static_cast<size_t>(dim)] = p.normalized(param.dim());
    const std::string path = module.path();
    mark_replaced(param, "'" + (path.empty() ? name : path + "." + name) +
                             "' was re-laid out by parallelize_module over " + param.mesh().names()[dim]);
    NoGradGuard no_grad;
    DistTensor placed = param.redistribute(want);
    // A shard taken from a replicated parameter views the whole of it: copied, so the
    // rank keeps its shard's bytes, not the full weight's.
    const Tensor local = placed.to_local();
    if (local.storage() && local.nbytes() < local.storage()->bytes()) {
      placed = DistTensor::from_local(local.clone(), placed.mesh(), placed.placements(), placed.shape());
    }
    module.set_parameter(name, placed);
    return;
  }
}

// Tensor parallelism changes parameters' layouts, which a data-parallel wrapper
// applied earlier has taken over (FSDP's flat shards, DDP's buckets and hooks): that
// order would train silently wrong, so it is refused, naming the module.
void check_not_wrapped(nn::Module& root) {
  auto refuse = [](const nn::Module& m, const std::string& wrapper) {
    const std::string path = m.path();
    throw std::invalid_argument(std::string("[") + kOp + "] " +
                                (path.empty() ? std::string("the root module") : "module '" + path + "'") +
                                " is already wrapped by " + wrapper +
                                "; apply parallelize_module (tensor parallel) first, then fully_shard or "
                                "DistributedDataParallel over the other mesh dims (FSDP2's and TorchTitan's order)");
  };
  for (const nn::Module* m = &root; m; m = m->parent()) {
    for (const std::string& w : m->parallel_wrappers()) {
      if (w.rfind("parallelize_module", 0) != 0) refuse(*m, w);
    }
  }
  for (auto& [name, m] : root.named_modules()) {
    for (const std::string& w : m->parallel_wrappers()) {
      if (w.rfind("parallelize_module", 0) != 0) refuse(*m, w);
    }
  }
}

std::string kind_of(nn::Module& module) {
  if (dynamic_cast<nn::Linear*>(&module)) return "Linear";
  if (dynamic_cast<nn::Embedding*>(&module)) return "Embedding";
  if (dynamic_cast<nn::LayerNorm*>(&module)) return "LayerNorm";
  if (dynamic_cast<nn::RMSNorm*>(&module)) return "RMSNorm";
  if (dynamic_cast<nn::Dropout*>(&module)) return "Dropout";
  return "a module of another kind";
}

// One side (input or output) of a module under a style.
struct Side {
  DeviceMesh mesh;  // the module's mesh
  int dim = 0;      // its tensor-parallel dim
  Placement desired = Replicate();
  std::optional<Placement> expected;      // what must arrive (input_layouts / output_layouts)
  std::optional<Placement> local_layout;  // what a local piece stands for (use_local_output upstream)
  bool local_output = false;              // hand the output on as this rank's piece
  std::string where;
};

// A local piece (a DistTensor on a 1-rank mesh, what use_local_output hands on)
// lifted onto the module's mesh; anything else as it is.
DistTensor lift(const DistTensor& x, const Side& side) {
  DT_CHECK_ARG(x.defined(), kOp, side.where, ": expected a defined DistTensor");
  if (x.mesh() == side.mesh || x.mesh().size() != 1) return x;
  DT_CHECK_ARG(side.mesh.ndim() == 1, kOp, side.where, ": a local piece can be lifted onto a 1-D tensor-parallel ",
               "mesh only; the module's mesh is ", side.mesh.to_string(), " (keep DistTensors there)");
  const std::optional<Placement> layout = side.expected ? side.expected : side.local_layout;
  DT_CHECK_ARG(layout.has_value(), kOp, side.where, ": a local piece arrived; say what it is with input_layouts");
  // The global shape from the pieces' sizes (one small all-gather), never by
  // assuming even shards.
  return DistTensor::from_local(x, side.mesh, {*layout});
}

void move_input(nn::Module& module, Side side) {
  side.where += ": the input";
  module.register_forward_pre_hook([side](nn::Module&, const DistTensor& x) -> std::optional<DistTensor> {
    const bool local = x.defined() && !(x.mesh() == side.mesh) && x.mesh().size() == 1;
    return to_layout(lift(x, side), side.dim, side.desired, local ? std::nullopt : side.expected, side.where);
  });
}

void move_output(nn::Module& module, Side side) {
  side.where += ": the output";
  module.register_forward_post_hook(
      [side](nn::Module&, const DistTensor&, const DistTensor& y) -> std::optional<DistTensor> {
        const DistTensor placed = to_layout(y, side.dim, side.desired, side.expected, side.where);
        return side.local_output ? placed.as_local() : placed;
      });
}

// ---- the styles ---------------------------------------------------------------------

struct Applier {
  nn::Module& module;
  const std::string& name;
  const DeviceMesh& mesh;
  int dim;

  Side side(const std::string& style, Placement desired) const {
    Side s;
    s.mesh = mesh;
    s.dim = dim;
    s.desired = desired;
    s.where = style + " on '" + name + "'";
    return s;
  }

  void operator()(const ColwiseParallel& s) const {
    if (dynamic_cast<nn::Linear*>(&module)) {
      place_parameter(module, "weight", dim, Shard(0));
      place_parameter(module, "bias", dim, Shard(0));
    } else if (dynamic_cast<nn::Embedding*>(&module)) {
      place_parameter(module, "weight", dim, Shard(1));
    } else {
      throw std::invalid_argument("[ColwiseParallel] '" + name + "' is " + kind_of(module) +
                                  "; the style fits Linear and Embedding");
    }
    Side in = side("ColwiseParallel", Replicate());
    in.expected = s.input_layouts;
    in.local_layout = Replicate();
    move_input(module, in);
    Side out = side("ColwiseParallel", s.output_layouts.value_or(Shard(-1)));
    out.local_output = s.use_local_output;
    move_output(module, out);
  }

  void operator()(const RowwiseParallel& s) const {
    Side in = side("RowwiseParallel", Shard(-1));
    if (dynamic_cast<nn::Linear*>(&module)) {
      place_parameter(module, "weight", dim, Shard(1));
    } else if (dynamic_cast<nn::Embedding*>(&module)) {
      place_parameter(module, "weight", dim, Shard(0));
      in.desired = Replicate();
    } else {
      throw std::invalid_argument("[RowwiseParallel] '" + name + "' is " + kind_of(module) +
                                  "; the style fits Linear and Embedding");
    }
    in.expected = s.input_layouts;
    in.local_layout = in.desired;
    move_input(module, in);
    Side out = side("RowwiseParallel", s.output_layouts.value_or(Replicate()));
    out.local_output = s.use_local_output;
    move_output(module, out);
  }

  void operator()(const SequenceParallel& s) const {
    const bool fits = dynamic_cast<nn::LayerNorm*>(&module) || dynamic_cast<nn::RMSNorm*>(&module) ||
                      dynamic_cast<nn::Dropout*>(&module);
    DT_CHECK_ARG(fits, "SequenceParallel", "'", name, "' is ", kind_of(module),
                 "; the style fits LayerNorm, RMSNorm and Dropout (modules whose parameters stay replicated)");
    Side in = side("SequenceParallel", Shard(s.sequence_dim));
    in.local_layout = Shard(s.sequence_dim);
    move_input(module, in);
    Side out = side("SequenceParallel", Shard(s.sequence_dim));
    out.local_output = s.use_local_output;
    move_output(module, out);
  }

  void operator()(const PrepareModuleInput& s) const {
    Side in = side("PrepareModuleInput", s.desired_input_layouts);
    in.expected = s.input_layouts;
    move_input(module, in);
    if (s.use_local_output) {
      // The module itself gets its input as this rank's piece.
      module.register_forward_pre_hook(
          [](nn::Module&, const DistTensor& x) -> std::optional<DistTensor> { return x.as_local(); });
    }
  }

  void operator()(const ExpertParallel& s) const {
    DT_CHECK_ARG(dynamic_cast<nn::MoE*>(&module) != nullptr, "ExpertParallel", "'", name, "' is ", kind_of(module),
                 "; the style fits nn::MoE");
    place_parameter(module, "experts_up", dim, s.hidden ? Shard(1) : Shard(0));
    place_parameter(module, "experts_gate", dim, s.hidden ? Shard(1) : Shard(0));
    place_parameter(module, "experts_down", dim, s.hidden ? Shard(2) : Shard(0));
    if (s.hidden) move_input(module, side("ExpertParallel(hidden)", Replicate()));
  }

  void operator()(const PrepareModuleOutput& s) const {
    Side out = side("PrepareModuleOutput", s.desired_output_layouts);
    out.expected = s.output_layouts;
    out.local_output = s.use_local_output;
    move_output(module, out);
  }
};

bool places_parameters(const ParallelStyle& style) {
  return std::holds_alternative<ColwiseParallel>(style) || std::holds_alternative<RowwiseParallel>(style) ||
         std::holds_alternative<ExpertParallel>(style);
}

// Name components: "blocks.0.attn.q" -> {"blocks", "0", "attn", "q"}.
std::vector<std::string> components(const std::string& name) {
  std::vector<std::string> out;
  if (name.empty()) return out;
  size_t start = 0;
  for (;;) {
    const size_t dot = name.find('.', start);
    out.push_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

bool matches(const std::string& pattern, const std::string& name) {
  const std::vector<std::string> p = components(pattern), n = components(name);
  if (p.size() != n.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != "*" && p[i] != n[i]) return false;
  }
  return true;
}

// Attention heads are indivisible: a degree that does not divide them would leave a
// head split across ranks, which the per-head reshape can only serve by gathering.
void check_heads(nn::Module& root, int dim) {
  for (auto& [name, m] : root.named_modules()) {
    auto* attention = dynamic_cast<nn::SelfAttention*>(m);
    if (!attention) continue;
    for (const auto& [pname, p] : attention->named_parameters()) {
      if (!p.placements()[static_cast<size_t>(dim)].is_shard()) continue;
      const int64_t degree = p.mesh().size(dim), heads = attention->heads();
      DT_CHECK_ARG(heads % degree == 0, kOp, "'", name, "' has ", heads, " attention heads, which the tensor-parallel "
                   "degree ", degree, " does not divide (", heads, " = ", degree, " x ", heads / degree, " + ",
                   heads % degree, "); use a degree that divides ", heads);
      break;
    }
  }
}

}  // namespace

void parallelize_module(nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan) {
  const std::vector<DistTensor> params = module.parameters();
  DT_CHECK_ARG(!params.empty(), kOp, "the module has no parameters to place");
  const DeviceMesh& mesh = params[0].mesh();
  for (const DistTensor& p : params) {
    DT_CHECK_ARG(p.mesh() == mesh, kOp, "the module's parameters live on different meshes (", mesh.to_string(),
                 " and ", p.mesh().to_string(), ")");
  }
  const int dim = tp_dim_of(mesh, tp_mesh);
  check_not_wrapped(module);
  for (const DistTensor& p : params) {
    DT_CHECK_ARG(p.placements()[static_cast<size_t>(dim)].is_replicate(), kOp,
                 "expected parameters replicated on the tensor-parallel mesh dim, got ",
                 placements_to_string(p.placements()), " (is the module parallelized already?)");
  }
  std::vector<std::pair<std::string, nn::Module*>> modules = module.named_modules();
  std::vector<std::string> placed;  // modules whose parameters a style placed
  for (const auto& [pattern, style] : plan) {
    bool matched = false;
    for (auto& [name, m] : modules) {
      if (!matches(pattern, name)) continue;
      matched = true;
      if (places_parameters(style)) {
        DT_CHECK_ARG(std::find(placed.begin(), placed.end(), name) == placed.end(), kOp, "'", name,
                     "' gets two styles that place its parameters (pattern '", pattern, "' is the second)");
        placed.push_back(name);
      }
      std::visit(Applier{*m, name, mesh, dim}, style);
    }
    if (!matched) {
      std::ostringstream names;
      size_t shown = 0;
      for (const auto& [name, _] : modules) {
        if (name.empty() || shown++ >= 12) continue;
        names << (shown > 1 ? ", " : "") << name;
      }
      if (modules.size() > 13) names << ", ...";
      throw std::invalid_argument(std::string("[") + kOp + "] no module matches '" + pattern +
                                  "' (modules: " + names.str() + ")");
    }
  }
  check_heads(module, dim);
  module.add_parallel_wrapper("parallelize_module over " + mesh.names()[static_cast<size_t>(dim)]);
}

ParallelizePlan restrict_plan(const ParallelizePlan& plan, nn::Module& module) {
  const std::vector<std::pair<std::string, nn::Module*>> modules = module.named_modules();
  ParallelizePlan out;
  for (const auto& entry : plan) {
    const bool found = std::any_of(modules.begin(), modules.end(),
                                   [&](const auto& named) { return matches(entry.first, named.first); });
    if (found) out.push_back(entry);
  }
  return out;
}

std::string style_to_string(const ParallelStyle& style) {
  auto opt = [](const std::optional<Placement>& p, const char* fallback) {
    return p ? p->to_string() : std::string(fallback);
  };
  return std::visit(
      [&](const auto& s) -> std::string {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, ColwiseParallel>) {
          return "ColwiseParallel(input R, output " + opt(s.output_layouts, "S(-1)") + ")";
        } else if constexpr (std::is_same_v<S, RowwiseParallel>) {
          return "RowwiseParallel(input S(-1), output " + opt(s.output_layouts, "R") + ")";
        } else if constexpr (std::is_same_v<S, SequenceParallel>) {
          return "SequenceParallel(dim " + std::to_string(s.sequence_dim) + ")";
        } else if constexpr (std::is_same_v<S, PrepareModuleInput>) {
          return "PrepareModuleInput(" + s.desired_input_layouts.to_string() + ")";
        } else if constexpr (std::is_same_v<S, ExpertParallel>) {
          return s.hidden ? "ExpertParallel(hidden)" : "ExpertParallel";
        } else {
          return "PrepareModuleOutput(" + s.desired_output_layouts.to_string() + ")";
        }
      },
      style);
}

}  // namespace dtensor::parallel
