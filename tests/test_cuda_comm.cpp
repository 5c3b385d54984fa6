// The threads backend on CUDA tensors (label cuda): 2 and 4 rank threads sharing
// GPU 0, every collective against the same collective on CPU tensors, bit for bit
// (the reduction kernel combines in rank order with the host's combiners and
// rounding), several dtypes and uneven sizes; a DistTensor matmul + sum with
// autograd on a 2-rank mesh of CUDA tensors against one CPU rank; the errors for
// tensors on different kinds of device. Skips with a message where no GPU is
// visible (except the last test, which runs only there: device buffers without a
// GPU fail cleanly); the combiners are the host reduction's (comm/reduce_ops.h),
// which the CPU comm suites cover.
#include "comm/block_all_to_all.h"
#include "comm/call_context.h"
#include "comm/comm_backend.h"
#include "dtensor/cuda.h"
#include "dtensor/dist_tensor.h"
#include "dtensor/group.h"
#include "dtensor/ops.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

// Values of `dtype` that differ per rank and element, exactly representable in
// every dtype (small integers and halves), no NaN.
Tensor rank_values(const Shape& shape, DType dtype, int rank, uint64_t seed) {
  Tensor u = Tensor::rand(shape, seed * 131 + static_cast<uint64_t>(rank));
  if (dtype == DType::Bool) return binary(BinaryOp::Gt, u, 0.5).to(DType::Bool);
  Tensor v = (u * 8.0 - 4.0).to(DType::I64).to(DType::F64) * 0.5;
  return v.to(dtype);
}

void expect_identical(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  Tensor back = gpu.to(Device::cpu());
  ASSERT_EQ(back.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(back.shape(), cpu.shape()) << what;
  EXPECT_TRUE(allclose(back.to(DType::F64), cpu.to(DType::F64), 0, 0)) << what;
}

const DType kAll[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool};

std::vector<ReduceOp> ops_for(DType t) {
  if (t == DType::Bool) return {ReduceOp::Sum, ReduceOp::Min};
  std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min};
  if (is_floating(t)) ops.push_back(ReduceOp::Avg);
  return ops;
}

std::string label(const char* op, DType t, int n, const char* extra = "") {
  return std::string(op) + " " + std::string(dtype_name(t)) + " on " + std::to_string(n) + " ranks" + extra;
}

}  // namespace

TEST(CudaComm, AllReduceMatchesTheCpuBitForBit) {
  REQUIRE_GPU();
  for (int n : {2, 4}) {
    launch(n, [&](Group world) {
      const int r = world.rank();
      for (DType t : kAll) {
        // 1037 elements: chunks of every rank unequal, the last one short.
        const Tensor x = rank_values({1037}, t, r, 1);
        for (ReduceOp op : ops_for(t)) {
          const Tensor want = all_reduce(world, x, op);
          expect_identical(all_reduce(world, x.to(kGpu), op), want, label("all_reduce", t, n));
          // In place.
          Tensor g = x.to(kGpu);
          all_reduce_(world, g, op);
          expect_identical(g, want, label("all_reduce_", t, n));
        }
      }
      // A transposed (strided) input and a tiny one (fewer elements than ranks).
      const Tensor m = rank_values({7, 5}, DType::F32, r, 2).transpose(0, 1);
      expect_identical(all_reduce(world, m.to(kGpu), ReduceOp::Sum), all_reduce(world, m, ReduceOp::Sum),
                       label("all_reduce transposed", DType::F32, n));
      const Tensor tiny = rank_values({1}, DType::F32, r, 3);
      expect_identical(all_reduce(world, tiny.to(kGpu), ReduceOp::Sum), all_reduce(world, tiny, ReduceOp::Sum),
                       label("all_reduce 1 element", DType::F32, n));
    });
  }
}

TEST(CudaComm, AsyncAllReduceIsCompleteWhenWaitedFor) {
  REQUIRE_GPU();
  launch(4, [](Group world) {
    const Tensor x = rank_values({1 << 20}, DType::F32, world.rank(), 4);
    const Tensor want = all_reduce(world, x, ReduceOp::Sum);
    const Tensor in = x.to(kGpu);
    Tensor out = Tensor::empty(in.shape(), in.dtype(), kGpu);
    Work w = all_reduce_async(world, in, out, ReduceOp::Sum);
    w.wait();
    EXPECT_TRUE(w.is_completed());
    expect_identical(out, want, "all_reduce_async");
  });
}

TEST(CudaComm, AllGatherReduceScatterAndAllToAllMatchTheCpu) {
  REQUIRE_GPU();
  for (int n : {2, 4}) {
    launch(n, [&](Group world) {
      const int r = world.rank();
      for (DType t : kAll) {
        // all_gather along dim 0 with uneven sizes (rank r has r + 1 rows), and
        // along dim 1 (rows of every rank's columns: the strided copies).
        const Tensor rows = rank_values({r + 1, 3}, t, r, 5);
        expect_identical(all_gather(world, rows.to(kGpu), 0), all_gather(world, rows, 0),
                         label("all_gather dim 0", t, n));
        const Tensor cols = rank_values({4, r + 2}, t, r, 6);
        expect_identical(all_gather(world, cols.to(kGpu), 1), all_gather(world, cols, 1),
                         label("all_gather dim 1", t, n));
        // reduce_scatter: dim 0 of 4n + 3 rows (uneven chunks), and dim 1.
        const Tensor big = rank_values({4 * n + 3, 5}, t, r, 7);
        for (ReduceOp op : ops_for(t)) {
          expect_identical(reduce_scatter(world, big.to(kGpu), op, 0), reduce_scatter(world, big, op, 0),
                           label("reduce_scatter dim 0", t, n));
          expect_identical(reduce_scatter(world, big.to(kGpu), op, 1), reduce_scatter(world, big, op, 1),
                           label("reduce_scatter dim 1", t, n));
        }
        // all_to_all with split sizes: rank r sends s + r + 1 rows to rank s.
        std::vector<int64_t> send(n), recv(n);
        for (int s = 0; s < n; ++s) send[s] = s + r + 1, recv[s] = r + s + 1;
        int64_t total = 0;
        for (int64_t v : send) total += v;
        const Tensor a = rank_values({total, 2}, t, r, 8);
        expect_identical(all_to_all(world, a.to(kGpu), recv, send), all_to_all(world, a, recv, send),
                         label("all_to_all split sizes", t, n));
        const Tensor e = rank_values({2 * n, 3}, t, r, 9);
        expect_identical(all_to_all(world, e.to(kGpu)), all_to_all(world, e), label("all_to_all equal", t, n));
      }
    });
  }
}

TEST(CudaComm, RootedCollectivesMatchTheCpu) {
  REQUIRE_GPU();
  for (int n : {2, 4}) {
    launch(n, [&](Group world) {
      const int r = world.rank();
      const int root = n - 1;
      for (DType t : {DType::F32, DType::BF16, DType::I64, DType::Bool}) {
        const Tensor x = rank_values({9, 2}, t, r, 10);
        expect_identical(broadcast(world, x.to(kGpu), root), broadcast(world, x, root), label("broadcast", t, n));
        const Tensor part = rank_values({r + 1, 2}, t, r, 11);
        const Tensor cpu_gathered = gather(world, part, root);
        const Tensor gpu_gathered = gather(world, part.to(kGpu), root);
        if (r == root) expect_identical(gpu_gathered, cpu_gathered, label("gather", t, n));
        // scatter: the root's [n * 3, 2] rows, 3 to each rank.
        const Tensor all = rank_values({3 * n, 2}, t, root, 12);
        Tensor cpu_out = Tensor::empty({3, 2}, t), gpu_out = Tensor::empty({3, 2}, t, kGpu);
        scatter(world, r == root ? all : Tensor(), cpu_out, root);
        scatter(world, r == root ? all.to(kGpu) : Tensor(), gpu_out, root);
        expect_identical(gpu_out, cpu_out, label("scatter", t, n));
      }
    });
  }
}

// Row-sharded x times a replicated weight, summed: the forward all-reduces the
// partial sum, the backward all-reduces the weight's partial gradient.
TEST(CudaComm, DistTensorMatmulSumWithAutogradMatchesOneCpuRank) {
  REQUIRE_GPU();
  const Tensor xf = Tensor::randn({8, 6}, 21), wf = Tensor::randn({6, 4}, 22);
  Tensor ref_loss, ref_grad;
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    DistTensor x = distribute(xf, mesh, {Replicate()});
    DistTensor w = distribute(wf, mesh, {Replicate()}).set_requires_grad();
    DistTensor loss = sum(matmul(x, w));
    loss.backward();
    ref_loss = loss.full_tensor();
    ref_grad = w.grad().full_tensor();
  });
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor x = distribute(xf.to(kGpu), mesh, {Shard(0)});
    DistTensor w = distribute(wf.to(kGpu), mesh, {Replicate()}).set_requires_grad();
    DistTensor loss = sum(matmul(x, w));
    loss.backward();
    const Tensor got_loss = loss.full_tensor(), got_grad = w.grad().full_tensor();
    ASSERT_EQ(got_loss.device(), kGpu);
    ASSERT_EQ(got_grad.device(), kGpu);
    EXPECT_TRUE(allclose(got_loss.to(Device::cpu()), ref_loss, 1e-5, 1e-5));
    EXPECT_TRUE(allclose(got_grad.to(Device::cpu()), ref_grad, 1e-5, 1e-5));
  });
}

TEST(CudaComm, TensorsOnDifferentKindsOfDeviceAreErrorsNamingThem) {
  REQUIRE_GPU();
  launch(2, [](Group world) {
    const Tensor x = Tensor::ones({4});
    // Within one call: input on the GPU, output on the CPU.
    Tensor cpu_out = Tensor::empty({4});
    EXPECT_THROW_MSG(all_reduce_into(world, x.to(kGpu), cpu_out, ReduceOp::Sum), std::invalid_argument,
                     "input is on cuda:0 but output is on cpu");
    // Across ranks: rank 0's tensor on the GPU, rank 1's on the CPU (both fail).
    Tensor t = world.rank() == 0 ? x.to(kGpu) : x.clone();
    EXPECT_THROW_MSG(all_reduce_(world, t, ReduceOp::Sum), std::invalid_argument,
                     "rank 0 passed tensors on cuda:0, rank 1 on cpu");
    // The group still works afterwards.
    Tensor g = x.to(kGpu);
    all_reduce_(world, g, ReduceOp::Sum);
    expect_identical(g, x * 2.0, "all_reduce after the errors");
    // Point-to-point between a GPU buffer and a CPU one: both sides fail, naming them.
    if (world.rank() == 0) {
      EXPECT_THROW_MSG(send(world, g, 1, 4), std::invalid_argument,
                       "rank 0 sent 16 bytes of f32, on cuda:0 with tag 4 to rank 1, which posted a recv of 16 "
                       "bytes of f32 (send/recv does not copy between the CPU and a GPU");
    } else {
      EXPECT_THROW_MSG(recv(world, Tensor::empty({4}), 0, 4), std::invalid_argument, "does not copy between");
    }
  });
}

// send/recv of CUDA tensors: a ring of batched send/recv in every dtype against the
// same ring on CPU tensors; a receive into a strided view; stream order on both sides
// (the sender overwrites its buffer right after wait(), the receiver computes on the
// data right after its wait(), neither synchronising the host).
TEST(CudaComm, SendRecvOfCudaTensorsMatchesTheCpuAndIsStreamOrdered) {
  REQUIRE_GPU();
  for (int n : {2, 4}) {
    launch(n, [&](Group world) {
      const int r = world.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      for (DType t : kAll) {
        const Tensor mine = rank_values({37, 3}, t, r, 11);
        Tensor want = Tensor::empty({37, 3}, t);
        batch_send_recv(world, {P2POp::send(mine, next, 1), P2POp::recv(want, prev, 1)});
        Tensor got = Tensor::empty({37, 3}, t, kGpu);
        batch_send_recv(world, {P2POp::recv(got, prev, 1), P2POp::send(mine.to(kGpu), next, 1)});
        expect_identical(got, want, label("send/recv ring", t, n));
      }
      // Into a transposed view (received contiguous, then copied into place).
      const Tensor m = rank_values({5, 7}, DType::F32, r, 12);
      Tensor holder = Tensor::zeros({7, 5}, DType::F32, kGpu);
      Tensor view = holder.transpose(0, 1);
      batch_send_recv(world, {P2POp::send(m.to(kGpu), next, 2), P2POp::recv(view, prev, 2)});
      expect_identical(holder, rank_values({5, 7}, DType::F32, prev, 12).transpose(0, 1).contiguous(),
                       label("recv into a strided view", DType::F32, n));
      // Stream order: 4M elements, so that the copy is still queued when the ranks go on.
      Tensor big = Tensor::full({1 << 22}, static_cast<double>(r + 1), DType::F32, kGpu);
      Tensor in = Tensor::empty({1 << 22}, DType::F32, kGpu);
      Work sent = send_async(world, big, next, 3);
      Work received = recv_async(world, in, prev, 3);
      sent.wait();
      big.fill_(-1.0);  // queued after the copy has read the buffer
      received.wait();
      const Tensor doubled = in * 2.0;  // queued after the copy has written it
      const Tensor back = sum(doubled.to(DType::F64)).to(Device::cpu());
      EXPECT_EQ(back.item<double>(), 2.0 * (prev + 1) * (1 << 22)) << label("stream order", DType::F32, n);
      cuda::synchronize(0);
      EXPECT_TRUE(sent.is_completed() && received.is_completed());
    });
  }
}

// The strided-block exchange (Shard(d) -> Shard(e) without packing) on CUDA tensors:
// column blocks sent, row blocks received, uneven sizes, against the CPU exchange.
TEST(CudaComm, StridedBlockExchangeMatchesTheCpu) {
  REQUIRE_GPU();
  for (int n : {1, 2, 3}) {
    launch(n, [&](Group world) {
      const int r = world.rank();
      std::vector<int64_t> d_sizes(n), e_sizes(n);
      int64_t rows = 0, cols = 0;
      for (int k = 0; k < n; ++k) {
        rows += (d_sizes[k] = k + 1);
        cols += (e_sizes[k] = 2 * k + 3);
      }
      for (DType t : {DType::F32, DType::BF16, DType::I64}) {
        // [d_r, cols, 2] cut along dim 1, received as [rows, e_r, 2] along dim 0; and
        // [2, d_r, cols] along dim 2 into [2, rows, e_r] along dim 1 (strided both sides).
        for (bool both_strided : {false, true}) {
          const Shape in_shape = both_strided ? Shape{2, d_sizes[r], cols} : Shape{d_sizes[r], cols, 2};
          const Shape out_shape = both_strided ? Shape{2, rows, e_sizes[r]} : Shape{rows, e_sizes[r], 2};
          const int64_t cut = both_strided ? 2 : 1, stack = both_strided ? 1 : 0;
          const Tensor in = rank_values(in_shape, t, r, 13);
          Tensor want = Tensor::empty(out_shape, t), got = Tensor::empty(out_shape, t, kGpu);
          comm::all_to_all_blocks(world, in, comm::blocks_along(in, cut, e_sizes), want,
                                  comm::blocks_along(want, stack, d_sizes));
          const Tensor in_gpu = in.to(kGpu);
          comm::all_to_all_blocks(world, in_gpu, comm::blocks_along(in_gpu, cut, e_sizes), got,
                                  comm::blocks_along(got, stack, d_sizes));
          expect_identical(got, want, label("all_to_all_blocks", t, n, both_strided ? " strided both sides" : ""));
        }
      }
    });
  }
}

// Where no GPU is (or the build has no CUDA), a backend call told its buffers are on
// a GPU fails on every rank before the rendezvous (no rank waits for another), with
// the device named, and the group goes on working on the CPU; a send/recv batch
// with a device buffer posts nothing.
TEST(CudaComm, DeviceBuffersWithoutAGpuFailOnEveryRankBeforeAnyDataMoves) {
  if (cuda_is_available()) GTEST_SKIP() << "a GPU is visible: the GPU tests above cover this path";
  launch(2, [](Group world) {
    float data[4] = {1, 2, 3, 4};
    {
      comm::BufferDeviceScope scope(Device::cuda(0));
      EXPECT_THROW_MSG(world.impl()->all_reduce(data, data, 4, DType::F32, ReduceOp::Sum, false), std::runtime_error,
                       "cuda:0");
    }
    // A batch with a device buffer in it is posted whole or not at all: its CPU
    // send is not left behind to match the next call's receive.
    const int peer = 1 - world.rank();
    float host[4] = {9, 9, 9, 9};
    comm::P2PBuffer cpu_send{true, host, sizeof(host), DType::F32, peer, 7};
    comm::P2PBuffer gpu_recv{false, data, sizeof(data), DType::F32, peer, 7, Device::cuda(0)};
    EXPECT_THROW_MSG(world.impl()->send_recv({cpu_send, gpu_recv}), std::runtime_error, "cuda:0");
    Tensor x = Tensor::ones({4});
    all_reduce_(world, x, ReduceOp::Sum);
    EXPECT_TRUE(allclose(x, Tensor::full({4}, 2.0)));
    Tensor got = Tensor::zeros({4});
    batch_send_recv(world,
                    {P2POp::send(x * static_cast<double>(world.rank() + 1), peer, 7), P2POp::recv(got, peer, 7)});
    EXPECT_TRUE(allclose(got, Tensor::full({4}, 2.0 * (peer + 1))));
    EXPECT_EQ(data[0], 1.0f);  // untouched
  });
}
