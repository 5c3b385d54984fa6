// scaled_dot_product_attention on DistTensors: softmax(q k^T / sqrt(Dh) + mask) v.
//
// A composite of matmul, where, softmax and matmul, so each step takes its own
// sharding rule: heads (or any batch dim) sharded -> every step is local; the
// query sequence sharded -> local too (the mask is replicated and chunked for
// free); the key sequence sharded -> the softmax runs along a sharded dim with
// all-reduces of its statistics, and the last matmul contracts a sharded dim
// (Partial(sum)); Dh sharded -> the scores are Partial(sum) and reduced once.
#include <cmath>
#include <limits>

#include "ops/nn_helpers.h"

namespace dtensor {

DistTensor scaled_dot_product_attention(const DistTensor& q, const DistTensor& k, const DistTensor& v, bool causal) {
  const char* op = "scaled_dot_product_attention";
  const DeviceMesh& mesh = dispatch::common_mesh({q, k, v}, op);
  DT_CHECK_ARG(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op, "expected q, k, v of shape [..., S, D], got ",
               q.shape(), ", ", k.shape(), ", ", v.shape());
  DT_CHECK_ARG(q.dtype() == k.dtype() && k.dtype() == v.dtype() && is_floating(q.dtype()), op,
               "expected q, k, v of one floating dtype, got ", dtype_name(q.dtype()), ", ", dtype_name(k.dtype()),
               ", ", dtype_name(v.dtype()));
  DT_CHECK_ARG(q.size(-1) == k.size(-1), op, "expected q and k with one head dim, got q ", q.shape(), " and k ",
               k.shape());
  DT_CHECK_ARG(k.size(-2) == v.size(-2), op, "expected k and v with one sequence length, got k ", k.shape(),
               " and v ", v.shape());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  DistTensor scores = mul(matmul(q, transpose(k, -1, -2)), scale);
  if (causal) {
    // Query i sees keys j <= i (top-left aligned, as PyTorch's is_causal). The mask
    // is small and built on every rank: a replicated operand costs nothing to chunk.
    const int64_t queries = q.size(-2), keys = k.size(-2);
    const Tensor allowed = le(Tensor::arange(keys).unsqueeze(0), Tensor::arange(queries).unsqueeze(1));
    const Placements replicated(static_cast<size_t>(mesh.ndim()), Replicate());
    const DistTensor masked_value =
        full({}, -std::numeric_limits<double>::infinity(), mesh, replicated, scores.dtype());
    scores = where(distribute(allowed.to(q.device()), mesh, replicated), scores, masked_value);
  }
  return matmul(softmax(scores, -1), v);
}

}  // namespace dtensor
