// dtensor quick start: local tensors, views, kernels and memory counters.
//
// Runs a two-layer MLP forward and its loss on a random batch, then checks one
// gradient kernel against finite differences, all on local tensors.
#include <dtensor/dtensor.h>

#include <cstdio>

using namespace dtensor;

int main() {
  // Layout-independent randomness: the same seed gives the same numbers for any shape.
  const int64_t batch = 8, features = 16, hidden = 32, classes = 4;
  Tensor x = Tensor::randn({batch, features}, /*seed=*/1);
  Tensor w1 = mul(Tensor::randn({hidden, features}, 2), 0.25);
  Tensor w2 = mul(Tensor::randn({classes, hidden}, 3), 0.25);
  Tensor targets = Tensor::from_vector<int64_t>({0, 1, 2, 3, 3, 2, 1, 0});

  // Views share memory: a transposed weight goes to BLAS without a copy.
  Tensor h = gelu(matmul(x, w1.t()));
  Tensor logits = linear(h, w2);
  Tensor probs = softmax(logits, -1);
  Tensor loss = cross_entropy(logits, targets);

  std::printf("x       %s\n", x.to_string(4).c_str());
  std::printf("probs   %s\n", probs.to_string(4).c_str());
  std::printf("row sums of probs: %s\n", sum(probs, {-1}).to_string().c_str());
  std::printf("loss    %.6f\n", loss.item<double>());
  std::printf("argmax  %s\n", argmax(logits, -1).to_string().c_str());

  // Backward kernels: d(loss)/d(logits) against a central finite difference.
  Tensor grad = cross_entropy_backward(Tensor::scalar(1.0f), logits, targets);
  const double eps = 1e-3;
  Tensor plus = logits.clone(), minus = logits.clone();
  plus.select(0, 2).select(0, 1).fill_(logits.select(0, 2).select(0, 1).item<double>() + eps);
  minus.select(0, 2).select(0, 1).fill_(logits.select(0, 2).select(0, 1).item<double>() - eps);
  const double numeric = (cross_entropy(plus, targets).item<double>() -
                          cross_entropy(minus, targets).item<double>()) / (2 * eps);
  std::printf("d loss / d logits[2,1]: kernel %.6f, finite difference %.6f\n",
              grad.select(0, 2).select(0, 1).item<double>(), numeric);

  const MemoryStats mem = memory_stats();
  std::printf("memory: %lld bytes live, %lld bytes peak\n", static_cast<long long>(mem.live_bytes),
              static_cast<long long>(mem.peak_bytes));
  return 0;
}
