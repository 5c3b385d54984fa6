// User ops with their own sharding rules: a fused op and its backward against one
// rank for every input layout (and nested orders), a linear op passing Partials
// through, the registry, rule parsing and input checks.
#include "dist_op_test_util.h"

namespace dtensor {
namespace {

using Locals = std::vector<Tensor>;
using Inputs = std::vector<DistTensor>;

const CustomOp& bias_gelu() {
  static const CustomOp grad{"test.bias_gelu_grad", ShardingRule::parse("ab,ab,b->ab"), [](const Locals& l) {
                               return gelu_backward(l[0], add(l[1], l[2]), GeluApprox::Tanh);
                             }};
  static const CustomOp op{"test.bias_gelu", ShardingRule::parse("ab,b->ab"),
                           [](const Locals& l) { return gelu(add(l[0], l[1]), GeluApprox::Tanh); },
                           [](const DistTensor& g, const Inputs& in) {
                             const DistTensor gx = grad({g, in[0], in[1]});
                             return Inputs{gx, sum(gx, {0})};
                           }};
  return op;
}

TEST(CustomOp, FusedOpMatchesOneRankOnEveryLayout) {
  testing::OpCase c{"bias_gelu", {Tensor::randn({5, 6}, 1), Tensor::randn({6}, 2)}};
  c.dist_fn = [](const Inputs& x) { return bias_gelu()(x); };
  c.local_fn = [](const Locals& x) { return gelu(add(x[0], x[1]), GeluApprox::Tanh); };
  c.max_combinations = 60;
  testing::run_conformance(c);
  testing::check_finite_differences(c);
  testing::run_nested_conformance(c, 12, 6);
}

// A linear op (scale rows by a vector) declared OneOf: a Partial x passes through
// without communication, and the result is right once reduced.
TEST(CustomOp, PartialPassesThroughALinearRule) {
  ShardingRule rule = ShardingRule::parse("ab, a -> ab");
  rule.partial = PartialRule::OneOf;
  rule.partial_inputs = {true, false};
  const CustomOp scale_rows{"test.scale_rows", rule, [](const Locals& l) { return mul(l[0], l[1].unsqueeze(1)); }};
  const Tensor xf = Tensor::randn({4, 3}, 1), sf = Tensor::randn({4}, 2);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor x = testing::make_input(xf, mesh, {Partial()});
    CommDebugMode comm;
    const DistTensor y = scale_rows({x, distribute(sf, mesh, {Replicate()})});
    EXPECT_EQ(y.placements(), Placements{Partial()});
    EXPECT_EQ(comm.total_count(), 0) << comm.to_string();
    EXPECT_TRUE(allclose(y.full_tensor(), mul(xf, sf.unsqueeze(1)), 1e-6, 1e-6));
  });
}

TEST(CustomOp, RegistryParsingAndBadInput) {
  register_op(CustomOp{"test.double", ShardingRule::parse("a->a"), [](const Locals& l) { return mul(l[0], 2.0); }});
  EXPECT_THROW_MSG(register_op(CustomOp{"test.double", ShardingRule::parse("a->a"), [](const Locals& l) { return l[0]; }}),
                   std::invalid_argument, "[register_op] an op named 'test.double' is registered already");
  EXPECT_EQ(ShardingRule::parse(" mk , kn -> mn ").to_string(), "mk,kn->mn");
  EXPECT_THROW_MSG(ShardingRule::parse("ab,b"), std::invalid_argument, "[ShardingRule] no \"->\" at position 4");
  EXPECT_THROW_MSG(ShardingRule::parse("ab,,b->ab"), std::invalid_argument, "an empty operand at position 3");
  EXPECT_THROW_MSG(ShardingRule::parse("a1->a"), std::invalid_argument, "'1' is neither a letter nor '_' at position 1");
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor v = distribute(Tensor::arange(0, 6, 1, DType::F32), mesh, {Shard(0)});
    EXPECT_TRUE(allclose(call_op("test.double", {v}).full_tensor(), mul(v.full_tensor(), 2.0), 0, 0));
    EXPECT_THROW_MSG(call_op("test.triple", {v}), std::invalid_argument, "[call_op] no op named 'test.triple' (registered:");
    const DistTensor m = distribute(Tensor::randn({3, 6}, 1), mesh, {Replicate()});
    EXPECT_THROW_MSG(bias_gelu()({m}), std::invalid_argument, "[test.bias_gelu] expected 2 inputs (rule 'ab,b->ab'), got 1");
    EXPECT_THROW_MSG(bias_gelu()({m, m}), std::invalid_argument,
                     "[test.bias_gelu] input 1 has shape [3, 6], the rule 'ab,b->ab' gives it 1 dims");
    const DistTensor short_bias = distribute(Tensor::randn({4}, 2), mesh, {Replicate()});
    EXPECT_THROW_MSG(bias_gelu()({m, short_bias}), std::invalid_argument,
                     "[test.bias_gelu] letter 'b' has size 6 in one input and 4 in input 1");
  });
}

}  // namespace
}  // namespace dtensor
