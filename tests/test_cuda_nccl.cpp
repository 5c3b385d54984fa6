// The nccl backend on a GPU machine (label cuda; skips with a message elsewhere):
// with one GPU, a world of one rank (its calls, CPU tensors through the host group)
// and two ranks refused on one GPU; with two or more, one rank per GPU inside one
// process (threads + nccl): every collective and point to point against the same
// call on CPU tensors, uneven sizes and strided blocks, async work ordering the
// consumer's stream, split, and the watchdog's timeout naming the call.
#include "backend/cuda/cuda_runtime.h"
#include "dtensor/cuda.h"
#include "dtensor/group.h"
#include "dtensor/ops.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

int gpus() { return backend::cuda::device_count(); }

// Small integers and halves: exact in every dtype, and in any order of summation.
Tensor rank_values(const Shape& shape, DType dtype, int rank, uint64_t seed) {
  Tensor u = Tensor::rand(shape, seed * 131 + static_cast<uint64_t>(rank));
  if (dtype == DType::Bool) return binary(BinaryOp::Gt, u, 0.5).to(DType::Bool);
  return ((u * 8.0 - 4.0).to(DType::I64).to(DType::F64) * 0.5).to(dtype);
}

void expect_same(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_TRUE(gpu.device().is_cuda()) << what;
  const Tensor back = gpu.to(Device::cpu());
  ASSERT_EQ(back.shape(), cpu.shape()) << what;
  EXPECT_TRUE(allclose(back.to(DType::F64), cpu.to(DType::F64), 1e-6, 1e-6)) << what;
}

const DType kAll[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool};

// A power of two (so Avg divides exactly, as the threads backend's does).
int ranks_for_test() { return gpus() >= 4 ? 4 : 2; }

#define REQUIRE_GPUS(n)                                                                                       \
  do {                                                                                                        \
    REQUIRE_GPU();                                                                                            \
    if (gpus() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs (one per rank), this machine has " << gpus(); \
  } while (0)

}  // namespace

TEST(CudaNccl, AWorldOfOneRankWorksAndTwoRanksOnOneGpuAreRefused) {
  REQUIRE_GPU();
  launch(1, [](Group) {
    Group world = init("nccl");
    EXPECT_EQ(world.backend(), "nccl");
    const Device gpu = Device::cuda(0);
    EXPECT_EQ(world.device(), gpu);
    expect_same(all_reduce(world, Tensor::ones({5}).to(gpu)), Tensor::ones({5}), "all_reduce of one rank");
    EXPECT_EQ(all_gather(world, Tensor::ones({2, 3}), 0).shape(), (Shape{2, 3}));  // a CPU tensor: the host group
    Group same = world.split(0);
    ASSERT_TRUE(same.defined());
    barrier(same);
  });
  if (gpus() == 1) {
    std::string error;
    try {
      launch(2, [](Group) { init("nccl"); });
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("NCCL does not allow two ranks on one GPU"), std::string::npos) << error;
  }
}

TEST(CudaNccl, EveryCollectiveMatchesTheCpu) {
  REQUIRE_GPUS(2);
  const int n = ranks_for_test();
  launch(n, [&](Group threads) {
    Group world = init("nccl");
    const int r = world.rank();
    const Device gpu = Device::cuda(r);
    EXPECT_EQ(world.device(), gpu);
    for (DType t : kAll) {
      const std::string tag = std::string(dtype_name(t)) + " on " + std::to_string(n) + " ranks";
      const Tensor x = rank_values({7, 3}, t, r, 1);
      std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
      if (is_floating(t)) ops.push_back(ReduceOp::Avg);
      for (ReduceOp op : ops)
        expect_same(all_reduce(world, x.to(gpu), op), all_reduce(threads, x, op), "all_reduce " + tag);
      const Tensor rows = rank_values({r + 1, 3}, t, r, 2);  // uneven
      expect_same(all_gather(world, rows.to(gpu), 0), all_gather(threads, rows, 0), "all_gather uneven " + tag);
      const Tensor cols = rank_values({4, 2}, t, r, 3);  // equal blocks of several rows
      expect_same(all_gather(world, cols.to(gpu), 1), all_gather(threads, cols, 1), "all_gather dim 1 " + tag);
      const Tensor big = rank_values({4 * n + 3, 5}, t, r, 4);
      expect_same(reduce_scatter(world, big.to(gpu), ReduceOp::Sum, 0), reduce_scatter(threads, big, ReduceOp::Sum, 0),
                  "reduce_scatter uneven " + tag);
      const Tensor wide = rank_values({3, 2 * n}, t, r, 5);
      expect_same(reduce_scatter(world, wide.to(gpu), ReduceOp::Max, 1),
                  reduce_scatter(threads, wide, ReduceOp::Max, 1), "reduce_scatter dim 1 " + tag);
      std::vector<int64_t> send(n), recv(n);
      int64_t total = 0;
      for (int s = 0; s < n; ++s) send[s] = s + r + 1, recv[s] = r + s + 1, total += send[s];
      const Tensor a = rank_values({total, 2}, t, r, 6);
      expect_same(all_to_all(world, a.to(gpu), recv, send), all_to_all(threads, a, recv, send), "all_to_all " + tag);
      const Tensor b = rank_values({5}, t, r, 7);
      expect_same(broadcast(world, b.to(gpu), n - 1), broadcast(threads, b, n - 1), "broadcast " + tag);
      const Tensor g = gather(world, rows.to(gpu), 0);
      const Tensor g_cpu = gather(threads, rows, 0);
      if (r == 0) expect_same(g, g_cpu, "gather " + tag);
      Tensor piece = Tensor::empty({r + 1, 3}, t, gpu);
      Tensor piece_cpu = Tensor::empty({r + 1, 3}, t);
      const Tensor whole = rank_values({n * (n + 1) / 2, 3}, t, 0, 8);
      scatter(world, whole.to(gpu), piece, 0);
      scatter(threads, whole, piece_cpu, 0);
      expect_same(piece, piece_cpu, "scatter " + tag);
    }
  });
}

TEST(CudaNccl, AsyncWorkAndPointToPointOrderTheConsumersStream) {
  REQUIRE_GPUS(2);
  const int n = ranks_for_test();
  launch(n, [&](Group) {
    Group world = init("nccl");
    const int r = world.rank();
    const Device gpu = Device::cuda(r);
    const Tensor in = Tensor::full({1 << 22}, static_cast<double>(r + 1)).to(gpu);
    Tensor out = Tensor::empty(in.shape(), in.dtype(), gpu);
    Work w = all_reduce_async(world, in, out);
    w.wait();  // orders this rank's stream; the host does not block
    expect_same(out.narrow(0, 0, 4), Tensor::full({4}, n * (n + 1) / 2.0), "all_reduce_async");
    const Tensor mine = Tensor::full({1000}, static_cast<double>(r)).to(gpu);
    Tensor got = Tensor::empty({1000}, DType::F32, gpu);
    batch_send_recv(world, {P2POp::send(mine, (r + 1) % n), P2POp::recv(got, (r + n - 1) % n)});
    expect_same(got.narrow(0, 0, 3), Tensor::full({3}, (r + n - 1) % n), "ring send/recv");
    Group pair = world.split(r % 2);
    const Tensor summed = all_reduce(pair, Tensor::full({3}, 1.0).to(gpu));
    expect_same(summed, Tensor::full({3}, static_cast<double>(pair.size())), "all_reduce on a split");
  });
}

TEST(CudaNccl, AMissingRankTimesOutNamingTheCall) {
  REQUIRE_GPUS(2);
  std::string error;
  try {
    launch(2, [](Group) {
      Group world = init("nccl");
      world.set_timeout(std::chrono::milliseconds(2000));
      const Tensor x = Tensor::ones({16}).to(Device::cuda(world.rank()));
      all_reduce(world, x);  // both ranks: NCCL connects lazily, on the first call
      cuda::synchronize(world.rank());
      if (world.rank() == 0) {
        all_reduce(world, x);
        cuda::synchronize(0);  // returns once the watchdog aborted the communicator
        all_reduce(world, x);  // throws the reason
      }
    });
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("[all_reduce] timed out after 2 s in group 'world' (nccl, size 2, this is rank 0, cuda:0), "
                       "call #1"),
            std::string::npos)
      << error;
}
