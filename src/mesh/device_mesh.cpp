// DeviceMesh: the rank grid, its per-dim groups, sub-meshes and flattening.
//
// Every group of a mesh is made by one split, so building a mesh of k dims costs
// k + 1 splits of the world; operator[] and slice/flatten reuse the parent's dim
// groups and split the mesh group only for the one new group they need.
#include "dtensor/device_mesh.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "comm/comm_backend.h"
#include "dtensor/error.h"
#include "mesh/mesh_index.h"
#include "util/check.h"

namespace dtensor {

struct DeviceMesh::Impl {
  Group world;
  Shape shape;
  std::vector<std::string> names;
  std::vector<int> ranks;          // world ranks, row-major over shape
  bool member = false;             // this world rank is in `ranks`
  std::vector<int64_t> coordinate;  // empty when not a member
  int64_t linear_index = -1;
  std::vector<Group> dim_groups;   // undefined when not a member
  Group mesh_group;
};

namespace {

using mesh_index::coordinate_of;
using mesh_index::index_over;

std::vector<int> all_dims_except(int ndim, const std::vector<int>& excluded) {
  std::vector<int> dims;
  for (int d = 0; d < ndim; ++d) {
    if (std::find(excluded.begin(), excluded.end(), d) == excluded.end()) dims.push_back(d);
  }
  return dims;
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += separator;
    out += parts[i];
  }
  return out;
}

std::string ranks_to_string(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out + "]";
}

std::vector<std::string> checked_names(const std::vector<std::string>& names, size_t ndim) {
  if (names.empty()) {
    std::vector<std::string> defaults;
    for (size_t d = 0; d < ndim; ++d) defaults.push_back(detail::concat("d", d));
    return defaults;
  }
  DT_CHECK_ARG(names.size() == ndim, "DeviceMesh", "expected ", ndim,
               " dim names (one per mesh dim), got ", names.size(), ": ", join(names, ","));
  std::set<std::string> seen;
  for (const auto& name : names) {
    // ',' and '=' would make to_string() ambiguous ("dp=2,tp=2").
    DT_CHECK_ARG(!name.empty() && name.find_first_of(",= ") == std::string::npos, "DeviceMesh",
                 "expected dim names without ',', '=' or spaces, got '", name, "'");
    DT_CHECK_ARG(seen.insert(name).second, "DeviceMesh", "duplicate dim name '", name, "' in ",
                 join(names, ","));
  }
  return names;
}

// Builds every group of a mesh over `ranks` of `world` (collective over world).
std::shared_ptr<DeviceMesh::Impl> build(const Group& world, std::vector<int> ranks,
                                        const Shape& shape, std::vector<std::string> names) {
  auto impl = std::make_shared<DeviceMesh::Impl>();
  impl->world = world;
  impl->shape = shape;
  impl->names = std::move(names);
  impl->ranks = std::move(ranks);
  const int ndim = static_cast<int>(shape.size());
  const auto it = std::find(impl->ranks.begin(), impl->ranks.end(), world.rank());
  impl->member = it != impl->ranks.end();
  if (impl->member) {
    impl->linear_index = it - impl->ranks.begin();
    impl->coordinate = coordinate_of(impl->linear_index, shape);
  }
  // One split per dim: the ranks that agree on every other coordinate form the
  // group, ordered by their coordinate on the dim. Non-members still take part
  // (split is collective over world) with color -1.
  impl->dim_groups.resize(ndim);
  for (int d = 0; d < ndim; ++d) {
    const int color =
        impl->member ? static_cast<int>(index_over(impl->coordinate, shape, all_dims_except(ndim, {d})))
                     : -1;
    const int key = impl->member ? static_cast<int>(impl->coordinate[d]) : 0;
    impl->dim_groups[d] = world.split(color, key);
    // Named after the dim ("tp"; "world/c1/tp" on a mesh over a split group), so that
    // errors and CommDebugMode say which mesh dim communicated.
    if (impl->dim_groups[d].defined()) {
      const std::string& dim = impl->names[static_cast<size_t>(d)];
      impl->dim_groups[d].impl()->set_name(world.name() == "world" ? dim : world.name() + "/" + dim);
    }
  }
  impl->mesh_group =
      world.split(impl->member ? 0 : -1, impl->member ? static_cast<int>(impl->linear_index) : 0);
  return impl;
}

void check_shape(const Shape& shape) {
  DT_CHECK_ARG(!shape.empty(), "DeviceMesh", "expected a mesh shape with at least one dim, got []");
  for (int64_t s : shape) {
    DT_CHECK_ARG(s >= 1, "DeviceMesh", "expected mesh dims of size >= 1, got shape ", shape);
  }
}

}  // namespace

DeviceMesh::DeviceMesh(const Group& world, const Shape& shape, const std::vector<std::string>& names) {
  DT_CHECK_ARG(world.defined(), "DeviceMesh", "expected a defined world group");
  check_shape(shape);
  const int64_t count = shape_numel(shape);
  DT_CHECK_ARG(count <= world.size(), "DeviceMesh", "mesh shape ", shape, " needs ", count,
               " ranks, but the world group has ", world.size());
  std::vector<int> ranks(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) ranks[i] = static_cast<int>(i);
  impl_ = build(world, std::move(ranks), shape, checked_names(names, shape.size()));
}

DeviceMesh DeviceMesh::from_ranks(const Group& world, const std::vector<int>& ranks,
                                  const Shape& shape, const std::vector<std::string>& names) {
  DT_CHECK_ARG(world.defined(), "DeviceMesh", "expected a defined world group");
  check_shape(shape);
  DT_CHECK_ARG(static_cast<int64_t>(ranks.size()) == shape_numel(shape), "DeviceMesh",
               "mesh shape ", shape, " needs ", shape_numel(shape), " ranks, got ", ranks.size(),
               ": ", ranks_to_string(ranks));
  std::set<int> seen;
  for (int r : ranks) {
    DT_CHECK_ARG(r >= 0 && r < world.size(), "DeviceMesh", "rank ", r,
                 " is out of range for a world of ", world.size(), " ranks in ",
                 ranks_to_string(ranks));
    DT_CHECK_ARG(seen.insert(r).second, "DeviceMesh", "rank ", r, " appears twice in ",
                 ranks_to_string(ranks));
  }
  return DeviceMesh(build(world, ranks, shape, checked_names(names, shape.size())));
}

namespace {
const DeviceMesh::Impl& defined_impl(const std::shared_ptr<const DeviceMesh::Impl>& impl,
                                     const char* op) {
  DT_CHECK_ARG(impl != nullptr, op, "expected a defined mesh, got a default-constructed one");
  return *impl;
}

// For what only a rank inside the mesh has (coordinate, groups).
const DeviceMesh::Impl& member_impl(const std::shared_ptr<const DeviceMesh::Impl>& impl,
                                    const char* op) {
  const auto& m = defined_impl(impl, op);
  DT_CHECK_ARG(m.member, op, "world rank ", m.world.rank(), " is not in the mesh (ranks ",
               ranks_to_string(m.ranks), ")");
  return m;
}

int checked_dim(const DeviceMesh::Impl& m, int64_t dim, const char* op) {
  const auto ndim = static_cast<int64_t>(m.shape.size());
  DT_CHECK_ARG(dim >= -ndim && dim < ndim, op, "mesh dim ", dim, " out of range for a mesh of ",
               ndim, " dims");
  return static_cast<int>(dim < 0 ? dim + ndim : dim);
}
}  // namespace

int DeviceMesh::ndim() const { return static_cast<int>(defined_impl(impl_, "DeviceMesh::ndim").shape.size()); }
const Shape& DeviceMesh::shape() const { return defined_impl(impl_, "DeviceMesh::shape").shape; }
int64_t DeviceMesh::size() const {
  return static_cast<int64_t>(defined_impl(impl_, "DeviceMesh::size").ranks.size());
}
int64_t DeviceMesh::size(int dim) const {
  const auto& m = defined_impl(impl_, "DeviceMesh::size");
  return m.shape[checked_dim(m, dim, "DeviceMesh::size")];
}
int64_t DeviceMesh::size(std::string_view name) const { return size(dim_index(name)); }
const std::vector<std::string>& DeviceMesh::names() const {
  return defined_impl(impl_, "DeviceMesh::names").names;
}

int DeviceMesh::dim_index(std::string_view name) const {
  const auto& m = defined_impl(impl_, "DeviceMesh::dim_index");
  const auto it = std::find(m.names.begin(), m.names.end(), name);
  DT_CHECK_ARG(it != m.names.end(), "DeviceMesh", "unknown mesh dim '", name,
               "'; valid names: ", join(m.names, ", "));
  return static_cast<int>(it - m.names.begin());
}

bool DeviceMesh::is_member() const { return defined_impl(impl_, "DeviceMesh::is_member").member; }
const std::vector<int64_t>& DeviceMesh::coordinate() const {
  return member_impl(impl_, "DeviceMesh::coordinate").coordinate;
}
int64_t DeviceMesh::coordinate(int dim) const {
  const auto& m = member_impl(impl_, "DeviceMesh::coordinate");
  return m.coordinate[checked_dim(m, dim, "DeviceMesh::coordinate")];
}
const std::vector<int>& DeviceMesh::ranks() const { return defined_impl(impl_, "DeviceMesh::ranks").ranks; }

int DeviceMesh::rank_at(const std::vector<int64_t>& coordinate) const {
  const auto& m = defined_impl(impl_, "DeviceMesh::rank_at");
  DT_CHECK_ARG(coordinate.size() == m.shape.size(), "DeviceMesh::rank_at", "expected a coordinate of ",
               m.shape.size(), " dims, got ", Shape(coordinate.begin(), coordinate.end()));
  int64_t index = 0;
  for (size_t d = 0; d < coordinate.size(); ++d) {
    DT_CHECK_ARG(coordinate[d] >= 0 && coordinate[d] < m.shape[d], "DeviceMesh::rank_at",
                 "coordinate ", Shape(coordinate.begin(), coordinate.end()),
                 " is outside the mesh shape ", m.shape);
    index = index * m.shape[d] + coordinate[d];
  }
  return m.ranks[index];
}

int64_t DeviceMesh::linear_index() const { return member_impl(impl_, "DeviceMesh::linear_index").linear_index; }

const Group& DeviceMesh::group(int dim) const {
  const auto& m = member_impl(impl_, "DeviceMesh::group");
  return m.dim_groups[checked_dim(m, dim, "DeviceMesh::group")];
}
const Group& DeviceMesh::group(std::string_view name) const { return group(dim_index(name)); }
const Group& DeviceMesh::group() const { return member_impl(impl_, "DeviceMesh::group").mesh_group; }
const Group& DeviceMesh::world() const { return defined_impl(impl_, "DeviceMesh::world").world; }

// ---- sub-meshes ----------------------------------------------------------------------------

namespace {
// The world ranks of the sub-grid over `dims` (row-major in that order) through
// this rank's coordinate on the other dims.
std::vector<int> sub_ranks(const DeviceMesh::Impl& m, const std::vector<int>& dims) {
  Shape sub_shape;
  for (int d : dims) sub_shape.push_back(m.shape[d]);
  std::vector<int> out;
  std::vector<int64_t> coordinate = m.coordinate;
  for (int64_t i = 0; i < shape_numel(sub_shape); ++i) {
    const auto sub = coordinate_of(i, sub_shape);
    for (size_t k = 0; k < dims.size(); ++k) coordinate[dims[k]] = sub[k];
    int64_t linear = 0;
    for (size_t d = 0; d < m.shape.size(); ++d) linear = linear * m.shape[d] + coordinate[d];
    out.push_back(m.ranks[linear]);
  }
  return out;
}

std::vector<int> dims_of(const DeviceMesh& mesh, const std::vector<std::string>& names,
                         const char* op) {
  DT_CHECK_ARG(!names.empty(), op, "expected at least one mesh dim name, got none");
  std::vector<int> dims;
  for (const auto& name : names) {
    const int d = mesh.dim_index(name);
    DT_CHECK_ARG(std::find(dims.begin(), dims.end(), d) == dims.end(), op, "mesh dim '", name,
                 "' named twice in ", join(names, ","));
    dims.push_back(d);
  }
  return dims;
}
}  // namespace

DeviceMesh DeviceMesh::operator[](std::string_view name) const {
  const auto& m = member_impl(impl_, "DeviceMesh::operator[]");
  const int d = dim_index(name);
  auto sub = std::make_shared<Impl>();
  sub->world = m.world;
  sub->shape = {m.shape[d]};
  sub->names = {m.names[d]};
  sub->ranks = sub_ranks(m, {d});
  sub->member = true;
  sub->coordinate = {m.coordinate[d]};
  sub->linear_index = m.coordinate[d];
  // The dim group already holds exactly these ranks in this order.
  sub->dim_groups = {m.dim_groups[d]};
  sub->mesh_group = m.dim_groups[d];
  return DeviceMesh(std::shared_ptr<const Impl>(std::move(sub)));
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  const auto& m = member_impl(impl_, "DeviceMesh::slice");
  const std::vector<int> dims = dims_of(*this, names, "DeviceMesh::slice");
  if (dims.size() == 1) return (*this)[names[0]];
  const int ndim = static_cast<int>(m.shape.size());
  std::vector<int> identity(ndim);
  for (int d = 0; d < ndim; ++d) identity[d] = d;
  if (dims == identity) return *this;

  auto sub = std::make_shared<Impl>();
  sub->world = m.world;
  for (int d : dims) {
    sub->shape.push_back(m.shape[d]);
    sub->names.push_back(m.names[d]);
    sub->coordinate.push_back(m.coordinate[d]);
    sub->dim_groups.push_back(m.dim_groups[d]);  // same ranks, same order along d
  }
  sub->ranks = sub_ranks(m, dims);
  sub->member = true;
  sub->linear_index = index_over(m.coordinate, m.shape, dims);
  // The sub-mesh's own group: ranks agreeing on the dims left out, ordered
  // row-major over the kept dims in the order given.
  const int color = static_cast<int>(index_over(m.coordinate, m.shape, all_dims_except(ndim, dims)));
  sub->mesh_group = m.mesh_group.split(color, static_cast<int>(sub->linear_index));
  return DeviceMesh(std::shared_ptr<const Impl>(std::move(sub)));
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& names,
                               const std::string& new_name) const {
  const auto& m = member_impl(impl_, "DeviceMesh::flatten");
  const std::vector<int> dims = dims_of(*this, names, "DeviceMesh::flatten");
  for (size_t k = 1; k < dims.size(); ++k) {
    DT_CHECK_ARG(dims[k] == dims[0] + static_cast<int>(k), "DeviceMesh::flatten",
                 "expected adjacent mesh dims in mesh order, got ", join(names, ","),
                 " on mesh ", to_string());
  }
  const std::string name = new_name.empty() ? join(names, "_") : new_name;
  const int ndim = static_cast<int>(m.shape.size());
  const int first = dims.front(), last = dims.back();
  // Check the new names before the split so that a clash fails without communication.
  std::vector<std::string> new_names;
  for (int d = 0; d < ndim; ++d) {
    if (d == first) new_names.push_back(name);
    if (d < first || d > last) new_names.push_back(m.names[d]);
  }
  checked_names(new_names, new_names.size());

  auto flat = std::make_shared<Impl>();
  flat->world = m.world;
  flat->ranks = m.ranks;  // merging adjacent dims keeps the row-major order
  flat->member = true;
  flat->linear_index = m.linear_index;
  flat->mesh_group = m.mesh_group;
  Group merged_group;
  const std::vector<int> others = all_dims_except(ndim, dims);
  if (dims.size() == 1) {
    merged_group = m.dim_groups[first];
  } else if (others.empty()) {
    merged_group = m.mesh_group;
  } else {
    const int color = static_cast<int>(index_over(m.coordinate, m.shape, others));
    merged_group = m.mesh_group.split(color, static_cast<int>(index_over(m.coordinate, m.shape, dims)));
  }
  for (int d = 0; d < ndim; ++d) {
    if (d > first && d <= last) continue;
    if (d == first) {
      int64_t merged_size = 1;
      for (int k : dims) merged_size *= m.shape[k];
      flat->shape.push_back(merged_size);
      flat->coordinate.push_back(index_over(m.coordinate, m.shape, dims));
      flat->dim_groups.push_back(merged_group);
    } else {
      flat->shape.push_back(m.shape[d]);
      flat->coordinate.push_back(m.coordinate[d]);
      flat->dim_groups.push_back(m.dim_groups[d]);
    }
  }
  flat->names = std::move(new_names);
  return DeviceMesh(std::shared_ptr<const Impl>(std::move(flat)));
}

std::string DeviceMesh::to_string() const {
  if (!impl_) return "DeviceMesh(undefined)";
  std::string out;
  for (size_t d = 0; d < impl_->shape.size(); ++d) {
    if (d) out += ',';
    out += impl_->names[d] + "=" + std::to_string(impl_->shape[d]);
  }
  return out;
}

std::string MeshSpec::to_string() const {
  std::string out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) out += ',';
    out += names[d] + "=" + std::to_string(shape[d]);
  }
  return out;
}

MeshSpec parse_mesh_spec(std::string_view text) {
  MeshSpec spec;
  size_t pos = 0;
  auto fail = [&](const std::string& what) -> void {
    throw std::invalid_argument(detail::concat("[mesh] '", std::string(text), "' at position ", pos, ": expected ",
                                               what));
  };
  auto skip_spaces = [&] {
    while (pos < text.size() && text[pos] == ' ') ++pos;
  };
  while (true) {
    skip_spaces();
    const size_t name_start = pos;
    while (pos < text.size() && text[pos] != '=' && text[pos] != ',' && text[pos] != ' ') ++pos;
    if (pos == name_start) fail("a dim name");
    std::string name(text.substr(name_start, pos - name_start));
    skip_spaces();
    if (pos >= text.size() || text[pos] != '=') fail("'=' after the dim name '" + name + "'");
    ++pos;
    skip_spaces();
    const size_t size_start = pos;
    int64_t size = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      if (size > (int64_t{1} << 40)) fail("a dim size below 2^40");
      size = size * 10 + (text[pos++] - '0');
    }
    if (pos == size_start || size < 1) {
      pos = size_start;
      fail("a positive integer size for '" + name + "'");
    }
    spec.shape.push_back(size);
    spec.names.push_back(std::move(name));
    skip_spaces();
    if (pos == text.size()) break;
    if (text[pos] != ',') fail("',' or the end");
    ++pos;
  }
  std::set<std::string> seen;
  for (const std::string& name : spec.names) {
    DT_CHECK_ARG(seen.insert(name).second, "mesh", "duplicate dim name '", name, "' in '", std::string(text), "'");
  }
  return spec;
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  if (impl_ == other.impl_) return true;  // the common case in op dispatch
  if (!impl_ || !other.impl_) return false;
  return impl_->shape == other.impl_->shape && impl_->ranks == other.impl_->ranks &&
         impl_->world == other.impl_->world;
}

const DeviceMesh& local_mesh() {
  // Per rank: ranks of the threads backend are threads of one process.
  thread_local const DeviceMesh mesh(self_group(), {1}, {"local"});
  return mesh;
}

int64_t MeshSpec::size(std::string_view name) const {
  for (size_t d = 0; d < names.size(); ++d) {
    if (names[d] == name) return shape[d];
  }
  return 1;
}

}  // namespace dtensor
