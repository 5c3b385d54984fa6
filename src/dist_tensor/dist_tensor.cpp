// DistTensor: accessors, printing and from_local (with or without the global shape).
#include "dtensor/dist_tensor.h"

#include <algorithm>

#include "dist_tensor/dist_tensor_impl.h"
#include "dist_tensor/step_plan_hooks.h"
#include "dtensor/error.h"
#include "mesh/mesh_index.h"
#include "util/check.h"

namespace dtensor {

namespace {

const DistTensor::Impl& defined_impl(const std::shared_ptr<DistTensor::Impl>& impl, const char* op) {
  DT_CHECK_ARG(impl != nullptr, op, "expected a defined DistTensor, got a default-constructed one");
  return *impl;
}

std::string coordinate_string(const std::vector<int64_t>& coordinate) {
  return shape_to_string(Shape(coordinate.begin(), coordinate.end()));
}

std::string sizes_string(const std::vector<int64_t>& sizes) { return shape_to_string(sizes); }

}  // namespace

const Tensor& DistTensor::to_local() const {
  const Impl& impl = defined_impl(impl_, "DistTensor::to_local");
  if (impl.plan_tag != 0) step_plan::on_observe(impl);
  return impl.local;
}
const Shape& DistTensor::shape() const { return defined_impl(impl_, "DistTensor::shape").global_shape; }
int64_t DistTensor::size(int64_t dim) const {
  const Shape& s = shape();
  return s[normalize_dim(dim, static_cast<int64_t>(s.size()), "DistTensor::size")];
}
DType DistTensor::dtype() const { return defined_impl(impl_, "DistTensor::dtype").local.dtype(); }
Device DistTensor::device() const { return defined_impl(impl_, "DistTensor::device").local.device(); }
const DeviceMesh& DistTensor::mesh() const { return defined_impl(impl_, "DistTensor::mesh").mesh; }
const Placements& DistTensor::placements() const {
  return defined_impl(impl_, "DistTensor::placements").placements;
}

std::string DistTensor::to_string() const {
  if (!impl_) return "DistTensor(undefined)";
  return detail::concat("DistTensor(shape=", impl_->global_shape, ", dtype=",
                        dtype_name(impl_->local.dtype()), ", mesh=", impl_->mesh.to_string(),
                        ", placements=", placements_to_string(impl_->placements),
                        ", local=", impl_->local.shape(), ")");
}

// ---- from_local --------------------------------------------------------------------------

namespace {

// One record per rank for the shape inference: dtype, ndim, then the local sizes.
// A fixed length lets one all_gather with known sizes carry it (no size exchange).
using mesh_index::coordinate_of;

constexpr int64_t kMaxInferDims = 16;
constexpr int64_t kRecord = 2 + kMaxInferDims;

DistTensor wrap(const Tensor& local, const DeviceMesh& mesh, Placements normalized, Shape global) {
  auto impl = std::make_shared<DistTensor::Impl>();
  impl->local = local;
  impl->mesh = mesh;
  impl->placements = std::move(normalized);
  impl->global_shape = std::move(global);
  return DistTensor(std::move(impl));
}

// The global shape that every rank's local sizes (records, in mesh row-major order)
// are pieces of. Every rank computes it from the same records, so every rank throws
// the same error when they disagree.
Shape infer_global_shape(const std::vector<int64_t>& records, const DeviceMesh& mesh,
                         const Placements& placements) {
  const char* op = "from_local";
  const int64_t ranks = mesh.size();
  auto rec = [&](int64_t r) { return records.data() + r * kRecord; };
  for (int64_t r = 1; r < ranks; ++r) {
    DT_CHECK_ARG(rec(r)[0] == rec(0)[0], op, "local tensors have different dtypes: mesh rank 0 has ",
                 dtype_name(static_cast<DType>(rec(0)[0])), ", mesh rank ", r, " has ",
                 dtype_name(static_cast<DType>(rec(r)[0])));
    DT_CHECK_ARG(rec(r)[1] == rec(0)[1], op, "local tensors have different numbers of dims: mesh rank 0 has ",
                 rec(0)[1], ", mesh rank ", r, " has ", rec(r)[1]);
  }
  const int64_t ndim = rec(0)[1];
  DT_CHECK_SUPPORTED(ndim <= kMaxInferDims, op, "inferring the global shape supports up to ",
                     kMaxInferDims, " dims, got ", ndim, "; pass the global shape");
  const Placements normalized = validate_placements(placements, mesh.ndim(), ndim, op);
  const auto nesting = shard_nesting(normalized, ndim);
  const Shape& mesh_shape = mesh.shape();

  Shape global(static_cast<size_t>(ndim));
  for (int64_t d = 0; d < ndim; ++d) {
    std::vector<int64_t> sizes(static_cast<size_t>(ranks));
    for (int64_t r = 0; r < ranks; ++r) sizes[r] = rec(r)[2 + d];
    if (nesting[d].empty()) {
      const bool same = std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s == sizes[0]; });
      DT_CHECK_ARG(same, op, "dim ", d, " is not sharded by '", placements_to_string(normalized),
                   "' but its local size differs across mesh ranks: ", sizes_string(sizes));
      global[d] = sizes[0];
      continue;
    }
    // The ranks at coordinate 0 of every mesh dim that does not shard d hold each
    // piece of d exactly once; their sizes add up to the global size.
    int64_t total = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      const auto coordinate = coordinate_of(r, mesh_shape);
      bool on_line = true;
      for (size_t m = 0; m < mesh_shape.size(); ++m) {
        const bool shards_d =
            std::find(nesting[d].begin(), nesting[d].end(), static_cast<int>(m)) != nesting[d].end();
        if (!shards_d && coordinate[m] != 0) on_line = false;
      }
      if (on_line) total += sizes[r];
    }
    global[d] = total;
  }
  // Every rank's piece must be what the chunk rule gives for that global shape;
  // otherwise the pieces were cut another way (even split with padding, by hand)
  // and wrapping them would silently misplace elements.
  for (int64_t r = 0; r < ranks; ++r) {
    const auto coordinate = coordinate_of(r, mesh_shape);
    const Shape expected = local_shape(global, mesh_shape, normalized, coordinate);
    const Shape got(rec(r) + 2, rec(r) + 2 + ndim);
    DT_CHECK_ARG(expected == got, op, "local shapes do not follow the chunk rule for '",
                 placements_to_string(normalized), "': mesh rank ", r, " at coordinate ",
                 coordinate_string(coordinate), " has ", got, ", but a global shape of ", global,
                 " gives it ", expected);
  }
  return global;
}

}  // namespace

namespace {

// FNV-1a over the piece's bytes.
int64_t bytes_hash(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

// run_check: one all-gather of (hash, dtype, ndim, sizes) per rank, then every rank
// compares each rank with the one at coordinate 0 of each Replicate or Partial mesh
// dim (same data everywhere, so every rank reaches the same verdict).
void check_consistent(const Tensor& local, const DeviceMesh& mesh, const Placements& placements) {
  const char* op = "from_local";
  DT_CHECK_ARG(static_cast<int64_t>(placements.size()) == mesh.ndim(), op, "expected ", mesh.ndim(),
               " placements (one per mesh dim), got ", placements.size());
  constexpr int64_t kFields = 3 + kMaxInferDims;
  std::vector<int64_t> record(kFields, 0);
  record[0] = bytes_hash(local);
  record[1] = static_cast<int64_t>(local.dtype());
  record[2] = local.dim();
  for (int64_t d = 0; d < std::min(local.dim(), kMaxInferDims); ++d) record[3 + d] = local.size(d);
  const std::vector<int64_t> all =
      all_gather(mesh.group(), Tensor::from_vector(record), 0, std::vector<int64_t>(mesh.size(), kFields))
          .to_vector<int64_t>();
  const Shape& mesh_shape = mesh.shape();
  for (int64_t r = 0; r < mesh.size(); ++r) {
    const std::vector<int64_t> coordinate = coordinate_of(r, mesh_shape);
    for (size_t m = 0; m < mesh_shape.size(); ++m) {
      if (placements[m].is_shard() || coordinate[m] == 0) continue;
      std::vector<int64_t> first = coordinate;
      first[m] = 0;
      int64_t q = 0;
      for (size_t k = 0; k < mesh_shape.size(); ++k) q = q * mesh_shape[k] + first[k];
      const int64_t* a = all.data() + q * kFields;
      const int64_t* b = all.data() + r * kFields;
      const bool same_meta = std::equal(a + 1, a + kFields, b + 1);
      DT_CHECK_ARG(same_meta, op, "run_check: mesh ranks ", q, " and ", r, " differ along mesh dim ", m, " (",
                   placements[m].to_string(), "), so their pieces must have one dtype and shape; they have ",
                   dtype_name(static_cast<DType>(a[1])), " ", Shape(a + 3, a + 3 + std::min(a[2], kMaxInferDims)),
                   " and ", dtype_name(static_cast<DType>(b[1])), " ",
                   Shape(b + 3, b + 3 + std::min(b[2], kMaxInferDims)));
      DT_CHECK_ARG(!placements[m].is_replicate() || a[0] == b[0], op, "run_check: mesh ranks ", q, " and ", r,
                   " differ only along mesh dim ", m, ", which is Replicate, but their pieces are not bitwise "
                   "equal; pass the same values on every rank of that dim (or place it as Partial or Shard)");
    }
  }
}

}  // namespace

DistTensor DistTensor::from_local(const Tensor& local, const DeviceMesh& mesh,
                                  const Placements& placements,
                                  const std::optional<Shape>& global_shape, FromLocalOptions options) {
  const char* op = "from_local";
  DT_CHECK_ARG(local.defined(), op, "expected a defined local tensor");
  DT_CHECK_ARG(mesh.defined() && mesh.is_member(), op, "this rank is not in mesh ",
               mesh.to_string(), "; only mesh ranks hold a DistTensor");
  if (options.run_check) check_consistent(local, mesh, placements);
  if (global_shape) {
    const Placements normalized =
        validate_placements(placements, mesh.ndim(), static_cast<int64_t>(global_shape->size()), op);
    const Shape expected = local_shape(*global_shape, mesh.shape(), normalized, mesh.coordinate());
    DT_CHECK_ARG(local.shape() == expected, op, "local shape ", local.shape(),
                 " does not match global shape ", *global_shape, " under '",
                 placements_to_string(normalized), "' at mesh coordinate ",
                 coordinate_string(mesh.coordinate()), ": expected local shape ", expected);
    return wrap(local, mesh, normalized, *global_shape);
  }
  // The count is the same on every rank (the placements are), so checking it before
  // the collective cannot leave some ranks waiting in it.
  DT_CHECK_ARG(static_cast<int64_t>(placements.size()) == mesh.ndim(), op, "expected ", mesh.ndim(),
               " placements (one per mesh dim), got ", placements.size(), ": '",
               placements_to_string(placements), "'");
  // Everything else is checked after the gather, from the same data on every rank,
  // so a bad local tensor on one rank fails on all of them instead of hanging.
  std::vector<int64_t> record(kRecord, 0);
  record[0] = static_cast<int64_t>(local.dtype());
  record[1] = local.dim() <= kMaxInferDims ? local.dim() : kMaxInferDims + 1;
  for (int64_t d = 0; d < std::min(local.dim(), kMaxInferDims); ++d) record[2 + d] = local.size(d);
  const Tensor mine = Tensor::from_vector(record);
  const Tensor gathered = all_gather(mesh.group(), mine, 0, std::vector<int64_t>(mesh.size(), kRecord));
  const Shape global = infer_global_shape(gathered.to_vector<int64_t>(), mesh, placements);
  const Placements normalized =
      validate_placements(placements, mesh.ndim(), static_cast<int64_t>(global.size()), op);
  return wrap(local, mesh, normalized, global);
}

}  // namespace dtensor
