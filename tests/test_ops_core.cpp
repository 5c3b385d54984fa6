// Conformance of the core DistTensor ops (pointwise, matmul, reductions) and the
// autograd engine: every placement combination against one rank, backward against
// finite differences, exact collective counts for the canonical cases.
#include "dist_op_test_util.h"

using namespace dtensor;
using dtensor::testing::check_finite_differences;
using dtensor::testing::OpCase;
using dtensor::testing::run_conformance;
using Ins = std::vector<DistTensor>;
using LIns = std::vector<Tensor>;

namespace {
Tensor positive(const Shape& shape, uint64_t seed) { return add(Tensor::rand(shape, seed), 0.5); }
}  // namespace

TEST(OpsCore, UnaryOps) {
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::GeluErf,
                     UnaryOp::GeluTanh, UnaryOp::Silu, UnaryOp::Square, UnaryOp::Abs}) {
    OpCase c{std::string("unary ") + op_name(op), {Tensor::randn({5, 3}, 1)}};
    c.dist_fn = [op](const Ins& x) { return unary(op, x[0]); };
    c.local_fn = [op](const LIns& x) { return unary(op, x[0]); };
    c.max_combinations = 30;
    run_conformance(c);
    if (op != UnaryOp::Relu && op != UnaryOp::Abs) check_finite_differences(c);
  }
  for (UnaryOp op : {UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt}) {
    OpCase c{std::string("unary ") + op_name(op), {positive({4, 3}, 2)}};
    c.dist_fn = [op](const Ins& x) { return unary(op, x[0]); };
    c.local_fn = [op](const LIns& x) { return unary(op, x[0]); };
    c.max_combinations = 30;
    run_conformance(c);
    check_finite_differences(c);
  }
}

TEST(OpsCore, BinaryOpsWithBroadcasting) {
  for (BinaryOp op :
       {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum}) {
    OpCase c{std::string("binary ") + op_name(op),
             {Tensor::randn({5, 3}, 3), op == BinaryOp::Div ? positive({3}, 4) : Tensor::randn({3}, 4)}};
    c.dist_fn = [op](const Ins& x) { return binary(op, x[0], x[1]); };
    c.local_fn = [op](const LIns& x) { return binary(op, x[0], x[1]); };
    c.max_combinations = 60;
    run_conformance(c);
    check_finite_differences(c);
  }
  OpCase p{"pow", {positive({3, 4}, 5), Tensor::randn({3, 4}, 6)}};
  p.dist_fn = [](const Ins& x) { return pow(x[0], x[1]); };
  p.local_fn = [](const LIns& x) { return pow(x[0], x[1]); };
  p.max_combinations = 40;
  run_conformance(p);
  check_finite_differences(p);
}

TEST(OpsCore, ScalarsComparisonsAndWhere) {
  OpCase s{"scalar chain", {Tensor::randn({7, 2}, 7)}};
  s.dist_fn = [](const Ins& x) { return maximum(pow(add(mul(x[0], 3.0), 1.0), 2.0) / 4.0 - 0.5, 0.25); };
  s.local_fn = [](const LIns& x) { return maximum(pow(add(mul(x[0], 3.0), 1.0), 2.0) / 4.0 - 0.5, 0.25); };
  run_conformance(s);
  check_finite_differences(s);
  OpCase w{"where", {Tensor::randn({4, 3}, 8), Tensor::randn({4, 3}, 9), Tensor::randn({3}, 10)}};
  w.dist_fn = [](const Ins& x) { return where(gt(x[0], x[1]), x[1], x[2]); };
  w.local_fn = [](const LIns& x) { return where(gt(x[0], x[1]), x[1], x[2]); };
  w.max_combinations = 60;
  run_conformance(w);
  check_finite_differences(w);
}

TEST(OpsCore, MatmulEveryLayout) {
  OpCase c{"matmul", {Tensor::randn({5, 4}, 11), Tensor::randn({4, 3}, 12)}};
  c.dist_fn = [](const Ins& x) { return matmul(x[0], x[1]); };
  c.local_fn = [](const LIns& x) { return matmul(x[0], x[1]); };
  c.max_combinations = 400;
  run_conformance(c);
  check_finite_differences(c);
  OpCase b{"batched matmul", {Tensor::randn({2, 3, 4}, 13), Tensor::randn({4, 5}, 14)}};
  b.dist_fn = [](const Ins& x) { return matmul(x[0], x[1]); };
  b.local_fn = [](const LIns& x) { return matmul(x[0], x[1]); };
  b.max_combinations = 80;
  run_conformance(b);
  check_finite_differences(b);
  OpCase l{"linear", {Tensor::randn({3, 4}, 15), Tensor::randn({5, 4}, 16), Tensor::randn({5}, 17)}};
  l.dist_fn = [](const Ins& x) { return linear(x[0], x[1], x[2]); };
  l.local_fn = [](const LIns& x) { return linear(x[0], x[1], x[2]); };
  l.max_combinations = 80;
  run_conformance(l);
  check_finite_differences(l);
  OpCase lb{"batched linear", {Tensor::randn({2, 3, 4}, 18), Tensor::randn({5, 4}, 19), Tensor::randn({5}, 20)}};
  lb.dist_fn = [](const Ins& x) { return linear(x[0], x[1], x[2]); };
  lb.local_fn = [](const LIns& x) { return linear(x[0], x[1], x[2]); };
  lb.max_combinations = 80;
  run_conformance(lb);
  check_finite_differences(lb);
}

// linear() adds the bias in the GEMM's epilogue ("linear" node) where the product is
// not Partial: column parallel (weight and bias S(0)) and data parallel communicate
// nothing in forward. Row parallel (the contraction sharded) is matmul then add, so
// the bias is added once (the Replicate bias becomes a Partial held by one rank).
TEST(OpsCore, LinearFusesTheBiasUnlessTheProductIsPartial) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2}, {"tp"});
    const Tensor xf = Tensor::randn({2, 3, 8}, 1), wf = Tensor::randn({6, 8}, 2), bf = Tensor::randn({6}, 3);
    const Tensor want = linear(xf, wf, bf);
    struct Case {
      Placements x, w, b;
      const char* node;
      Placement out;
    };
    for (const Case& c : {Case{{Replicate()}, {Shard(0)}, {Shard(0)}, "linear", Shard(2)},     // column parallel
                          Case{{Replicate()}, {Shard(0)}, {Replicate()}, "linear", Shard(2)},  // bias sliced locally
                          Case{{Shard(0)}, {Replicate()}, {Replicate()}, "linear", Shard(0)},  // data parallel
                          Case{{Shard(2)}, {Shard(1)}, {Replicate()}, "add", Partial()}}) {    // row parallel
      DistTensor x = distribute(xf, mesh, c.x).set_requires_grad();
      DistTensor w = distribute(wf, mesh, c.w).set_requires_grad();
      DistTensor b = distribute(bf, mesh, c.b).set_requires_grad();
      CommDebugMode forward;
      DistTensor y = linear(x, w, b);
      EXPECT_EQ(y.grad_fn_name(), c.node);
      EXPECT_EQ(forward.total_count(), 0) << forward.to_string();
      EXPECT_EQ(y.placements()[0], c.out) << y.to_string();
      EXPECT_TRUE(allclose(y.full_tensor(), want, 1e-5, 1e-5)) << c.node;
      sum(mul(y, y)).backward();
      // Gradients against the composite op on one rank's full tensors.
      DistTensor xr = distribute(xf, mesh, {Replicate()}).set_requires_grad();
      DistTensor wr = distribute(wf, mesh, {Replicate()}).set_requires_grad();
      DistTensor br = distribute(bf, mesh, {Replicate()}).set_requires_grad();
      DistTensor yr = add(matmul(xr, transpose(wr, 0, 1)), br);
      sum(mul(yr, yr)).backward();
      EXPECT_TRUE(allclose(x.grad().full_tensor(), xr.grad().full_tensor(), 1e-5, 1e-5));
      EXPECT_TRUE(allclose(w.grad().full_tensor(), wr.grad().full_tensor(), 1e-5, 1e-5));
      EXPECT_TRUE(allclose(b.grad().full_tensor(), br.grad().full_tensor(), 1e-5, 1e-5));
      EXPECT_TRUE(w.grad().to_local().is_contiguous())
          << c.node << " " << w.grad().to_string() << " strides " << w.grad().to_local().stride(0) << ","
          << w.grad().to_local().stride(1);
    }
  });
}

// A Linear whose input is sharded inside its batch dims (the sequence, as context
// parallelism shards it) gets its weight's gradient from one contraction over each
// rank's rows, a Partial sum, without communicating in backward and without holding
// a [batch, out, in] product per batch entry; a plain 2-D right operand too.
TEST(OpsCore, WeightGradientOverSequenceShardsIsOneContraction) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2}, {"cp"});
    const int64_t batch = 64, seq = 8, in = 96, out = 96;
    const Tensor xf = Tensor::randn({batch, seq, in}, 1), wf = Tensor::randn({out, in}, 2);
    for (bool weight : {true, false}) {
      const std::string what = weight ? "linear" : "matmul";
      DistTensor x = distribute(xf, mesh, {Shard(1)}).set_requires_grad();
      DistTensor w = distribute(weight ? wf : wf.t().contiguous(), mesh, {Replicate()}).set_requires_grad();
      DistTensor y = weight ? linear(x, w) : matmul(x, w);
      DistTensor loss = sum(mul(y, y));
      const int64_t before = memory_stats().live_bytes;
      reset_peak_memory();
      CommDebugMode backward;
      loss.backward();
      const int64_t peak = memory_stats().peak_bytes - before;
      EXPECT_EQ(backward.total_count(), 0) << what << ": " << backward.to_string();
      EXPECT_TRUE(w.grad().placements()[0].is_partial()) << what << " " << w.grad().to_string();
      // Backward holds the local rows' gradients (about 0.1 MB each), never a
      // [batch, out, in] product (2.4 MB).
      EXPECT_LT(peak, batch * out * in * 4 / 4) << what;
      DistTensor xr = distribute(xf, mesh, {Replicate()}).set_requires_grad();
      DistTensor wr = distribute(weight ? wf : wf.t().contiguous(), mesh, {Replicate()}).set_requires_grad();
      DistTensor yr = weight ? linear(xr, wr) : matmul(xr, wr);
      sum(mul(yr, yr)).backward();
      // Sums of 512 rows' products of about 20 x 1, in another order than the reference's.
      EXPECT_LT(amax(abs(sub(w.grad().full_tensor(), wr.grad().full_tensor()))).item<double>(), 1e-2) << what;
      EXPECT_LT(amax(abs(sub(x.grad().full_tensor(), xr.grad().full_tensor()))).item<double>(), 1e-3) << what;
    }
  });
}

// linear_gelu() is linear's epilogue plus the GELU ("linear_gelu" node) wherever the
// bias fuses, with linear then gelu's values, placements, gradients and (no)
// communication; row parallel is the two ops, the Partial product reduced before the
// GELU as gelu(linear()) does.
TEST(OpsCore, LinearGeluIsLinearThenGeluWithOneGemm) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2}, {"tp"});
    const Tensor xf = Tensor::randn({2, 3, 8}, 1), wf = Tensor::randn({6, 8}, 2), bf = Tensor::randn({6}, 3);
    struct Case {
      Placements x, w, b;
      const char* node;
    };
    for (const Case& c : {Case{{Replicate()}, {Shard(0)}, {Shard(0)}, "linear_gelu"},     // column parallel
                          Case{{Shard(0)}, {Replicate()}, {Replicate()}, "linear_gelu"},  // data parallel
                          Case{{Shard(2)}, {Shard(1)}, {Replicate()}, "gelu"}}) {         // row parallel
      for (GeluApprox approx : {GeluApprox::Tanh, GeluApprox::None}) {
        auto run = [&](bool fused) {
          DistTensor x = distribute(xf, mesh, c.x).set_requires_grad();
          DistTensor w = distribute(wf, mesh, c.w).set_requires_grad();
          DistTensor b = distribute(bf, mesh, c.b).set_requires_grad();
          CommDebugMode comm;
          DistTensor y = fused ? linear_gelu(x, w, b, approx) : gelu(linear(x, w, b), approx);
          const std::string node = y.grad_fn_name();
          sum(mul(y, y)).backward();
          return std::tuple{y, x.grad(), w.grad(), b.grad(), comm.to_string(), node};
        };
        const auto [y, gx, gw, gb, comm, node] = run(true);
        const auto [y2, gx2, gw2, gb2, comm2, node2] = run(false);
        EXPECT_EQ(node, std::string(c.node) == "gelu" ? node2 : c.node);
        EXPECT_EQ(y.placements(), y2.placements()) << c.node;
        EXPECT_EQ(comm, comm2) << c.node << ": the same collectives as the two ops";
        for (auto [got, want] : {std::pair{y, y2}, {gx, gx2}, {gw, gw2}, {gb, gb2}}) {
          EXPECT_EQ(got.placements(), want.placements()) << c.node;
          EXPECT_TRUE(allclose(got.full_tensor(), want.full_tensor(), 1e-6, 1e-6)) << c.node;
        }
      }
    }
    // Without a bias it is the two ops.
    DistTensor x = distribute(xf, mesh, {Replicate()}), w = distribute(wf, mesh, {Shard(0)});
    EXPECT_TRUE(allclose(linear_gelu(x, w, std::nullopt).full_tensor(), gelu(linear(xf, wf)), 1e-6, 1e-6));
  });
}

TEST(OpsCore, Reductions) {
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {0, 2}, {-1}}) {
    for (bool keepdim : {false, true}) {
      OpCase c{"sum/mean/amax/amin", {Tensor::randn({5, 3, 2}, 18)}};
      c.dist_fn = [dims, keepdim](const Ins& x) {
        return add(add(sum(x[0], dims, keepdim), mean(x[0], dims, keepdim)),
                   add(amax(x[0], dims, keepdim), amin(x[0], dims, keepdim)));
      };
      c.local_fn = [dims, keepdim](const LIns& x) {
        return add(add(sum(x[0], dims, keepdim), mean(x[0], dims, keepdim)),
                   add(amax(x[0], dims, keepdim), amin(x[0], dims, keepdim)));
      };
      c.max_combinations = 40;
      run_conformance(c);
      check_finite_differences(c);
    }
  }
}

TEST(OpsCore, ShapeRelabellings) {
  OpCase c{"transpose/permute/unsqueeze/squeeze/expand", {Tensor::randn({3, 1, 4}, 19)}};
  c.dist_fn = [](const Ins& x) {
    return squeeze(unsqueeze(permute(expand(transpose(x[0], 0, 2), {4, 2, 3}), {2, 0, 1}), 1), 1);
  };
  c.local_fn = [](const LIns& x) { return x[0].transpose(0, 2).expand({4, 2, 3}).permute({2, 0, 1}).contiguous(); };
  run_conformance(c);
  check_finite_differences(c);
}

// Megatron's MLP: column-parallel then row-parallel linear: one all-reduce in
// forward (the Partial output reduced), one in backward (the input gradient).
TEST(OpsCore, ColumnThenRowParallelMatmulCommunicatesOncePerPass) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2}, {"tp"});
    DistTensor x = distribute(Tensor::randn({4, 8}, 1), mesh, {Replicate()});
    x.set_requires_grad();
    DistTensor w1 = distribute(Tensor::randn({8, 6}, 2), mesh, {Shard(1)}).set_requires_grad();
    DistTensor w2 = distribute(Tensor::randn({6, 8}, 3), mesh, {Shard(0)}).set_requires_grad();
    CommDebugMode forward;
    DistTensor h = relu(matmul(x, w1));  // S(1), local
    DistTensor y = matmul(h, w2);        // Partial(sum), local
    DistTensor out = y.redistribute({Replicate()});
    EXPECT_EQ(forward.count("all_reduce"), 1);
    EXPECT_EQ(forward.total_count(), 1);
    EXPECT_TRUE(h.placements()[0].is_shard(1));
    EXPECT_TRUE(y.placements()[0].is_partial());
    CommDebugMode backward_comm;
    out.backward(distribute(Tensor::randn({4, 8}, 4), mesh, {Replicate()}));
    // The gradient of x is Partial from the row-parallel side; resolving it is the one
    // all-reduce of the backward pass.
    DistTensor gx = x.grad().redistribute({Replicate()});
    EXPECT_EQ(backward_comm.count("all_reduce"), 1) << backward_comm.to_string();
    EXPECT_EQ(backward_comm.total_count(), 1) << backward_comm.to_string();
    EXPECT_TRUE(w1.grad().placements()[0].is_shard(1));
    EXPECT_TRUE(w2.grad().placements()[0].is_shard(0));
    EXPECT_EQ(gx.shape(), (Shape{4, 8}));
  });
}

// Data parallel: replicated weight, batch-sharded input -> the weight's gradient is
// Partial(sum); making it Replicate is DDP's all-reduce. FSDP: the weight sharded,
// all-gathered in forward -> its gradient reduce-scattered back to S(0).
TEST(OpsCore, DataParallelAndFsdpFallOutOfTheRules) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2}, {"dp"});
    const Tensor xf = Tensor::randn({6, 4}, 1), wf = Tensor::randn({4, 3}, 2);
    DistTensor x = distribute(xf, mesh, {Shard(0)});
    DistTensor w = distribute(wf, mesh, {Replicate()}).set_requires_grad();
    sum(matmul(x, w)).backward();
    EXPECT_TRUE(w.grad().placements()[0].is_partial()) << w.grad().to_string();
    CommDebugMode ddp;
    DistTensor reduced = w.grad().redistribute({Replicate()});
    EXPECT_EQ(ddp.count("all_reduce"), 1);
    // Reference: the gradient on full tensors is x^T @ ones.
    const Tensor expected = matmul(xf.t(), Tensor::ones({6, 3}));
    EXPECT_TRUE(allclose(reduced.to_local(), expected, 1e-5, 1e-5));

    DistTensor wsharded = distribute(wf, mesh, {Shard(0)}).set_requires_grad();
    CommDebugMode fsdp;
    DistTensor wfull = wsharded.redistribute({Replicate()});  // all-gather
    sum(matmul(x, wfull)).backward();
    EXPECT_EQ(fsdp.count("all_gather"), 1);
    EXPECT_EQ(fsdp.count("reduce_scatter"), 1) << fsdp.to_string();
    EXPECT_TRUE(wsharded.grad().placements()[0].is_shard(0));
    EXPECT_TRUE(allclose(wsharded.grad().full_tensor(), expected, 1e-5, 1e-5));
  });
}

TEST(Autograd, AccumulatesHooksRetainAndErrors) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor w = distribute(Tensor::from_vector<float>({1, 2, 3, 4}), mesh, {Shard(0)}).set_requires_grad();
    int hook_calls = 0;
    register_grad_ready_hook(w, [&](const DistTensor& p) {
      ++hook_calls;
      EXPECT_TRUE(p.grad().defined());
    });
    // Used twice: the gradients meet and are summed before the hook runs once.
    DistTensor loss = sum(add(mul(w, w), mul(w, 3.0)));
    loss.backward({}, /*retain_graph=*/true);
    EXPECT_EQ(hook_calls, 1);
    EXPECT_EQ(w.grad().full_tensor().to_vector<float>(), (std::vector<float>{5, 7, 9, 11}));
    loss.backward();  // accumulates
    EXPECT_EQ(w.grad().full_tensor().to_vector<float>(), (std::vector<float>{10, 14, 18, 22}));
    EXPECT_THROW_MSG(loss.backward(), std::invalid_argument, "second time");
    w.zero_grad();
    EXPECT_FALSE(w.grad().defined());
    {
      NoGradGuard no_grad;
      EXPECT_FALSE(mul(w, 2.0).requires_grad());
    }
    EXPECT_FALSE(mul(w, 2.0).detach().requires_grad());
    EXPECT_EQ(mul(w, 2.0).grad_fn_name(), "mul");
    EXPECT_THROW_MSG(mul(w, 2.0).backward(), std::invalid_argument,
                     "[backward] implicit gradient needs a tensor with one element");
    DistTensor ids = distribute(Tensor::arange(4), mesh, {Shard(0)});
    EXPECT_THROW_MSG(ids.set_requires_grad(), std::invalid_argument, "only floating tensors");
    EXPECT_THROW_MSG(mul(w, 2.0).set_requires_grad(), std::invalid_argument, "only leaves");
    EXPECT_THROW_MSG(backward(ids), std::invalid_argument, "[backward] expected a tensor that requires grad");
  });
}

TEST(OpsCore, BadInputsAndImplicitReplication) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    DeviceMesh other = DeviceMesh::from_ranks(world, {1, 0}, {2});
    DistTensor a = distribute(Tensor::randn({4, 3}, 1), mesh, {Shard(0)});
    DistTensor b = distribute(Tensor::randn({4, 3}, 2), other, {Shard(0)});
    EXPECT_THROW_MSG(add(a, b), std::invalid_argument, "operands live on different meshes");
    EXPECT_THROW_MSG(add(a, distribute(Tensor::randn({5}, 3), mesh, {Replicate()})), std::invalid_argument,
                     "do not broadcast");
    EXPECT_THROW_MSG(matmul(a, a), std::invalid_argument, "[matmul] inner dims differ: a is [4, 3], b is [4, 3]");
    EXPECT_THROW_MSG(sum(a, {0, 0}), std::invalid_argument, "[sum] dim 0 appears twice");
    const Tensor plain = Tensor::ones({3});
    EXPECT_THROW_MSG(a + plain, std::invalid_argument, "plain Tensor");
    ImplicitReplication scope;
    DistTensor c = a + plain;
    EXPECT_TRUE(allclose(c.full_tensor(), add(a.full_tensor(), plain), 0, 0));
  });
}

TEST(OpsCore, DispatchTraceShowsTheDecision) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor x = distribute(Tensor::randn({4, 4}, 1), mesh, {Shard(0)});
    DistTensor w = distribute(Tensor::randn({4, 4}, 2), mesh, {Shard(0)});
    DispatchTrace trace;
    DistTensor y = matmul(x, w);  // both S(0): one of them must move
    ASSERT_EQ(trace.decisions().size(), 1u);
    EXPECT_NE(trace.to_string().find("[dispatch] matmul"), std::string::npos) << trace.to_string();
    EXPECT_NE(trace.to_string().find("=> out " + placements_to_string(y.placements())), std::string::npos)
        << trace.to_string();
    EXPECT_NE(trace.to_string().find("->"), std::string::npos) << trace.to_string();
  });
}
