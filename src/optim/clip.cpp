// Global gradient norm across shards, and clipping by it.
//
// sum(square(g)) of a gradient sharded over some mesh dims is Partial(sum) there
// (each rank holds the sum over its shard) and an ordinary value on replicated dims,
// so redistributing it to Replicate counts every element exactly once. Gradients
// with equal (mesh, layout) are summed locally first, so the whole norm costs one
// scalar all-reduce per distinct layout instead of one per parameter.
#include <algorithm>
#include <cmath>

#include "dist_tensor/dist_tensor_impl.h"
#include "dtensor/autograd.h"
#include "dtensor/ops.h"
#include "dtensor/optim.h"
#include "util/check.h"

namespace dtensor {

namespace {

struct NormGroup {
  DeviceMesh mesh;
  Placements placements;  // of the per-gradient sums
  double local_sum = 0;
};

}  // namespace

double grad_norm(const std::vector<DistTensor>& params) {
  NoGradGuard no_grad;
  std::vector<NormGroup> groups;
  for (const DistTensor& p : params) {
    const DistTensor g = gradient_in_param_layout(p);
    if (!g.defined()) continue;
    // F32 at least: squares of BF16/F16 gradients would overflow or round away.
    const DType dtype = g.dtype() == DType::F64 ? DType::F64 : DType::F32;
    const DistTensor sq = sum(square(g.to(dtype)));
    const double local = sq.to_local().item<double>();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const NormGroup& group) {
      return group.mesh == sq.mesh() && group.placements == sq.placements();
    });
    if (it == groups.end()) {
      groups.push_back({sq.mesh(), sq.placements(), local});
    } else {
      it->local_sum += local;
    }
  }
  double total = 0;
  for (const NormGroup& group : groups) {
    const DistTensor partial = DistTensor::from_local(Tensor::scalar(group.local_sum, DType::F64),
                                                      group.mesh, group.placements, Shape{});
    const Placements replicated(group.placements.size(), Replicate());
    total += group.placements == replicated ? group.local_sum
                                            : partial.redistribute(replicated).to_local().item<double>();
  }
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<DistTensor>& params, double max_norm) {
  DT_CHECK_ARG(max_norm > 0, "clip_grad_norm", "expected max_norm > 0, got ", max_norm);
  return clip_grad_norm(params, max_norm, grad_norm(params));
}

double clip_grad_norm(const std::vector<DistTensor>& params, double max_norm, double total) {
  DT_CHECK_ARG(max_norm > 0, "clip_grad_norm", "expected max_norm > 0, got ", max_norm);
  if (!std::isfinite(total)) return total;
  // The 1e-6 keeps a zero norm from dividing by zero, as torch.nn.utils.clip_grad_norm_.
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient >= 1.0) return total;
  for (const DistTensor& p : params) {
    const DistTensor g = p.grad();
    if (!g.defined()) continue;
    Tensor local = local_of(g);  // scaling is linear: right in any layout
    local.copy_(mul(local, coefficient));
  }
  return total;
}

}  // namespace dtensor
