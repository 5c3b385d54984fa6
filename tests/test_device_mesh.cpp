// DeviceMesh on the threads backend: coordinates, per-dim groups (checked by
// communicating over them), sub-meshes, slicing, flattening, rank lists, errors.
#include <gtest/gtest.h>

#include "dtensor/comm_debug.h"
#include "dtensor/device_mesh.h"
#include "test_helpers.h"

namespace dtensor {
namespace {

// The world ranks of `group`, in group order, learned by gathering them over it.
std::vector<int> gathered_world_ranks(const Group& group, int world_rank) {
  const Tensor mine = Tensor::from_vector(std::vector<int64_t>{world_rank});
  const auto all = all_gather(group, mine).to_vector<int64_t>();
  return std::vector<int>(all.begin(), all.end());
}

std::vector<int64_t> unravel(int64_t index, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    c[d] = index % shape[d];
    index /= shape[d];
  }
  return c;
}

int64_t ravel(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + c[d];
  return index;
}

// The world ranks along mesh dim `dim` through `coordinate` of a row-major mesh over
// `ranks`.
std::vector<int> line_through(const std::vector<int>& ranks, const Shape& shape,
                              std::vector<int64_t> coordinate, int dim) {
  std::vector<int> out;
  for (int64_t k = 0; k < shape[dim]; ++k) {
    coordinate[dim] = k;
    out.push_back(ranks[ravel(coordinate, shape)]);
  }
  return out;
}

// Checks coordinates, sizes and every group of a mesh over `ranks` (row-major).
void check_mesh(const DeviceMesh& mesh, const std::vector<int>& ranks, const Shape& shape, int world_rank) {
  EXPECT_EQ(mesh.shape(), shape);
  EXPECT_EQ(mesh.ranks(), ranks);
  EXPECT_EQ(mesh.size(), shape_numel(shape));
  const auto it = std::find(ranks.begin(), ranks.end(), world_rank);
  ASSERT_EQ(mesh.is_member(), it != ranks.end());
  if (!mesh.is_member()) return;
  const int64_t index = it - ranks.begin();
  const auto coordinate = unravel(index, shape);
  EXPECT_EQ(mesh.coordinate(), coordinate);
  EXPECT_EQ(mesh.linear_index(), index);
  EXPECT_EQ(mesh.rank_at(coordinate), world_rank);
  for (int d = 0; d < mesh.ndim(); ++d) {
    EXPECT_EQ(mesh.coordinate(d), coordinate[d]);
    EXPECT_EQ(mesh.size(d), shape[d]);
    const Group& g = mesh.group(d);
    EXPECT_EQ(g.size(), shape[d]);
    EXPECT_EQ(g.rank(), coordinate[d]);
    EXPECT_EQ(gathered_world_ranks(g, world_rank), line_through(ranks, shape, coordinate, d)) << "dim " << d;
  }
  EXPECT_EQ(mesh.group().rank(), index);
  EXPECT_EQ(gathered_world_ranks(mesh.group(), world_rank), ranks);
}

std::vector<int> iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(DeviceMesh, OneDimSizes1To5) {
  for (int n = 1; n <= 5; ++n) {
    launch(n, [n](Group world) {
      DeviceMesh mesh(world, {n}, {"x"});
      check_mesh(mesh, iota(n), {n}, world.rank());
      EXPECT_EQ(mesh.to_string(), "x=" + std::to_string(n));
      EXPECT_EQ(mesh.names(), std::vector<std::string>{"x"});
      EXPECT_EQ(mesh.dim_index("x"), 0);
      EXPECT_EQ(mesh.size("x"), n);
      EXPECT_TRUE(mesh.world() == world);
    });
  }
}

TEST(DeviceMesh, TwoAndThreeDims) {
  for (const Shape& shape : {Shape{2, 2}, Shape{2, 3}, Shape{3, 2}, Shape{2, 2, 2}}) {
    const int n = static_cast<int>(shape_numel(shape));
    launch(n, [&](Group world) {
      CommDebugMode comm;
      DeviceMesh mesh(world, shape);
      // One split per dim plus one for the whole mesh.
      EXPECT_EQ(comm.count("split"), static_cast<int64_t>(shape.size()) + 1);
      check_mesh(mesh, iota(n), shape, world.rank());
      EXPECT_EQ(mesh.names()[0], "d0");
      EXPECT_EQ(mesh.group("d1").size(), shape[1]);
    });
  }
}

TEST(DeviceMesh, NamedToStringAndEquality) {
  launch(4, [](Group world) {
    DeviceMesh a(world, {2, 2}, {"dp", "tp"});
    DeviceMesh b(world, {2, 2}, {"dp", "tp"});
    DeviceMesh flat(world, {4}, {"all"});
    DeviceMesh permuted = DeviceMesh::from_ranks(world, {3, 2, 1, 0}, {2, 2}, {"dp", "tp"});
    EXPECT_EQ(a.to_string(), "dp=2,tp=2");
    EXPECT_EQ(a.size("tp"), 2);
    EXPECT_TRUE(a == b);
    EXPECT_FALSE(a == flat);
    EXPECT_FALSE(a == permuted);
    EXPECT_FALSE(a == DeviceMesh());
    EXPECT_EQ(DeviceMesh().to_string(), "DeviceMesh(undefined)");
  });
}

TEST(DeviceMesh, ExplicitRankListsAndNonMembers) {
  launch(5, [](Group world) {
    // A permuted 2x2 grid over ranks 4, 1, 3, 0; rank 2 is outside.
    const std::vector<int> ranks{4, 1, 3, 0};
    DeviceMesh mesh = DeviceMesh::from_ranks(world, ranks, {2, 2}, {"dp", "tp"});
    check_mesh(mesh, ranks, {2, 2}, world.rank());
    if (world.rank() == 2) {
      EXPECT_THROW_MSG(mesh.coordinate(), std::invalid_argument, "world rank 2 is not in the mesh");
      EXPECT_THROW_MSG(mesh.group(0), std::invalid_argument, "is not in the mesh");
    }
    // The default constructor over fewer ranks than the world.
    DeviceMesh first3(world, {3});
    check_mesh(first3, {0, 1, 2}, {3}, world.rank());
  });
}

TEST(DeviceMesh, SubMeshReusesTheDimGroup) {
  launch(6, [](Group world) {
    DeviceMesh mesh(world, {2, 3}, {"dp", "tp"});
    CommDebugMode comm;
    DeviceMesh tp = mesh["tp"];
    DeviceMesh dp = mesh["dp"];
    EXPECT_EQ(comm.total_count(), 0);  // no communication
    const auto c = mesh.coordinate();
    check_mesh(tp, line_through(iota(6), {2, 3}, c, 1), {3}, world.rank());
    check_mesh(dp, line_through(iota(6), {2, 3}, c, 0), {2}, world.rank());
    EXPECT_TRUE(tp.group(0) == mesh.group("tp"));
    EXPECT_EQ(tp.to_string(), "tp=3");
    EXPECT_EQ(mesh.slice({"tp"}).to_string(), "tp=3");
  });
}

TEST(DeviceMesh, SliceKeepsTheGivenOrder) {
  launch(8, [](Group world) {
    DeviceMesh mesh(world, {2, 2, 2}, {"pp", "dp", "tp"});
    const auto c = mesh.coordinate();
    CommDebugMode comm;
    DeviceMesh sub = mesh.slice({"pp", "tp"});
    EXPECT_EQ(comm.count("split"), 1);  // only the new mesh group
    std::vector<int> expected;
    for (int64_t pp = 0; pp < 2; ++pp) {
      for (int64_t tp = 0; tp < 2; ++tp) expected.push_back(static_cast<int>(ravel({pp, c[1], tp}, {2, 2, 2})));
    }
    check_mesh(sub, expected, {2, 2}, world.rank());
    EXPECT_EQ(sub.to_string(), "pp=2,tp=2");

    // Reversed order: row-major over (tp, pp).
    DeviceMesh reversed = mesh.slice({"tp", "pp"});
    std::vector<int> expected_reversed;
    for (int64_t tp = 0; tp < 2; ++tp) {
      for (int64_t pp = 0; pp < 2; ++pp) expected_reversed.push_back(static_cast<int>(ravel({pp, c[1], tp}, {2, 2, 2})));
    }
    check_mesh(reversed, expected_reversed, {2, 2}, world.rank());
    EXPECT_EQ(reversed.names(), (std::vector<std::string>{"tp", "pp"}));

    comm.reset();
    EXPECT_TRUE(mesh.slice({"pp", "dp", "tp"}) == mesh);
    EXPECT_EQ(comm.total_count(), 0);
  });
}

TEST(DeviceMesh, FlattenMergesAdjacentDims) {
  launch(8, [](Group world) {
    DeviceMesh mesh(world, {2, 2, 2}, {"pp", "dp", "tp"});
    const auto c = mesh.coordinate();
    DeviceMesh flat = mesh.flatten({"dp", "tp"});
    EXPECT_EQ(flat.to_string(), "pp=2,dp_tp=4");
    check_mesh(flat, iota(8), {2, 4}, world.rank());
    EXPECT_EQ(flat.coordinate(), (std::vector<int64_t>{c[0], c[1] * 2 + c[2]}));
    EXPECT_EQ(flat["dp_tp"].size(), 4);

    DeviceMesh all = mesh.flatten({"pp", "dp", "tp"}, "world");
    EXPECT_EQ(all.to_string(), "world=8");
    check_mesh(all, iota(8), {8}, world.rank());

    EXPECT_THROW_MSG(mesh.flatten({"pp", "tp"}), std::invalid_argument,
                     "expected adjacent mesh dims in mesh order, got pp,tp");
    EXPECT_THROW_MSG(mesh.flatten({"tp", "dp"}), std::invalid_argument, "expected adjacent mesh dims");
    EXPECT_THROW_MSG(mesh.flatten({"dp", "tp"}, "pp"), std::invalid_argument, "duplicate dim name 'pp'");
  });
}

TEST(DeviceMesh, ConstructionErrors) {
  launch(4, [](Group world) {
    EXPECT_THROW_MSG(DeviceMesh(world, {2, 3}), std::invalid_argument,
                     "[DeviceMesh] mesh shape [2, 3] needs 6 ranks, but the world group has 4");
    EXPECT_THROW_MSG(DeviceMesh(world, {0, 2}), std::invalid_argument, "mesh dims of size >= 1");
    EXPECT_THROW_MSG(DeviceMesh(world, Shape{}), std::invalid_argument, "at least one dim");
    EXPECT_THROW_MSG(DeviceMesh(world, {2, 2}, {"dp", "dp"}), std::invalid_argument,
                     "duplicate dim name 'dp'");
    EXPECT_THROW_MSG(DeviceMesh(world, {2, 2}, {"dp"}), std::invalid_argument, "expected 2 dim names");
    EXPECT_THROW_MSG(DeviceMesh(world, {4}, {"a=b"}), std::invalid_argument, "without ',', '='");
    EXPECT_THROW_MSG(DeviceMesh::from_ranks(world, {0, 1, 2}, {2, 2}), std::invalid_argument,
                     "mesh shape [2, 2] needs 4 ranks, got 3");
    EXPECT_THROW_MSG(DeviceMesh::from_ranks(world, {0, 1, 1, 2}, {2, 2}), std::invalid_argument,
                     "rank 1 appears twice in [0, 1, 1, 2]");
    EXPECT_THROW_MSG(DeviceMesh::from_ranks(world, {0, 1, 2, 4}, {2, 2}), std::invalid_argument,
                     "rank 4 is out of range for a world of 4 ranks");

    DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
    EXPECT_THROW_MSG(mesh.group("pp"), std::invalid_argument, "unknown mesh dim 'pp'; valid names: dp, tp");
    EXPECT_THROW_MSG(mesh["pp"], std::invalid_argument, "valid names: dp, tp");
    EXPECT_THROW_MSG(mesh.slice({"dp", "dp"}), std::invalid_argument, "mesh dim 'dp' named twice");
    EXPECT_THROW_MSG(mesh.size(2), std::invalid_argument, "mesh dim 2 out of range for a mesh of 2 dims");
    EXPECT_THROW_MSG(mesh.rank_at({0, 2}), std::invalid_argument, "outside the mesh shape [2, 2]");
    EXPECT_THROW_MSG(DeviceMesh().shape(), std::invalid_argument, "expected a defined mesh");
  });
}

TEST(DeviceMesh, SpecStringsParseAndPrintBack) {
  const MeshSpec spec = parse_mesh_spec(" dp = 2 ,tp=4");
  EXPECT_EQ(spec.shape, (Shape{2, 4}));
  EXPECT_EQ(spec.names, (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(spec.to_string(), "dp=2,tp=4");
  launch(8, [&](Group world) { EXPECT_EQ(DeviceMesh(world, spec.shape, spec.names).to_string(), spec.to_string()); });
  EXPECT_THROW_MSG(parse_mesh_spec(""), std::invalid_argument, "[mesh] '' at position 0: expected a dim name");
  EXPECT_THROW_MSG(parse_mesh_spec("dp"), std::invalid_argument, "at position 2: expected '=' after the dim name 'dp'");
  EXPECT_THROW_MSG(parse_mesh_spec("dp=0"), std::invalid_argument, "at position 3: expected a positive integer size");
  EXPECT_THROW_MSG(parse_mesh_spec("dp=2;tp=2"), std::invalid_argument, "at position 4: expected ',' or the end");
  EXPECT_THROW_MSG(parse_mesh_spec("dp=2,"), std::invalid_argument, "at position 5: expected a dim name");
  EXPECT_THROW_MSG(parse_mesh_spec("dp=2,dp=2"), std::invalid_argument, "duplicate dim name 'dp'");
  EXPECT_THROW_MSG(parse_mesh_spec("dp=99999999999999"), std::invalid_argument, "a dim size below 2^40");
}

}  // namespace
}  // namespace dtensor

namespace dtensor {

TEST(DeviceMeshShape, SizesByNameAndTheRoundTrip) {
  const MeshSpec m = parse_mesh_spec("pp=4,dp=2,tp=2");
  EXPECT_EQ(m.size("tp"), 2);
  EXPECT_EQ(m.size("pp"), 4);
  EXPECT_EQ(m.size("cp"), 1);
  launch(4, [](Group g) {
    const DeviceMesh mesh(g, {2, 2}, {"dp", "tp"});
    const MeshSpec back = parse_mesh_spec(mesh.to_string());
    EXPECT_EQ(back.shape, mesh.shape());
    EXPECT_EQ(back.names, mesh.names());
  });
}

}  // namespace dtensor
