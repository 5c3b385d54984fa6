// Conformance of the neural-network ops on DistTensors (var, argmax, softmax,
// log_softmax, layer_norm, rms_norm, embedding, cross_entropy, attention, dropout):
// every input placement combination on meshes 2, 3 and 2x2 against one rank,
// forward and gradients, even and uneven shapes; one-rank backward against F64
// finite differences; exact collective counts for the canonical tensor-parallel
// cases; layout-independent dropout masks; bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "dist_op_test_util.h"
#include "dtensor/random.h"

namespace dtensor::testing {
namespace {

using Inputs = std::vector<DistTensor>;
using Locals = std::vector<Tensor>;

Tensor ids_tensor(const std::vector<int64_t>& values, const Shape& shape) {
  return Tensor::from_vector(values, shape);
}

void conform(OpCase c, bool finite_differences = true) {
  run_conformance(c);
  if (finite_differences) check_finite_differences(c);
}

// ---- var, argmax --------------------------------------------------------------------

TEST(OpsNn, Var) {
  struct Variant {
    std::vector<int64_t> dims;
    int64_t correction;
    bool keepdim;
  };
  for (const Variant& v : {Variant{{1}, 1, false}, Variant{{0}, 0, true}, Variant{{}, 1, false}}) {
    OpCase c;
    c.name = "var dims=" + shape_to_string(v.dims) + " correction=" + std::to_string(v.correction);
    c.inputs = {Tensor::randn({5, 7}, 11)};
    c.dist_fn = [v](const Inputs& in) { return var(in[0], v.dims, v.correction, v.keepdim); };
    c.local_fn = [v](const Locals& in) { return var(in[0], v.dims, v.correction, v.keepdim); };
    c.max_combinations = 20;
    conform(c);
  }
}

TEST(OpsNn, Argmax) {
  // Ties across shard boundaries (the first index wins) and a row whose maximum
  // sits in the last, short shard.
  const Tensor ties = Tensor::from_vector<float>({1, 3, 3, 0, 3, 2, 1,  //
                                                  0, 0, 0, 0, 0, 0, 5,  //
                                                  2, 2, 2, 2, 2, 2, 2,  //
                                                  4, 1, 4, 1, 4, 1, 4,  //
                                                  0, 1, 2, 3, 4, 5, 6},
                                                 {5, 7});
  for (const Tensor& input : {Tensor::randn({5, 7}, 12), ties}) {
    for (int64_t dim : {0, 1, -1}) {
      for (bool keepdim : {false, true}) {
        OpCase c;
        c.name = "argmax dim=" + std::to_string(dim) + " keepdim=" + std::to_string(keepdim);
        c.inputs = {input};
        c.dist_fn = [=](const Inputs& in) { return argmax(in[0], dim, keepdim); };
        c.local_fn = [=](const Locals& in) { return argmax(in[0], dim, keepdim); };
        c.rtol = c.atol = 0;
        c.max_combinations = 12;
        run_conformance(c);
      }
    }
  }
}

TEST(OpsNn, ArgmaxAlongShardedDimReducesOnlyIndices) {
  const Tensor full = Tensor::randn({4, 10}, 13);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor x = distribute(full, mesh, {Shard(1)});
    CommDebugMode comm;
    const DistTensor index = argmax(x, 1);
    // The [4, 1] maxima (max) and the [4, 1] indices (min); never the tensor.
    EXPECT_EQ(comm.count("all_reduce"), 2) << comm.to_string();
    EXPECT_EQ(comm.count("all_gather"), 0) << comm.to_string();
    EXPECT_EQ(index.placements(), Placements{Replicate()});
    EXPECT_TRUE(allclose(index.to_local().to(DType::F64), argmax(full, 1).to(DType::F64)));
  });
}

// ---- softmax, log_softmax -----------------------------------------------------------

TEST(OpsNn, Softmax) {
  struct Variant {
    bool log_form;
    Shape shape;
    int64_t dim;
  };
  for (const Variant& v : {Variant{false, {5, 7}, 1}, Variant{false, {5, 7}, 0}, Variant{true, {5, 7}, -1},
                           Variant{true, {2, 3, 5}, 1}, Variant{false, {2, 3, 5}, -1}}) {
    OpCase c;
    c.name = std::string(v.log_form ? "log_softmax" : "softmax") + " " + shape_to_string(v.shape) +
             " dim=" + std::to_string(v.dim);
    c.inputs = {Tensor::randn(v.shape, 21)};
    c.dist_fn = [v](const Inputs& in) { return v.log_form ? log_softmax(in[0], v.dim) : softmax(in[0], v.dim); };
    c.local_fn = [v](const Locals& in) { return v.log_form ? log_softmax(in[0], v.dim) : softmax(in[0], v.dim); };
    c.max_combinations = 16;
    conform(c);
  }
}

TEST(OpsNn, SoftmaxAlongShardedDimAllReducesStatisticsOnly) {
  const Tensor full = Tensor::randn({4, 10}, 22);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    for (bool log_form : {false, true}) {
      DistTensor x = distribute(full, mesh, {Shard(1)});
      x.set_requires_grad();
      CommDebugMode comm;
      const DistTensor y = log_form ? log_softmax(x, 1) : softmax(x, 1);
      // The row max and the row sum of exponentials: two [4, 1] F32 all-reduces.
      EXPECT_EQ(comm.count("all_reduce"), 2) << comm.to_string();
      EXPECT_EQ(comm.bytes("all_reduce"), 2 * 4 * 4) << comm.to_string();
      EXPECT_EQ(comm.total_count(), 2) << comm.to_string();
      EXPECT_EQ(y.placements(), Placements{Shard(1)});
      comm.reset();
      y.backward(distribute(Tensor::randn({4, 10}, 23), mesh, {Shard(1)}));
      EXPECT_EQ(comm.count("all_gather"), 0) << comm.to_string();
      EXPECT_EQ(x.grad().placements(), Placements{Shard(1)});
    }
  });
}

TEST(OpsNn, SoftmaxAlongUnshardedDimIsLocal) {
  const Tensor full = Tensor::randn({6, 5}, 24);
  launch(4, [&](Group world) {
    DeviceMesh mesh(world, {2, 2});
    DistTensor x = distribute(full, mesh, {Shard(0), Shard(0)});
    x.set_requires_grad();
    CommDebugMode comm;
    const DistTensor y = softmax(x, 1);
    y.backward(distribute(Tensor::randn({6, 5}, 25), mesh, {Shard(0), Shard(0)}));
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_EQ(y.placements(), (Placements{Shard(0), Shard(0)}));
  });
}

TEST(OpsNn, SoftmaxBackwardPassesPartialGradients) {
  const Tensor full = Tensor::randn({3, 5}, 26), upstream = Tensor::randn({3, 5}, 27);
  Tensor expected;
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    DistTensor x = distribute(full, mesh, {Replicate()});
    x.set_requires_grad();
    log_softmax(x, 1).backward(distribute(upstream, mesh, {Replicate()}));
    expected = x.grad().to_local();
  });
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor x = distribute(full, mesh, {Replicate()});
    x.set_requires_grad();
    const DistTensor y = log_softmax(x, 1);
    CommDebugMode comm;
    // The backward kernel is linear in the gradient: no reduction of it.
    y.backward(make_input(upstream, mesh, {Partial()}));
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_EQ(x.grad().placements(), Placements{Partial()});
    EXPECT_TRUE(allclose(x.grad().full_tensor(), expected, 1e-5, 1e-6));
  });
}

// ---- layer_norm, rms_norm -------------------------------------------------------------

TEST(OpsNn, LayerNorm) {
  {
    OpCase c;
    c.name = "layer_norm [5, 6] with weight and bias";
    c.inputs = {Tensor::randn({5, 6}, 31), Tensor::randn({6}, 32), Tensor::randn({6}, 33)};
    c.dist_fn = [](const Inputs& in) { return layer_norm(in[0], {6}, in[1], in[2]); };
    c.local_fn = [](const Locals& in) { return layer_norm(in[0], {6}, in[1], in[2]).out; };
    c.max_combinations = 30;
    conform(c);
  }
  {
    OpCase c;
    c.name = "layer_norm [3, 2, 5] over [2, 5] with weight";
    c.inputs = {Tensor::randn({3, 2, 5}, 34), Tensor::randn({2, 5}, 35)};
    c.dist_fn = [](const Inputs& in) { return layer_norm(in[0], {2, 5}, in[1], std::nullopt, 1e-3); };
    c.local_fn = [](const Locals& in) { return layer_norm(in[0], {2, 5}, in[1], std::nullopt, 1e-3).out; };
    c.max_combinations = 30;
    conform(c);
  }
  {
    OpCase c;
    c.name = "layer_norm [7, 5] without parameters";
    c.inputs = {Tensor::randn({7, 5}, 36)};
    c.dist_fn = [](const Inputs& in) { return layer_norm(in[0], {5}); };
    c.local_fn = [](const Locals& in) { return layer_norm(in[0], {5}, std::nullopt, std::nullopt).out; };
    c.max_combinations = 20;
    conform(c);
  }
}

TEST(OpsNn, RmsNorm) {
  {
    OpCase c;
    c.name = "rms_norm [5, 7] with weight";
    c.inputs = {Tensor::randn({5, 7}, 41), Tensor::randn({7}, 42)};
    c.dist_fn = [](const Inputs& in) { return rms_norm(in[0], {7}, in[1]); };
    c.local_fn = [](const Locals& in) { return rms_norm(in[0], {7}, in[1]).out; };
    c.max_combinations = 30;
    conform(c);
  }
  {
    OpCase c;
    c.name = "rms_norm [2, 3, 4] over [3, 4] without weight";
    c.inputs = {Tensor::randn({2, 3, 4}, 43)};
    c.dist_fn = [](const Inputs& in) { return rms_norm(in[0], {3, 4}, std::nullopt, 1e-4); };
    c.local_fn = [](const Locals& in) { return rms_norm(in[0], {3, 4}, std::nullopt, 1e-4).out; };
    c.max_combinations = 20;
    conform(c);
  }
}

TEST(OpsNn, LayerNormCollectives) {
  const Tensor x_full = Tensor::randn({4, 8}, 44), w_full = Tensor::randn({8}, 45), b_full = Tensor::randn({8}, 46);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const Placements r{Replicate()};
    {
      // Sequence parallel: rows sharded, no communication forward or backward; the
      // parameter gradients are Partial(sum) (summed later, like DDP's all-reduce).
      DistTensor x = distribute(x_full, mesh, {Shard(0)});
      DistTensor w = distribute(w_full, mesh, r), b = distribute(b_full, mesh, r);
      w.set_requires_grad();
      b.set_requires_grad();
      CommDebugMode comm;
      const DistTensor y = layer_norm(x, {8}, w, b);
      y.backward(distribute(Tensor::randn({4, 8}, 47), mesh, {Shard(0)}));
      EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
      EXPECT_EQ(w.grad().placements(), Placements{Partial()});
      EXPECT_EQ(b.grad().placements(), Placements{Partial()});
    }
    {
      // Hidden dim sharded: the mean and the variance, two [4, 1] all-reduces.
      const DistTensor x = distribute(x_full, mesh, {Shard(1)});
      const DistTensor w = distribute(w_full, mesh, {Shard(0)}), b = distribute(b_full, mesh, {Shard(0)});
      CommDebugMode comm;
      const DistTensor y = layer_norm(x, {8}, w, b);
      EXPECT_EQ(comm.count("all_reduce"), 2) << comm.to_string();
      EXPECT_EQ(comm.bytes("all_reduce"), 2 * 4 * 4) << comm.to_string();
      EXPECT_EQ(comm.total_count(), 2) << comm.to_string();
      EXPECT_EQ(y.placements(), Placements{Shard(1)});
    }
  });
}

// ---- embedding ------------------------------------------------------------------------

TEST(OpsNn, Embedding) {
  OpCase c;
  c.name = "embedding [7, 4] ids [2, 3]";
  c.inputs = {Tensor::randn({7, 4}, 51), ids_tensor({0, 6, 3, 3, 5, 1}, {2, 3})};
  c.differentiable = {true, false};
  c.dist_fn = [](const Inputs& in) { return embedding(in[0], in[1]); };
  c.local_fn = [](const Locals& in) { return embedding(in[0], in[1]); };
  c.max_combinations = 40;
  conform(c);
}

TEST(OpsNn, VocabParallelEmbedding) {
  const Tensor table = Tensor::randn({7, 4}, 52);
  const Tensor ids = ids_tensor({0, 6, 3, 3, 5}, {5});
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor t = distribute(table, mesh, {Shard(0)});
    t.set_requires_grad();
    CommDebugMode comm;
    const DistTensor out = embedding(t, distribute(ids, mesh, {Replicate()}));
    // Masked local lookups: a Partial(sum) output, no communication yet.
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_EQ(out.placements(), Placements{Partial()});
    const DistTensor replicated = out.redistribute({Replicate()});
    EXPECT_EQ(comm.count("all_reduce"), 1) << comm.to_string();
    EXPECT_TRUE(allclose(replicated.to_local(), embedding(table, ids)));
    comm.reset();
    replicated.backward(distribute(Tensor::randn({5, 4}, 53), mesh, {Replicate()}));
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_EQ(t.grad().placements(), Placements{Shard(0)});
  });
}

// ---- cross_entropy ----------------------------------------------------------------------

TEST(OpsNn, CrossEntropy) {
  const Tensor targets = ids_tensor({3, -100, 0, 6, 2}, {5});
  for (LossReduction reduction : {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
    OpCase c;
    c.name = "cross_entropy [5, 7] reduction " + std::to_string(static_cast<int>(reduction));
    c.inputs = {Tensor::randn({5, 7}, 61), targets};
    c.differentiable = {true, false};
    c.dist_fn = [reduction](const Inputs& in) { return cross_entropy(in[0], in[1], reduction); };
    c.local_fn = [reduction](const Locals& in) { return cross_entropy(in[0], in[1], reduction); };
    c.max_combinations = 30;
    conform(c);
  }
  {
    OpCase c;
    c.name = "cross_entropy [4, 5] ignore_index=1 (a class)";
    c.inputs = {Tensor::randn({4, 5}, 62), ids_tensor({1, 4, 0, 1}, {4})};
    c.differentiable = {true, false};
    c.dist_fn = [](const Inputs& in) { return cross_entropy(in[0], in[1], LossReduction::Mean, 1); };
    c.local_fn = [](const Locals& in) { return cross_entropy(in[0], in[1], LossReduction::Mean, 1); };
    c.max_combinations = 20;
    conform(c);
  }
}

// Leading dims [B, T] as they are (no reshape to rows), in every layout: the rows of
// either dim, or the classes, sharded.
TEST(OpsNn, CrossEntropyOverLeadingDims) {
  for (LossReduction reduction : {LossReduction::Mean, LossReduction::None}) {
    OpCase c;
    c.name = "cross_entropy [2, 3, 5] reduction " + std::to_string(static_cast<int>(reduction));
    c.inputs = {Tensor::randn({2, 3, 5}, 64), ids_tensor({4, 0, -100, 2, 1, 3}, {2, 3})};
    c.differentiable = {true, false};
    c.dist_fn = [reduction](const Inputs& in) { return cross_entropy(in[0], in[1], reduction); };
    c.local_fn = [reduction](const Locals& in) {
      const Tensor rows = cross_entropy(in[0].reshape({6, 5}), in[1].reshape({6}), reduction);
      return reduction == LossReduction::None ? rows.reshape({2, 3}) : rows;
    };
    c.max_combinations = 30;
    conform(c);
  }
}

TEST(OpsNn, VocabParallelCrossEntropyNeverGathersLogits) {
  const Tensor logits = Tensor::randn({4, 10}, 63);
  const Tensor targets = ids_tensor({9, 0, 5, 4}, {4});
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor x = distribute(logits, mesh, {Shard(1)});
    x.set_requires_grad();
    CommDebugMode comm;
    const DistTensor loss = cross_entropy(x, distribute(targets, mesh, {Replicate()}));
    const Tensor value = loss.full_tensor();
    // Megatron's three all-reduces of [N]-sized values (row max, sum of
    // exponentials, target logit); the [N] losses reduce to a scalar locally.
    EXPECT_EQ(comm.count("all_gather"), 0) << comm.to_string();
    EXPECT_EQ(comm.count("all_reduce"), 3) << comm.to_string();
    EXPECT_EQ(comm.bytes("all_reduce"), 3 * 4 * 4) << comm.to_string();
    EXPECT_EQ(comm.total_count(), 3) << comm.to_string();
    EXPECT_NEAR(value.item<double>(), cross_entropy(logits, targets).item<double>(), 1e-5);
    comm.reset();
    loss.backward();
    // The gradient flows back through the replicated statistics and the owner's
    // pick: softmax - onehot on each shard, with no communication at all.
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_EQ(x.grad().placements(), Placements{Shard(1)});
    EXPECT_TRUE(allclose(x.grad().full_tensor(), cross_entropy_backward(Tensor::scalar(1.0f), logits, targets),
                         1e-4, 1e-6));
  });
}

// ---- attention ------------------------------------------------------------------------

TEST(OpsNn, ScaledDotProductAttention) {
  for (bool causal : {false, true}) {
    OpCase c;
    c.name = std::string("sdpa [2, 3, 4] causal=") + (causal ? "1" : "0");
    c.inputs = {Tensor::randn({2, 3, 4}, 71), Tensor::randn({2, 3, 4}, 72), Tensor::randn({2, 3, 4}, 73)};
    c.dist_fn = [causal](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal); };
    c.local_fn = [causal](const Locals& in) {
      Tensor scores = mul(matmul(in[0], in[1].transpose(-1, -2)), 0.5);
      if (causal) {
        const Tensor allowed = le(Tensor::arange(3).unsqueeze(0), Tensor::arange(3).unsqueeze(1));
        scores = where(allowed, scores, Tensor::full({}, -INFINITY));
      }
      return matmul(softmax(scores, -1), in[2]);
    };
    c.max_combinations = 20;
    conform(c);
  }
  {
    // Fewer queries than keys, uneven sizes.
    OpCase c;
    c.name = "sdpa q [3, 2, 4] k, v [3, 5, 4] causal";
    c.inputs = {Tensor::randn({3, 2, 4}, 74), Tensor::randn({3, 5, 4}, 75), Tensor::randn({3, 5, 4}, 76)};
    c.dist_fn = [](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], true); };
    c.max_combinations = 20;
    conform(c);
  }
}

TEST(OpsNn, AttentionWithHeadsShardedIsLocal) {
  const Tensor q = Tensor::randn({2, 4, 3, 4}, 77), k = Tensor::randn({2, 4, 3, 4}, 78),
               v = Tensor::randn({2, 4, 3, 4}, 79);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const Placements heads{Shard(1)};
    CommDebugMode comm;
    const DistTensor out = scaled_dot_product_attention(distribute(q, mesh, heads), distribute(k, mesh, heads),
                                                        distribute(v, mesh, heads), true);
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_EQ(out.placements(), heads);
  });
}

// ---- dropout --------------------------------------------------------------------------

// The definition, independently: element i kept iff uniform(seed, i) >= p.
Tensor dropout_reference(const Tensor& x, double p, uint64_t seed) {
  std::vector<double> values = x.to(DType::F64).to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = random::uniform(seed, i) >= p ? values[i] / (1 - p) : 0.0;
  }
  return Tensor::from_vector(values, x.shape()).to(x.dtype());
}

TEST(OpsNn, Dropout) {
  const Tensor input = Tensor::randn({5, 7}, 81);
  const Tensor expected = dropout_reference(input, 0.4, 99);
  // The case must drop some elements and keep others to test anything.
  const int64_t kept = sum(binary(BinaryOp::Ne, expected, 0.0)).item<int64_t>();
  ASSERT_GT(kept, 5);
  ASSERT_LT(kept, 30);
  OpCase c;
  c.name = "dropout [5, 7] p=0.4";
  c.inputs = {input};
  c.dist_fn = [](const Inputs& in) { return dropout(in[0], 0.4, 99); };
  c.local_fn = [](const Locals& in) { return dropout_reference(in[0], 0.4, 99); };
  c.max_combinations = 20;
  conform(c);
}

TEST(OpsNn, DropoutMaskIsLayoutIndependent) {
  const Tensor input = Tensor::randn({7, 5}, 82);
  const Tensor expected = dropout_reference(input, 0.5, 7);
  launch(4, [&](Group world) {
    DeviceMesh mesh(world, {2, 2});
    for (const Placements& p : {Placements{Shard(0), Shard(0)}, Placements{Shard(0, 1), Shard(0, 0)},
                                Placements{Shard(1), Shard(0)}, Placements{Replicate(), Shard(1)},
                                Placements{Partial(), Shard(0)}}) {
      CommDebugMode comm;
      const DistTensor out = dropout(distribute(input, mesh, p), 0.5, 7);
      EXPECT_EQ(comm.total_count(), 0) << placements_to_string(p);
      EXPECT_EQ(out.placements(), p);
      EXPECT_TRUE(allclose(out.full_tensor(), expected, 1e-6, 1e-6)) << placements_to_string(p);
    }
    // Off in evaluation and for p = 0: the input itself.
    const DistTensor x = distribute(input, mesh, {Shard(0), Replicate()});
    EXPECT_EQ(dropout(x, 0.5, 7, false).impl(), x.impl());
    EXPECT_EQ(dropout(x, 0.0, 7).impl(), x.impl());
  });
}

// ---- empty shards -----------------------------------------------------------------------

// Dims of size 2 leave the third rank of a 1-D mesh of 3 (and nested 2x2 shards)
// an empty piece: every op must accept it and contribute the identity.
TEST(OpsNn, EmptyShards) {
  std::vector<OpCase> cases(5);
  cases[0].name = "softmax [3, 2] dim 1";
  cases[0].inputs = {Tensor::randn({3, 2}, 101)};
  cases[0].dist_fn = [](const Inputs& in) { return softmax(in[0], 1); };
  cases[1].name = "argmax [3, 2] dim 1";
  cases[1].inputs = {Tensor::randn({3, 2}, 102)};
  cases[1].dist_fn = [](const Inputs& in) { return argmax(in[0], 1); };
  cases[2].name = "layer_norm [3, 2]";
  cases[2].inputs = {Tensor::randn({3, 2}, 103), Tensor::randn({2}, 104)};
  cases[2].dist_fn = [](const Inputs& in) { return layer_norm(in[0], {2}, in[1]); };
  cases[3].name = "embedding [2, 3]";
  cases[3].inputs = {Tensor::randn({2, 3}, 105), ids_tensor({1, 0, 1}, {3})};
  cases[3].differentiable = {true, false};
  cases[3].dist_fn = [](const Inputs& in) { return embedding(in[0], in[1]); };
  cases[4].name = "cross_entropy [2, 2]";
  cases[4].inputs = {Tensor::randn({2, 2}, 106), ids_tensor({1, 0}, {2})};
  cases[4].differentiable = {true, false};
  cases[4].dist_fn = [](const Inputs& in) { return cross_entropy(in[0], in[1]); };
  for (OpCase& c : cases) {
    c.max_combinations = 16;
    run_conformance(c);
  }
}

// ---- bad input ------------------------------------------------------------------------

TEST(OpsNn, BadInput) {
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const Placements r{Replicate()};
    const DistTensor x = distribute(Tensor::randn({4, 6}, 91), mesh, r);
    const DistTensor ints = distribute(ids_tensor({1, 2, 3, 4}, {4}), mesh, r);
    EXPECT_THROW_MSG(var(x, {0}, -1), std::invalid_argument, "[var] expected correction >= 0");
    EXPECT_THROW_MSG(var(x, {1, -1}), std::invalid_argument, "[var] expected distinct dims");
    EXPECT_THROW_MSG(argmax(x, 2), std::invalid_argument, "[argmax] dim 2 out of range");
    EXPECT_THROW_MSG(softmax(ints, 0), std::invalid_argument, "[softmax] expected a floating dtype, got i64");
    EXPECT_THROW_MSG(layer_norm(x, {4}), std::invalid_argument,
                     "[layer_norm] normalized_shape [4] does not match the trailing dims of the input [4, 6]");
    EXPECT_THROW_MSG(rms_norm(x, {6}, distribute(Tensor::randn({5}, 92), mesh, r)), std::invalid_argument,
                     "[rms_norm] expected weight of shape [6], got [5]");
    EXPECT_THROW_MSG(embedding(distribute(Tensor::randn({6}, 93), mesh, r), ints), std::invalid_argument,
                     "[embedding] expected a table [V, D], got [6]");
    EXPECT_THROW_MSG(embedding(x, x), std::invalid_argument, "[embedding] expected ids of dtype i64 or i32, got f32");
    // Vocab-parallel masking would hide an out-of-range id: it is checked.
    EXPECT_THROW_MSG(embedding(distribute(Tensor::randn({4, 6}, 94), mesh, {Shard(0)}), ints),
                     std::invalid_argument, "[embedding] expected ids in [0, 4), got ids in [1, 4]");
    EXPECT_THROW_MSG(cross_entropy(distribute(Tensor::randn({4}, 95), mesh, r), ints), std::invalid_argument,
                     "[cross_entropy] expected logits [N..., C], got [4]");
    EXPECT_THROW_MSG(cross_entropy(x, distribute(ids_tensor({1, 2}, {2}), mesh, r)), std::invalid_argument,
                     "[cross_entropy] expected targets [4] for logits [4, 6], got [2]");
    EXPECT_THROW_MSG(cross_entropy(distribute(Tensor::randn({4, 3}, 96), mesh, {Shard(1)}), ints),
                     std::invalid_argument, "[cross_entropy] expected targets in [0, 3)");
    EXPECT_THROW_MSG(scaled_dot_product_attention(x, distribute(Tensor::randn({4, 5}, 97), mesh, r), x),
                     std::invalid_argument, "[scaled_dot_product_attention] expected q and k with one head dim");
    EXPECT_THROW_MSG(dropout(x, 1.5, 1), std::invalid_argument, "[dropout] expected p in [0, 1], got 1.5");
  });
}

}  // namespace
}  // namespace dtensor::testing
