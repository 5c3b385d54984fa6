// Creating DistTensors: distribute, distribute_from, from_local (with and without the
// global shape), the factories and visualize_sharding, on 1-D, 2-D and 3-D meshes with
// even, uneven and empty shards. Every local piece is compared with the slice of the
// full tensor read directly (never through full_tensor()).
#include <gtest/gtest.h>

#include "dtensor/comm_debug.h"
#include "dtensor/dist_tensor.h"
#include "mesh/mesh_index.h"
#include "test_helpers.h"

namespace dtensor {
namespace {

using mesh_index::coordinate_of;
using testing::at;
using testing::for_each_index;

struct MeshCase {
  Shape shape;
  std::vector<std::string> names;
};

const std::vector<MeshCase>& mesh_cases() {
  static const std::vector<MeshCase> cases{
      {{1}, {"x"}}, {{2}, {"x"}},           {{3}, {"x"}},           {{4}, {"x"}},
      {{5}, {"x"}}, {{2, 2}, {"dp", "tp"}}, {{2, 3}, {"dp", "tp"}}, {{2, 2, 2}, {"pp", "dp", "tp"}}};
  return cases;
}

// Ranks 1..3, sizes that divide, do not divide, and are smaller than the mesh.
const std::vector<Shape>& tensor_shapes() {
  static const std::vector<Shape> shapes{{12}, {7}, {2}, {0}, {6, 4}, {7, 5}, {1, 3}, {4, 3, 5}, {3, 1, 2}};
  return shapes;
}

// Every placement list over {R, S(0), S(-1), S(1), S(0, order=1), P(sum), P(max)} per
// mesh dim that is valid for `ndim` dims (P(max) never mixed with P(sum)).
std::vector<Placements> placement_lists(size_t mesh_ndim, int64_t ndim) {
  std::vector<Placement> pool{Replicate(), Shard(0), Shard(-1), Partial(), Partial(ReduceOp::Max)};
  if (ndim > 1) pool.push_back(Shard(1));
  if (mesh_ndim > 1) pool.push_back(Shard(0, 1));
  std::vector<Placements> out{{}};
  for (size_t m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const auto& prefix : out) {
      for (const auto& p : pool) {
        auto list = prefix;
        list.push_back(p);
        next.push_back(list);
      }
    }
    out = std::move(next);
  }
  std::erase_if(out, [](const Placements& list) {
    bool sum = false, max = false;
    for (const auto& p : list) {
      sum |= p.is_partial() && p.reduce_op() == ReduceOp::Sum;
      max |= p.is_partial() && p.reduce_op() == ReduceOp::Max;
    }
    return sum && max;
  });
  return out;
}

// A tensor whose element values are their row-major index (distinct, exact in f32).
Tensor indexed(const Shape& shape) {
  return Tensor::arange(0, static_cast<double>(shape_numel(shape)), 1, DType::F32).reshape(shape);
}

bool zero_by_partial_rule(const Placements& placements, const std::vector<int64_t>& coordinate) {
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].is_partial() && placements[m].reduce_op() == ReduceOp::Sum && coordinate[m] != 0) return true;
  }
  return false;
}

// `local` must be the block of `full` this coordinate holds (zeros where a
// Partial(sum) dim puts this coordinate off 0). Returns a description of the first
// difference, or "".
std::string block_mismatch(const Tensor& local, const Tensor& full, const DeviceMesh& mesh,
                           const Placements& placements) {
  const auto block = local_block(full.shape(), mesh.shape(), placements, mesh.coordinate());
  Shape expected_shape;
  for (const Range& r : block) expected_shape.push_back(r.length);
  if (local.shape() != expected_shape) {
    return "local shape " + shape_to_string(local.shape()) + ", expected " + shape_to_string(expected_shape);
  }
  const bool zero = zero_by_partial_rule(placements, mesh.coordinate());
  std::string error;
  for_each_index(local.shape(), [&](const std::vector<int64_t>& i) {
    if (!error.empty()) return;
    std::vector<int64_t> g(i.size());
    for (size_t d = 0; d < i.size(); ++d) g[d] = block[d].offset + i[d];
    const double want = zero ? 0.0 : at(full, g);
    if (at(local, i) != want) {
      error = "element " + shape_to_string(Shape(g.begin(), g.end())) + " is " + std::to_string(at(local, i)) +
              ", expected " + std::to_string(want);
    }
  });
  return error;
}

// Runs fn(mesh, world) on every mesh case.
template <class Fn>
void on_every_mesh(Fn fn) {
  for (const MeshCase& c : mesh_cases()) {
    launch(static_cast<int>(shape_numel(c.shape)), [&](Group world) {
      DeviceMesh mesh(world, c.shape, c.names);
      fn(mesh, world);
    });
  }
}

std::string where(const DeviceMesh& mesh, const Shape& shape, const Placements& placements) {
  return "mesh " + mesh.to_string() + ", shape " + shape_to_string(shape) + ", placements " +
         placements_to_string(placements) + ", rank " + std::to_string(mesh.linear_index());
}

TEST(DistCreate, DistributeSlicesEveryLayout) {
  on_every_mesh([](const DeviceMesh& mesh, Group) {
    for (const Shape& shape : tensor_shapes()) {
      const Tensor full = indexed(shape);
      for (const Placements& placements : placement_lists(mesh.shape().size(), shape.size())) {
        const DistTensor d = distribute(full, mesh, placements);
        const Placements normalized = validate_placements(placements, mesh.ndim(), shape.size(), "test");
        ASSERT_EQ(d.shape(), shape);
        ASSERT_EQ(d.placements(), normalized);
        ASSERT_EQ(block_mismatch(d.to_local(), full, mesh, normalized), "") << where(mesh, shape, placements);
        ASSERT_FALSE(d.to_local().shares_storage(full));  // ranks never alias one `full`
      }
    }
  });
}

TEST(DistCreate, RandomFactoriesMatchTheGlobalTensorOnAnyLayout) {
  on_every_mesh([](const DeviceMesh& mesh, Group) {
    for (const Shape& shape : tensor_shapes()) {
      const Tensor normal = Tensor::randn(shape, 42), uniform = Tensor::rand(shape, 7);
      for (const Placements& placements : placement_lists(mesh.shape().size(), shape.size())) {
        const Placements normalized = validate_placements(placements, mesh.ndim(), shape.size(), "test");
        ASSERT_EQ(block_mismatch(randn(shape, mesh, placements, 42).to_local(), normal, mesh, normalized), "")
            << where(mesh, shape, placements);
        ASSERT_EQ(block_mismatch(rand(shape, mesh, placements, 7).to_local(), uniform, mesh, normalized), "")
            << where(mesh, shape, placements);
      }
    }
  });
}

TEST(DistCreate, RandomFactoriesInOtherDtypes) {
  launch(4, [](Group world) {
    DeviceMesh mesh(world, {2, 2});
    const Shape shape{5, 7};
    for (DType dtype : {DType::F64, DType::BF16, DType::F16}) {
      const Placements placements{Shard(1), Shard(0)};
      const DistTensor d = randn(shape, mesh, placements, 3, dtype);
      EXPECT_EQ(d.dtype(), dtype);
      EXPECT_EQ(block_mismatch(d.to_local(), Tensor::randn(shape, 3, dtype), mesh, placements), "")
          << dtype_name(dtype);
    }
    EXPECT_THROW_MSG(randn(shape, mesh, {Shard(0), Replicate()}, 3, DType::I64), std::invalid_argument,
                     "[randn] expected a floating dtype, got i64");
  });
}

TEST(DistCreate, ConstantFactoriesFollowThePartialRule) {
  on_every_mesh([](const DeviceMesh& mesh, Group) {
    const Shape shape{7, 5};
    for (const Placements& placements : placement_lists(mesh.shape().size(), shape.size())) {
      const Placements normalized = validate_placements(placements, mesh.ndim(), 2, "test");
      ASSERT_EQ(
          block_mismatch(full(shape, 2.5, mesh, placements).to_local(), Tensor::full(shape, 2.5), mesh, normalized), "")
          << where(mesh, shape, placements);
      ASSERT_EQ(block_mismatch(ones(shape, mesh, placements, DType::I64).to_local(), Tensor::ones(shape, DType::I64),
                               mesh, normalized),
                "");
      ASSERT_EQ(block_mismatch(zeros(shape, mesh, placements).to_local(), Tensor::zeros(shape), mesh, normalized), "");
      const DistTensor e = empty(shape, mesh, placements, DType::F64);
      EXPECT_EQ(e.dtype(), DType::F64);
      EXPECT_EQ(e.to_local().shape(), local_shape(shape, mesh.shape(), normalized, mesh.coordinate()));
    }
  });
}

// Every factory makes its pieces on the device asked for (the pieces that hold zeros
// under a Partial placement included), with the CPU's values.
TEST(DistCreate, FactoriesMakeTheirPiecesOnTheDevice) {
  launch(4, [](Group world) {
    DeviceMesh mesh(world, {2, 2});
    const Device device = Device::cpu(1);
    const Shape shape{5, 7};
    const Placements placements{Shard(1), Partial()};
    const std::vector<std::pair<DistTensor, DistTensor>> made = {
        {zeros(shape, mesh, placements, DType::F32, device), zeros(shape, mesh, placements)},
        {ones(shape, mesh, placements, DType::I64, device), ones(shape, mesh, placements, DType::I64)},
        {full(shape, 2.5, mesh, placements, DType::F64, device), full(shape, 2.5, mesh, placements, DType::F64)},
        {randn(shape, mesh, placements, 3, DType::BF16, device), randn(shape, mesh, placements, 3, DType::BF16)},
        {rand(shape, mesh, placements, 7, DType::F32, device), rand(shape, mesh, placements, 7)}};
    for (const auto& [on_device, on_cpu] : made) {
      EXPECT_EQ(on_device.device(), device);
      EXPECT_EQ(on_device.dtype(), on_cpu.dtype());
      EXPECT_TRUE(allclose(on_device.to_local().to(Device::cpu()), on_cpu.to_local(), 0, 0));
    }
    EXPECT_EQ(empty(shape, mesh, placements, DType::F32, device).device(), device);
  });
}

TEST(DistCreate, FromLocalWithAndWithoutTheGlobalShape) {
  on_every_mesh([](const DeviceMesh& mesh, Group) {
    for (const Shape& shape : tensor_shapes()) {
      const Tensor full = indexed(shape);
      for (const Placements& placements : placement_lists(mesh.shape().size(), shape.size())) {
        const Tensor local = distribute(full, mesh, placements).to_local();
        CommDebugMode comm;
        const DistTensor given = DistTensor::from_local(local, mesh, placements, shape);
        ASSERT_EQ(comm.total_count(), 0);  // nothing to exchange
        ASSERT_EQ(given.shape(), shape);
        ASSERT_TRUE(given.to_local().shares_storage(local));  // wraps, does not copy
        // Inferred with exactly one all_gather, whatever the (uneven, empty) pieces.
        const DistTensor inferred = DistTensor::from_local(local, mesh, placements);
        ASSERT_EQ(comm.total_count(), 1);
        ASSERT_EQ(comm.count("all_gather"), 1);
        ASSERT_EQ(inferred.shape(), shape) << where(mesh, shape, placements);
        ASSERT_EQ(inferred.placements(), given.placements());
      }
    }
  });
}

TEST(DistCreate, FromLocalRejectsDisagreeingPieces) {
  launch(4, [](Group world) {
    DeviceMesh mesh(world, {4}, {"x"});
    const int r = world.rank();
    // Sizes 1, 2, 2, 2 sum to 7, but the chunk rule cuts 7 into 2, 2, 2, 1.
    EXPECT_THROW_MSG(DistTensor::from_local(Tensor::zeros({r == 0 ? 1 : 2, 3}), mesh, {Shard(0)}),
                     std::invalid_argument,
                     "[from_local] local shapes do not follow the chunk rule for 'S(0)': mesh rank 0 at "
                     "coordinate [0] has [1, 3], but a global shape of [7, 3] gives it [2, 3]");
    // A dim nobody shards must agree.
    EXPECT_THROW_MSG(DistTensor::from_local(Tensor::zeros({2, 3 + (r == 2)}), mesh, {Shard(0)}), std::invalid_argument,
                     "dim 1 is not sharded by 'S(0)' but its local size differs across mesh ranks: [3, 3, 4, 3]");
    EXPECT_THROW_MSG(DistTensor::from_local(Tensor::zeros(r == 3 ? Shape{2} : Shape{2, 1}), mesh, {Shard(0)}),
                     std::invalid_argument, "different numbers of dims: mesh rank 0 has 2, mesh rank 3 has 1");
    EXPECT_THROW_MSG(DistTensor::from_local(Tensor::zeros({2}, r == 1 ? DType::F64 : DType::F32), mesh, {Replicate()}),
                     std::invalid_argument, "different dtypes: mesh rank 0 has f32, mesh rank 1 has f64");
    // With the global shape: this rank's piece is checked against the chunk rule.
    EXPECT_THROW_MSG(DistTensor::from_local(Tensor::zeros({3, 5}), mesh, {Shard(0)}, Shape{5, 5}),
                     std::invalid_argument,
                     std::string("[from_local] local shape [3, 5] does not match global shape [5, 5] under "
                                 "'S(0)' at mesh coordinate [") +
                         std::to_string(r) + "]: expected local shape [" + "2210"[r] + ", 5]");
  });
}

TEST(DistCreate, DistributeFromOneSource) {
  on_every_mesh([](const DeviceMesh& mesh, Group) {
    for (const Shape& shape : {Shape{7, 5}, Shape{2}, Shape{4, 3, 5}}) {
      const Tensor full = indexed(shape);
      for (const Placements& placements : placement_lists(mesh.shape().size(), shape.size())) {
        const int64_t source = mesh.size() - 1;
        const bool is_source = mesh.linear_index() == source;
        CommDebugMode comm;
        // Only the source has the tensor; the others pass an undefined one.
        const DistTensor d = distribute_from(is_source ? full : Tensor(), mesh, placements, source);
        const Placements normalized = validate_placements(placements, mesh.ndim(), shape.size(), "test");
        ASSERT_EQ(d.shape(), shape);
        ASSERT_EQ(block_mismatch(d.to_local(), full, mesh, normalized), "") << where(mesh, shape, placements);
        // One header broadcast, then one message per rank that holds a non-empty,
        // non-zero piece.
        EXPECT_EQ(comm.count("broadcast"), 1);
        int64_t receivers = 0;
        for (int64_t r = 0; r < mesh.size(); ++r) {
          const auto c = coordinate_of(r, mesh.shape());
          if (r != source && !zero_by_partial_rule(normalized, c) &&
              shape_numel(local_shape(shape, mesh.shape(), normalized, c)) > 0) {
            ++receivers;
          }
        }
        EXPECT_EQ(comm.count("send"), is_source ? receivers : 0) << where(mesh, shape, placements);
      }
    }
  });
  // The pieces land on the source's device on every rank (zero pieces included).
  launch(4, [](Group world) {
    DeviceMesh mesh(world, {2, 2});
    const Tensor full = indexed({6, 4}).to(Device::cpu(1));
    for (const Placements& placements : {Placements{Shard(0), Replicate()}, Placements{Partial(), Shard(1)}}) {
      const DistTensor d = distribute_from(world.rank() == 1 ? full : Tensor(), mesh, placements, 1);
      EXPECT_EQ(d.device(), Device::cpu(1)) << placements_to_string(placements);
      EXPECT_TRUE(allclose(d.full_tensor().to(Device::cpu()), full.to(Device::cpu()), 0, 0));
    }
  });
}

TEST(DistCreate, BadInputErrors) {
  launch(4, [](Group world) {
    DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
    const Tensor full = indexed({7, 5});
    EXPECT_THROW_MSG(distribute(full, mesh, {Shard(0)}), std::invalid_argument,
                     "[distribute] expected 2 placements (one per mesh dim), got 1: 'S(0)'");
    EXPECT_THROW_MSG(distribute(full, mesh, {Shard(2), Replicate()}), std::invalid_argument,
                     "[distribute] S(2) on mesh dim 0 is out of range for a tensor of 2 dims");
    EXPECT_THROW_MSG(distribute(full, mesh, {Partial(ReduceOp::Max), Partial()}), std::invalid_argument,
                     "[distribute] Partial ops cannot be mixed across mesh dims unless all are sum or avg: "
                     "got 'P(max),P(sum)'");
    EXPECT_THROW_MSG(zeros({7, 5}, mesh, {Shard(-3), Replicate()}), std::invalid_argument,
                     "[zeros] S(-3) on mesh dim 0 is out of range");
    EXPECT_THROW_MSG(distribute(full, mesh, parse_placements("S(0),Q")), std::invalid_argument,
                     "[parse_placements] in 'S(0),Q' at position 5");
    EXPECT_THROW_MSG(DistTensor::from_local(full, mesh, {Shard(0), Shard(1)}, Shape{7, 5}), std::invalid_argument,
                     "[from_local] local shape [7, 5] does not match global shape [7, 5]");
    EXPECT_THROW_MSG(DistTensor::from_local(full, mesh, {Shard(0)}), std::invalid_argument,
                     "[from_local] expected 2 placements");
    EXPECT_THROW_MSG(distribute_from(full, mesh, {Shard(0), Replicate()}, 4), std::invalid_argument,
                     "[distribute_from] source 4 is not a mesh index");
    EXPECT_THROW_MSG(DistTensor().shape(), std::invalid_argument, "expected a defined DistTensor");
  });
  launch(3, [](Group world) {
    DeviceMesh mesh(world, {2});
    if (world.rank() == 2) {
      // A rank outside the mesh gets the tensor's shape and layout, and no data.
      const DistTensor elsewhere = zeros({4}, mesh, {Shard(0)});
      EXPECT_EQ(elsewhere.shape(), Shape{4});
      EXPECT_EQ(elsewhere.to_local().numel(), 0);
      EXPECT_THROW_MSG(elsewhere.full_tensor(), std::invalid_argument, "[full_tensor] this rank is not in mesh d0=2");
      EXPECT_THROW_MSG(zeros({4}, mesh, {Shard(1)}), std::invalid_argument, "[zeros]");
      EXPECT_THROW_MSG(DistTensor::from_local(Tensor::zeros({2}), mesh, {Shard(0)}), std::invalid_argument,
                       "[from_local] this rank is not in mesh d0=2");
    }
  });
}

TEST(DistCreate, ToStringAndVisualize) {
  launch(4, [](Group world) {
    DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
    const DistTensor d = distribute(indexed({7, 5}), mesh, {Shard(0), Shard(1)});
    if (world.rank() == 3) {
      EXPECT_EQ(d.to_string(),
                "DistTensor(shape=[7, 5], dtype=f32, mesh=dp=2,tp=2, placements=S(0),S(1), local=[3, 2])");
    }
    EXPECT_EQ(visualize_sharding(d),
              "DistTensor [7, 5] f32 on mesh dp=2,tp=2, placements S(0),S(1)\n"
              "rows \\ cols  0:3           3:5\n"
              "0:4          rank 0 (4x3)  rank 1 (4x2)\n"
              "4:7          rank 2 (3x3)  rank 3 (3x2)\n");
    // Replicated blocks list every holder; Partial shows the op.
    EXPECT_EQ(visualize_sharding({7, 5}, mesh, {Partial(), Shard(0)}),
              "DistTensor [7, 5] on mesh dp=2,tp=2, placements P(sum),S(0)\n"
              "rows \\ cols  0:5\n"
              "0:4          ranks 0,2 (4x5) partial(sum)\n"
              "4:7          ranks 1,3 (3x5) partial(sum)\n");
    // 1-D tensor, uneven and empty shards, explicit ranks.
    DeviceMesh line = DeviceMesh::from_ranks(world, {3, 2, 1, 0}, {4}, {"x"});
    EXPECT_EQ(visualize_sharding({5}, line, {Shard(0)}),
              "DistTensor [5] on mesh x=4, placements S(0)\n"
              "range  held by\n"
              "0:2    rank 3 (2)\n"
              "2:4    rank 2 (2)\n"
              "4:5    rank 1 (1)\n"
              "5:5    rank 0 (0)\n");
  });
  launch(8, [](Group world) {
    DeviceMesh mesh(world, {2, 2, 2});
    const std::string text = visualize_sharding({7, 5, 3}, mesh, {Shard(0), Shard(1), Replicate()});
    EXPECT_NE(text.find("rank 5 (1,0,1):  [4:7, 0:3, :]  3x3x3\n"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 0 (0,0,0):  [0:4, 0:3, :]  4x3x3\n"), std::string::npos) << text;
  });
}

}  // namespace
}  // namespace dtensor
