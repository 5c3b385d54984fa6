// The local boundary with autograd (DistTensor::as_local, the DistTensor form of
// from_local) and local_map on top of it.
#include "dtensor/local_map.h"

#include "dist_tensor/dispatch.h"
#include "dtensor/autograd.h"
#include "util/check.h"

namespace dtensor {
namespace {

Placements partials_replicated(Placements placements) {
  for (Placement& p : placements) {
    if (p.is_partial()) p = Replicate();
  }
  return placements;
}

// A piece as a tensor of its own on a 1-rank mesh.
DistTensor on_local_mesh(const Tensor& piece, const DeviceMesh& mesh) {
  return dispatch::wrap(piece, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()), piece.shape());
}

}  // namespace

DistTensor DistTensor::as_local(const std::optional<Placements>& grad_placements) const {
  const char* op = "as_local";
  DT_CHECK_ARG(defined(), op, "expected a defined DistTensor");
  DT_CHECK_ARG(mesh().is_member(), op, "this rank is not in mesh ", mesh().to_string(), ": it holds no piece");
  const Placements back =
      grad_placements ? validate_placements(*grad_placements, mesh().ndim(), dim(), op) : placements();
  DistTensor out = on_local_mesh(to_local(), local_mesh());
  if (!autograd::needs_grad({*this})) return out;
  const DeviceMesh source_mesh = mesh();
  const Shape global = shape();
  std::vector<DistTensor> outs{out};
  autograd::record("as_local", {*this}, outs, [source_mesh, back, global](const std::vector<DistTensor>& g) {
    // On a 1-rank mesh every placement holds the whole piece.
    return std::vector<DistTensor>{DistTensor::from_local(g[0].to_local(), source_mesh, back, global)};
  });
  return outs[0];
}

DistTensor DistTensor::from_local(const DistTensor& local, const DeviceMesh& mesh, const Placements& placements,
                                  const std::optional<Shape>& global_shape, FromLocalOptions options) {
  const char* op = "from_local";
  DT_CHECK_ARG(local.defined() && local.mesh().is_member() && local.mesh().size() == 1, op,
               "expected a piece on local_mesh() (a 1-rank mesh), got ",
               local.defined() ? local.mesh().to_string() : std::string("an undefined DistTensor"));
  DistTensor out = from_local(local.to_local(), mesh, placements, global_shape, options);
  if (!autograd::needs_grad({local})) return out;
  const Placements whole = partials_replicated(out.placements());
  const DeviceMesh piece_mesh = local.mesh();
  std::vector<DistTensor> outs{out};
  autograd::record("from_local", {local}, outs, [whole, piece_mesh](const std::vector<DistTensor>& g) {
    return std::vector<DistTensor>{on_local_mesh(g[0].redistribute(whole).to_local(), piece_mesh)};
  });
  return outs[0];
}

std::vector<DistTensor> local_map(const LocalMapFn& fn, const std::vector<Placements>& out_placements,
                                  const std::vector<Placements>& in_placements, const std::vector<DistTensor>& inputs,
                                  const LocalMapOptions& options) {
  const char* op = "local_map";
  DT_CHECK_ARG(fn != nullptr, op, "expected a function");
  DT_CHECK_ARG(in_placements.size() == inputs.size(), op, "expected one placement list per input (",
               inputs.size(), "), got ", in_placements.size());
  DT_CHECK_ARG(!out_placements.empty(), op, "expected placements for at least one output");
  DT_CHECK_ARG(options.in_grad_placements.empty() || options.in_grad_placements.size() == inputs.size(), op,
               "in_grad_placements needs one entry per input (", inputs.size(), "), got ",
               options.in_grad_placements.size());
  DT_CHECK_ARG(options.out_shapes.empty() || options.out_shapes.size() == out_placements.size(), op,
               "out_shapes needs one shape per output (", out_placements.size(), "), got ", options.out_shapes.size());
  const DeviceMesh& mesh = dispatch::common_mesh(inputs, op);
  for (const Placements& out : out_placements) {
    DT_CHECK_ARG(static_cast<int>(out.size()) == mesh.ndim(), op, "expected ", mesh.ndim(),
                 " placements per output (one per mesh dim), got '", placements_to_string(out), "'");
  }

  std::vector<DistTensor> locals;
  for (size_t j = 0; j < inputs.size(); ++j) {
    const Placements target = validate_placements(in_placements[j], mesh.ndim(), inputs[j].dim(), op);
    DistTensor moved = inputs[j];
    if (moved.placements() != target) {
      DT_CHECK_ARG(options.redistribute_inputs, op, "input ", j, " is ", placements_to_string(moved.placements()),
                   ", in_placements says ", placements_to_string(target), " (redistribute_inputs is off)");
      moved = moved.redistribute(target);
    }
    std::optional<Placements> grad = options.in_grad_placements.empty() ? std::nullopt : options.in_grad_placements[j];
    if (!grad) {
      grad = target;
      for (size_t m = 0; m < target.size(); ++m) {
        if (target[m].is_partial()) (*grad)[m] = Replicate();
        if (!target[m].is_replicate()) continue;
        for (const Placements& out : out_placements) {
          if (!out[m].is_replicate()) (*grad)[m] = Partial();
        }
      }
    }
    locals.push_back(moved.as_local(grad));
  }

  const std::vector<DistTensor> pieces = fn(locals);
  DT_CHECK_ARG(pieces.size() == out_placements.size(), op, "the function returned ", pieces.size(),
               " outputs, out_placements has ", out_placements.size());
  std::vector<DistTensor> outs;
  for (size_t k = 0; k < pieces.size(); ++k) {
    DT_CHECK_ARG(pieces[k].defined() && pieces[k].mesh().size() == 1, op, "output ", k,
                 " must be a piece on local_mesh() (compute it from the pieces the function got), got ",
                 pieces[k].defined() ? pieces[k].mesh().to_string() : std::string("an undefined DistTensor"));
    const std::optional<Shape> shape = options.out_shapes.empty() ? std::nullopt : std::optional(options.out_shapes[k]);
    outs.push_back(DistTensor::from_local(pieces[k], mesh, out_placements[k], shape));
  }
  return outs;
}

}  // namespace dtensor
