// ImplicitReplication: where plain Tensors may join DistTensor ops as replicated.
#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {
namespace {
thread_local bool implicit_replication = false;
}  // namespace

ImplicitReplication::ImplicitReplication() : previous_(implicit_replication) { implicit_replication = true; }
ImplicitReplication::~ImplicitReplication() { implicit_replication = previous_; }
bool ImplicitReplication::active() { return implicit_replication; }

DistTensor implicit_replicate(const Tensor& t, const DeviceMesh& mesh, const char* op) {
  DT_CHECK_ARG(implicit_replication, op, "expected DistTensor operands, got a plain Tensor of shape ",
               t.shape(), "; wrap it with distribute(...) or use an ImplicitReplication scope to treat "
               "it as replicated");
  return DistTensor::from_local(t, mesh, Placements(mesh.ndim(), Replicate()), t.shape());
}

}  // namespace dtensor
