// Layouts: a 7x5 tensor on a 2x2 mesh, its pieces, and what moving it costs.
//
//   ./build/examples/layouts
#include <dtensor/dtensor.h>

#include <cstdio>
#include <mutex>

using namespace dtensor;

int main() {
  std::mutex print;
  launch(4, [&](Group world) {
    DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
    const Tensor full = Tensor::randn({7, 5}, /*seed=*/42);
    DistTensor d = distribute(full, mesh, {Shard(0), Shard(1)});
    DistTensor r = d.redistribute({Replicate(), Shard(0)});
    const RedistributePlan swap = explain_redistribute({Shard(0), Shard(1)}, {Shard(1), Shard(0)}, {7, 5}, mesh);
    const RedistributePlan gather = explain_redistribute({Shard(0), Shard(1)}, {Replicate(), Replicate()}, {7, 5}, mesh);
    const bool exact = allclose(r.full_tensor(), full, 0, 0);
    // Factories give the same global tensor for any layout.
    const bool same_random = allclose(randn({7, 5}, mesh, {Shard(1), Replicate()}, 42).full_tensor(), full, 0, 0);
    if (world.rank() != 0) return;
    std::lock_guard<std::mutex> lock(print);
    std::printf("%s\n", visualize_sharding(d).c_str());
    std::printf("%s\n", visualize_sharding(r).c_str());
    std::printf("redistribute S(0),S(1) -> R,S(0) exact: %s; randn layout-independent: %s\n\n",
                exact ? "yes" : "NO", same_random ? "yes" : "NO");
    std::printf("%s\n%s", swap.to_string().c_str(), gather.to_string().c_str());
  });
  return 0;
}
