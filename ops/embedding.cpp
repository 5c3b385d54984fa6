// embedding on DistTensors: table [V, D], integer ids of any shape -> [..., D].
//
// Rule "vd,<ids letters>-><ids letters>d" (einsum): per mesh dim
// - table sharded on rows (vocab-parallel, Megatron): ids replicated, each rank looks
//   up the ids in its row range (ids - offset, masked: others give zero rows) ->
//   output Partial(sum), one all-reduce whenever the value is needed;
// - table sharded on columns: output sharded on its last dim;
// - ids sharded (batch / sequence): output sharded on the same dims;
// - table Partial: passes through (the lookup is linear in the table).
// Backward to the table: embedding_backward (a scatter-add) in the table's layout
// (masked, with the row offset, for vocab-parallel); it is Partial(sum) over mesh
// dims that shard the ids (each rank summed only its ids' rows).
#include "ops/nn_helpers.h"
#include "util/check.h"

namespace dtensor {

DistTensor embedding(const DistTensor& table, const DistTensor& ids) {
  const char* op = "embedding";
  const DeviceMesh& mesh = dispatch::common_mesh({table, ids}, op);
  DT_CHECK_ARG(table.dim() == 2, op, "expected a table [V, D], got ", table.shape());
  DT_CHECK_ARG(is_floating(table.dtype()), op, "expected a floating table, got ", dtype_name(table.dtype()));
  DT_CHECK_ARG(ids.dtype() == DType::I64 || ids.dtype() == DType::I32, op, "expected ids of dtype i64 or i32, got ",
               dtype_name(ids.dtype()));
  const int64_t rows = table.size(0);

  dispatch::EinsumSpec spec;
  const std::string id_letters = ops::letters(ids.dim());
  spec.inputs = {"VD", id_letters};
  spec.output = id_letters + "D";
  spec.partial = dispatch::PartialRule::OneOf;
  spec.partial_inputs = {true, false};
  const ops::Placed placed = ops::place_inputs(op, {}, {table, ids}, spec);
  const Placements& table_placements = placed.strategy.inputs[0];
  const Tensor& table_local = placed.locals[0];
  const Tensor& ids_local = placed.locals[1];
  // A replicated row range still gets its ids checked here: with masking on, an id
  // out of [0, V) would otherwise silently give a zero row on every rank.
  const bool vocab_parallel = ops::is_sharded_on(table_placements, 0);
  if (vocab_parallel && ids_local.numel() > 0) {
    const int64_t low = amin(ids_local).to(DType::I64).item<int64_t>();
    const int64_t high = amax(ids_local).to(DType::I64).item<int64_t>();
    DT_CHECK_ARG(low >= 0 && high < rows, op, "expected ids in [0, ", rows, "), got ids in [", low, ", ", high, "]");
  }
  const int64_t offset = ops::shard_offset(mesh, table.shape(), table_placements, 0);
  const Tensor shifted_ids = offset == 0 ? ids_local : sub(ids_local, static_cast<double>(offset));
  Shape out_shape = ids.shape();
  out_shape.push_back(table.size(1));
  DistTensor out = dispatch::wrap(embedding(table_local, shifted_ids, vocab_parallel), mesh, placed.strategy.output,
                                  out_shape);
  if (!autograd::needs_grad({table})) return out;

  // The gradient of a Partial output is replicated there; elsewhere the output's layout.
  const Placements grad_layout = ops::partials_replicated(placed.strategy.output);
  Placements table_grad_layout = table_placements;
  for (size_t m = 0; m < table_grad_layout.size(); ++m) {
    Placement& p = table_grad_layout[m];
    if (p.is_partial()) p = Replicate();  // every part of a Partial table has the full gradient
    if (!p.is_shard() && placed.strategy.inputs[1][m].is_shard()) p = Partial();
  }
  const int64_t local_rows = table_local.size(0);
  const Shape table_shape = table.shape();
  return ops::with_grad(out, op, {table, ids}, [=](const std::vector<DistTensor>& g) {
    const DistTensor grad = g[0].redistribute(grad_layout);  // free when already there
    const Tensor local = embedding_backward(grad.to_local(), shifted_ids, local_rows, vocab_parallel);
    return std::vector<DistTensor>{dispatch::wrap(local, grad.mesh(), table_grad_layout, table_shape), DistTensor()};
  });
}

}  // namespace dtensor
