// Backward in two parts (zero-bubble schedules): backward_input, then the deferred
// weight part, computes what one backward computes.
#include "dtensor/autograd.h"
#include "dtensor/nn/layers.h"
#include "dtensor/ops.h"
#include "test_helpers.h"

using namespace dtensor;

// Two copies of one block with the same input: backward() on one, backward_input and
// then run() on the other, the same gradients; the weights' wait for run().
TEST(SplitBackward, InputPartThenWeightPartEqualsOneBackward) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    const nn::BlockConfig bc{16, 2, 64, nn::Activation::Gelu, false, true, 0.0, 2};
    nn::TransformerBlock a(mesh, bc, 7), b(mesh, bc, 7);
    const Tensor input = Tensor::randn({2, 8, 16}, 9);
    DistTensor xa = distribute(input, mesh, {Replicate()}).set_requires_grad();
    DistTensor xb = distribute(input, mesh, {Replicate()}).set_requires_grad();
    const DistTensor w = distribute(Tensor::randn({2, 8, 16}, 10), mesh, {Replicate()});
    sum(mul(a(xa), w)).backward();
    DeferredBackward rest = backward_input(sum(mul(b(xb), w)), {}, {xb});
    EXPECT_TRUE(rest.pending());
    EXPECT_TRUE(allclose(xb.grad().to_local(), xa.grad().to_local(), 1e-6, 1e-7));
    // matmul left the weight gradients for the second part.
    EXPECT_FALSE(b.submodule("attn.q").named_parameters()[0].second.grad().defined());
    EXPECT_FALSE(b.submodule("mlp.up").named_parameters()[0].second.grad().defined());
    rest.run();
    EXPECT_FALSE(rest.pending());
    rest.run();  // nothing left
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t k = 0; k < pa.size(); ++k) {
      ASSERT_TRUE(pb[k].second.grad().defined()) << pb[k].first;
      EXPECT_TRUE(allclose(pb[k].second.grad().to_local(), pa[k].second.grad().to_local(), 1e-6, 1e-7))
          << pb[k].first << ": "
          << compare(pb[k].second.grad().to_local(), pa[k].second.grad().to_local(), 1e-6, 1e-7).to_string();
    }
    // Grad-ready hooks (DDP, FSDP) fire in the part that accumulates the gradient.
    int fired = 0;
    nn::Linear hooked(mesh, 16, 4, false, 5);
    register_grad_ready_hook(hooked.weight(), [&](const DistTensor&) { ++fired; });
    DistTensor xh = distribute(input, mesh, {Replicate()}).set_requires_grad();
    DeferredBackward later = backward_input(sum(hooked(xh)), {}, {xh});
    EXPECT_EQ(fired, 0);
    later.run();
    EXPECT_EQ(fired, 1);
    // No input that requires grad: all of it waits for run().
    nn::Linear lin(mesh, 16, 4, false, 3);
    DeferredBackward all = backward_input(sum(lin(distribute(input, mesh, {Replicate()}))), {}, {});
    EXPECT_FALSE(lin.weight().grad().defined());
    all.run();
    EXPECT_TRUE(lin.weight().grad().defined());
    // Only leaves can be the inputs.
    DistTensor leaf = distribute(input, mesh, {Replicate()}).set_requires_grad();
    const DistTensor made = mul(leaf, 2.0);
    EXPECT_THROW_MSG(backward_input(sum(made), {}, {made}), std::invalid_argument,
                     "[backward_input] expected the inputs to be leaves");
  });
}

