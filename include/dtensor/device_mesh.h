// DeviceMesh: an N-D grid of ranks with named dims and one communication group per
// dim.
//
//   DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});   // ranks 0..3, row-major
//   mesh.coordinate();          // {1, 0} on rank 2
//   mesh.group("tp");           // the 2 ranks that differ only in "tp"
//   mesh["tp"];                 // the 1-D sub-mesh along tp through this rank
//   mesh.to_string();           // "dp=2,tp=2"
//
// Building a mesh is collective over the world group (it splits it once per dim);
// so are slice() of several dims and flatten(). A rank outside an explicit rank
// list still takes part in the construction and gets a mesh with is_member()
// false, on which no tensor can live.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/group.h"
#include "dtensor/tensor.h"

namespace dtensor {

class DeviceMesh {
 public:
  DeviceMesh() = default;
  // The first prod(shape) ranks of `world`, row-major. Names default to
  // "d0", "d1", ...
  DeviceMesh(const Group& world, const Shape& shape, const std::vector<std::string>& names = {});
  // An explicit list of world ranks laid out row-major over `shape`. A named
  // factory rather than a constructor: `DeviceMesh(world, {2, 2}, {"dp", "tp"})`
  // must not be ambiguous.
  static DeviceMesh from_ranks(const Group& world, const std::vector<int>& ranks,
                               const Shape& shape, const std::vector<std::string>& names = {});

  bool defined() const { return impl_ != nullptr; }
  int ndim() const;
  const Shape& shape() const;
  int64_t size() const;  // number of ranks
  int64_t size(int dim) const;
  int64_t size(std::string_view name) const;
  const std::vector<std::string>& names() const;
  int dim_index(std::string_view name) const;  // throws listing the names

  bool is_member() const;                      // this rank is in the mesh
  const std::vector<int64_t>& coordinate() const;  // this rank's coordinate
  int64_t coordinate(int dim) const;
  const std::vector<int>& ranks() const;       // world ranks, row-major
  int rank_at(const std::vector<int64_t>& coordinate) const;  // world rank
  int64_t linear_index() const;  // this rank's row-major index in the mesh

  const Group& group(int dim) const;
  const Group& group(std::string_view name) const;
  const Group& group() const;  // every rank of the mesh, ordered row-major
  const Group& world() const;

  // The 1-D sub-mesh along `name` through this rank (no communication).
  DeviceMesh operator[](std::string_view name) const;
  // The sub-mesh over the named dims through this rank, in the given order.
  DeviceMesh slice(const std::vector<std::string>& names) const;
  // The named (adjacent, in order) dims merged into one dim called `new_name`
  // (default: the names joined by '_').
  DeviceMesh flatten(const std::vector<std::string>& names, const std::string& new_name = "") const;

  std::string to_string() const;  // "dp=2,tp=2"
  // Same ranks in the same shape over the same world.
  bool operator==(const DeviceMesh& other) const;

  struct Impl;

 private:
  explicit DeviceMesh(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// The calling rank alone, as a 1-rank mesh with one dim "local" (no communication;
// the same mesh on every call from this rank). A DistTensor on it is one rank's
// piece as a tensor of its own: ops on it never communicate. DistTensor::as_local
// and the DistTensor form of from_local move between a mesh and it, with autograd
// (PyTorch's to_local/from_local on plain tensors); local_map runs functions on it.
const DeviceMesh& local_mesh();

// A mesh layout as written on command lines and printed by to_string(): "dp=2,tp=4"
// (spaces around names, '=' and ',' allowed). DeviceMesh(world, spec.shape,
// spec.names) builds it; its to_string() gives the canonical text back.
struct MeshSpec {
  Shape shape;
  std::vector<std::string> names;
  std::string to_string() const;              // "dp=2,tp=4"
  int64_t size(std::string_view name) const;  // 1 when the mesh has no such dim
};
// std::invalid_argument naming the position and what was expected: sizes are
// integers >= 1, names non-empty without ',', '=' or spaces, and distinct.
MeshSpec parse_mesh_spec(std::string_view text);

}  // namespace dtensor
