// DistTensor: accessors, printing and from_local (with or without the global shape).
#include "dtensor/dist_tensor.h"

#include <algorithm>

#include "dtensor/error.h"
#include "mesh/mesh_index.h"

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

const Tensor& DistTensor::to_local() const { return defined_impl(impl_, "DistTensor::to_local").local; }
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

DistTensor DistTensor::from_local(const Tensor& local, const DeviceMesh& mesh,
                                  const Placements& placements,
                                  const std::optional<Shape>& global_shape) {
  const char* op = "from_local";
  DT_CHECK_ARG(local.defined(), op, "expected a defined local tensor");
  DT_CHECK_ARG(mesh.defined() && mesh.is_member(), op, "this rank is not in mesh ",
               mesh.to_string(), "; only mesh ranks hold a DistTensor");
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
