// Nested shard orders (several mesh dims splitting one tensor dim, in an order other
// than the default) meeting replicated, partial and default-ordered partners, for
// every op family, on meshes 2x2, 2x3 and 2x2x2: forward and gradients against one
// rank. Dispatch must give all inputs of a strategy one nesting per letter (an
// input chunked in the default order beside one in the reversed order computes on
// blocks that do not line up).
#include "dist_op_test_util.h"

namespace dtensor::testing {
namespace {

using Inputs = std::vector<DistTensor>;
using Locals = std::vector<Tensor>;

OpCase make(std::string name, Locals inputs, std::function<DistTensor(const Inputs&)> dist_fn,
            std::vector<bool> differentiable = {}) {
  OpCase c;
  c.name = std::move(name);
  c.inputs = std::move(inputs);
  c.dist_fn = std::move(dist_fn);
  c.differentiable = std::move(differentiable);
  return c;
}

void run_all(const std::vector<OpCase>& cases, int64_t max_3d = 24) {
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name);
    run_nested_conformance(c, 24, max_3d);
  }
}

// Dims of 6 split evenly into 2x3 = 6 pieces; dims of 7 and 5 leave short and
// empty pieces.
TEST(NestedOrders, Pointwise) {
  run_all({
      make("add [6, 7] + [6, 7]", {Tensor::randn({6, 7}, 1), Tensor::randn({6, 7}, 2)},
           [](const Inputs& x) { return add(x[0], x[1]); }),
      make("mul [5, 6] * [6] (broadcast)", {Tensor::randn({5, 6}, 3), Tensor::randn({6}, 4)},
           [](const Inputs& x) { return mul(x[0], x[1]); }),
      make("gelu(div) [6, 5] / [6, 5]", {Tensor::randn({6, 5}, 5), add(Tensor::rand({6, 5}, 6), 0.5)},
           [](const Inputs& x) { return gelu(div(x[0], x[1])); }),
      make("where", {Tensor::randn({7, 4}, 7), Tensor::randn({7, 4}, 8)},
           [](const Inputs& x) { return where(gt(x[0], x[1]), x[0], x[1]); }),
  });
}

TEST(NestedOrders, MatmulAndLinear) {
  run_all({
      make("matmul [6, 8] @ [8, 5]", {Tensor::randn({6, 8}, 11), Tensor::randn({8, 5}, 12)},
           [](const Inputs& x) { return matmul(x[0], x[1]); }),
      make("batched matmul [4, 3, 6] @ [6, 7]", {Tensor::randn({4, 3, 6}, 13), Tensor::randn({6, 7}, 14)},
           [](const Inputs& x) { return matmul(x[0], x[1]); }),
      make("linear [5, 6] w [7, 6] b [7]",
           {Tensor::randn({5, 6}, 15), Tensor::randn({7, 6}, 16), Tensor::randn({7}, 17)},
           [](const Inputs& x) { return linear(x[0], x[1], x[2]); }),
  });
}

TEST(NestedOrders, ReductionsAndNorms) {
  run_all({
      make("sum dim 1 + mean dim 0", {Tensor::randn({6, 7}, 21)},
           [](const Inputs& x) { return add(sum(x[0], {1}, true), mean(x[0], {0}, true)); }),
      make("amax dim 0", {Tensor::randn({7, 6}, 22)}, [](const Inputs& x) { return amax(x[0], {0}); }),
      make("softmax dim 1", {Tensor::randn({6, 7}, 23)}, [](const Inputs& x) { return softmax(x[0], 1); }),
      make("layer_norm [6, 8] w b", {Tensor::randn({6, 8}, 24), Tensor::randn({8}, 25), Tensor::randn({8}, 26)},
           [](const Inputs& x) { return layer_norm(x[0], {8}, x[1], x[2]); }),
  });
}

TEST(NestedOrders, EmbeddingAndCrossEntropy) {
  run_all({
      make("embedding [8, 6] ids [2, 6]",
           {Tensor::randn({8, 6}, 31), Tensor::from_vector<int64_t>({0, 7, 3, 3, 5, 1, 2, 2, 6, 4, 0, 7}, {2, 6})},
           [](const Inputs& x) { return embedding(x[0], x[1]); }, {true, false}),
      make("cross_entropy [6, 7]",
           {Tensor::randn({6, 7}, 32), Tensor::from_vector<int64_t>({3, 6, 0, 2, 5, 1}, {6})},
           [](const Inputs& x) { return cross_entropy(x[0], x[1]); }, {true, false}),
  });
}

TEST(NestedOrders, ShapeOps) {
  run_all({
      make("reshape [6, 4] -> [3, 2, 4]", {Tensor::randn({6, 4}, 41)},
           [](const Inputs& x) { return reshape(x[0], {3, 2, 4}); }),
      make("transpose then add", {Tensor::randn({6, 5}, 42), Tensor::randn({5, 6}, 43)},
           [](const Inputs& x) { return add(transpose(x[0], 0, 1), x[1]); }),
      make("cat dim 1", {Tensor::randn({6, 3}, 44), Tensor::randn({6, 4}, 45)},
           [](const Inputs& x) { return cat({x[0], x[1]}, 1); }),
  });
}

TEST(NestedOrders, AttentionAndDropout) {
  run_all({
      make("attention [2, 4, 6, 3] causal",
           {Tensor::randn({2, 4, 6, 3}, 51), Tensor::randn({2, 4, 6, 3}, 52), Tensor::randn({2, 4, 6, 3}, 53)},
           [](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); }),
      make("dropout [6, 7] + y", {Tensor::randn({6, 7}, 54), Tensor::randn({6, 7}, 55)},
           [](const Inputs& x) { return add(dropout(x[0], 0.3, 9), x[1]); }),
  }, /*max_3d=*/4);
}

}  // namespace
}  // namespace dtensor::testing

namespace dtensor::testing {
namespace {

// The case an external check found: on a 2x3 mesh a Replicate operand meeting one
// placed {Shard(1, 1), Shard(1, 0)} was chunked in the default order (relative
// error 1.1-1.3), or with uneven sizes threw in all_gather.
TEST(NestedOrders, ReplicatePartnerTakesTheShardedOperandsOrder) {
  for (int64_t cols : {6, 7}) {
    const Tensor xf = Tensor::randn({4, cols}, 1), yf = Tensor::randn({4, cols}, 2), wf = Tensor::randn({cols, 5}, 3);
    launch(6, [&](Group world) {
      DeviceMesh mesh(world, {2, 3});
      const DistTensor x = distribute(xf, mesh, {Replicate(), Replicate()});
      const DistTensor y = distribute(yf, mesh, {Shard(1, 1), Shard(1, 0)});
      const DistTensor sum_xy = add(x, y);
      EXPECT_EQ(sum_xy.placements(), (Placements{Shard(1, 1), Shard(1, 0)}));
      EXPECT_TRUE(allclose(sum_xy.full_tensor(), add(xf, yf), 1e-6, 1e-6));
      const DistTensor w = distribute(wf, mesh, {Shard(0, 1), Shard(0, 0)});
      EXPECT_TRUE(allclose(matmul(y, w).full_tensor(), matmul(yf, wf), 1e-5, 1e-5));
      EXPECT_TRUE(allclose(matmul(x, w).full_tensor(), matmul(xf, wf), 1e-5, 1e-5));
    });
  }
}

}  // namespace
}  // namespace dtensor::testing
