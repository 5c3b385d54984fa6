// Sorting: argsort (stable), topk on top of it, bincount. The kernels sort along the
// last dim of a contiguous [rows, n] in F64 or I64; every other dtype widens to one
// of them exactly, and other dims move last and back.
#include "backend/kernels.h"
#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor {
namespace {

// `a` with `dim` moved last, widened and made contiguous as [rows, n].
Tensor sort_operand(const Tensor& a, int dim) {
  const Tensor last = a.transpose(dim, a.dim() - 1);
  const DType wide = is_floating(a.dtype()) ? DType::F64 : DType::I64;
  const int64_t n = a.size(dim);
  return last.to(wide).contiguous().reshape({n == 0 ? 0 : a.numel() / n, n});
}

// [rows, n] back to a's shape with the sorted dim at `dim`.
Tensor restore(const Tensor& rows, const Tensor& a, int dim, int64_t n) {
  Shape moved = a.shape();
  std::swap(moved[static_cast<size_t>(dim)], moved.back());
  moved.back() = n;
  return rows.reshape(moved).transpose(dim, a.dim() - 1).contiguous();
}

}  // namespace

Tensor argsort(const Tensor& a, int64_t dim, bool descending) {
  const char* op = "argsort";
  DT_CHECK_ARG(a.defined(), op, "expected a defined tensor, got an undefined one");
  if (a.dim() == 0) return Tensor::zeros({}, DType::I64, a.device());
  const int d = normalize_dim(dim, a.dim(), op);
  const Tensor in = sort_operand(a, d);
  Tensor out = Tensor::empty(in.shape(), DType::I64, a.device());
  if (in.numel() > 0) backend::kernels_for(a.device()).argsort(in, descending, out);
  return restore(out, a, d, a.size(d));
}

TopK topk(const Tensor& a, int64_t k, int64_t dim) {
  const char* op = "topk";
  DT_CHECK_ARG(a.defined(), op, "expected a defined tensor, got an undefined one");
  const Tensor t = a.dim() == 0 ? a.reshape({1}) : a;
  const int d = normalize_dim(dim, t.dim(), op);
  const int64_t n = t.size(d);
  DT_CHECK_ARG(k >= 0 && k <= n, op, "expected 0 <= k <= ", n, " (the size of dim ", d, "), got k = ", k);
  const Tensor in = sort_operand(t, d);
  const int64_t rows = in.size(0);
  Tensor order = Tensor::empty(in.shape(), DType::I64, t.device());
  if (in.numel() > 0) backend::kernels_for(t.device()).argsort(in, /*descending=*/true, order);
  const Tensor indices = order.narrow(1, 0, k).contiguous();  // [rows, k]
  // The values: one row gather from a flattened [rows * n, 1] by the flat positions
  // (masked: in range by construction, so no host-side check of GPU indices).
  const Tensor flat = add(indices, mul(Tensor::arange(rows, DType::I64, t.device()).reshape({rows, 1}), n));
  const Tensor source = t.transpose(d, t.dim() - 1).contiguous().reshape({rows * n, 1});
  const Tensor values = embedding(source, flat.reshape({-1}), /*masked=*/true).reshape({rows, k});
  TopK out{restore(values, t, d, k), restore(indices, t, d, k)};
  if (a.dim() == 0 && k == 1) out = {out.values.reshape({}), out.indices.reshape({})};
  return out;
}

Tensor bincount(const Tensor& ids, int64_t bins) {
  const char* op = "bincount";
  DT_CHECK_ARG(ids.defined(), op, "expected defined ids, got an undefined tensor");
  DT_CHECK_ARG(ids.dim() == 1, op, "expected 1-D ids, got shape ", ids.shape());
  DT_CHECK_ARG(ids.dtype() == DType::I64 || ids.dtype() == DType::I32, op, "expected ids of dtype i64 or i32, got ",
               dtype_name(ids.dtype()));
  DT_CHECK_ARG(bins >= 0, op, "expected bins >= 0, got ", bins);
  Tensor counts = Tensor::zeros({bins}, DType::I64, ids.device());
  backend::kernels_for(ids.device()).bincount(ids.contiguous(), counts);
  return counts;
}

}  // namespace dtensor
