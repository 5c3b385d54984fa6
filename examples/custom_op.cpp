// A fused op of your own with its sharding rule and backward: gelu(x + b) in one
// kernel. The rule "ab,b->ab" says x's rows and columns may be sharded and the bias
// follows its columns; dispatch does the rest (here: x column-sharded, the bias
// chunked locally, no communication). The backward is a second fused op.
#include <dtensor/dtensor.h>

#include <cstdio>

using namespace dtensor;
using Locals = std::vector<Tensor>;

const CustomOp bias_gelu_grad{"bias_gelu_grad", ShardingRule::parse("ab,ab,b->ab"), [](const Locals& l) {
                                return gelu_backward(l[0], add(l[1], l[2]), GeluApprox::Tanh);
                              }};
const CustomOp bias_gelu{
    "bias_gelu", ShardingRule::parse("ab,b->ab"),
    [](const Locals& l) { return gelu(add(l[0], l[1]), GeluApprox::Tanh); },
    [](const DistTensor& g, const std::vector<DistTensor>& in) {
      const DistTensor gx = bias_gelu_grad({g, in[0], in[1]});
      return std::vector<DistTensor>{gx, sum(gx, {0})};
    }};

int main() {
  const Tensor xf = Tensor::randn({8, 6}, 1), bf = Tensor::randn({6}, 2);
  bool ok = true;
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2}, {"tp"});
    DistTensor x = distribute(xf, mesh, {Shard(1)}).set_requires_grad();
    DistTensor b = distribute(bf, mesh, {Replicate()}).set_requires_grad();
    CommDebugMode comm;
    const DistTensor y = bias_gelu({x, b});
    const int64_t forward_collectives = comm.total_count();
    sum(y).backward();
    // The same computation unfused, on full tensors.
    const Tensor want = gelu(add(xf, bf), GeluApprox::Tanh);
    const Tensor want_gx = gelu_backward(Tensor::ones({8, 6}), add(xf, bf), GeluApprox::Tanh);
    const bool same = allclose(y.full_tensor(), want, 1e-6, 1e-6) && allclose(x.grad().full_tensor(), want_gx, 1e-5, 1e-6) &&
                      allclose(b.grad().full_tensor(), sum(want_gx, {0}), 1e-5, 1e-5);
    if (world.rank() == 0) {
      std::printf("bias_gelu on %s: y %s, forward collectives %lld, matches the unfused ops: %s\n",
                  mesh.to_string().c_str(), placements_to_string(y.placements()).c_str(),
                  static_cast<long long>(forward_collectives), same ? "yes" : "NO");
      ok = same && forward_collectives == 0;
    }
  });
  return ok ? 0 : 1;
}
