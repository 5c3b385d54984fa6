// libtorch tensors as the shards of a DistTensor, and back, through DLPack: no copies
// at either boundary. Built only where a PyTorch installation is found (see
// examples/CMakeLists.txt: DTENSOR_TORCH_PYTHON names the Python that has torch).
//
//   ./build/examples/libtorch_shards
//
// Each of 2 ranks makes its rows of a [4, 4] matrix with libtorch; dtensor wraps them as
// Shard(0) pieces, computes with them (a sharded matmul, an all-gather), and hands the
// results back to libtorch, which checks them against its own computation.
#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <dtensor/dtensor.h>
#include <cstdio>
#include <stdexcept>

int main() {
  dtensor::launch(2, [](dtensor::Group world) {
    dtensor::DeviceMesh mesh(world, {2}, {"dp"});
    const int64_t rank = world.rank();
    // libtorch makes this rank's rows: rank r holds rows 2r and 2r+1 of arange(16).
    at::Tensor rows = torch::arange(16, torch::kFloat32).reshape({4, 4}).narrow(0, 2 * rank, 2).contiguous();
    // ... which become a shard without a copy: the DistTensor's local tensor is libtorch's memory.
    dtensor::Tensor local = dtensor::from_dlpack(at::toDLPack(rows));
    if (local.data_ptr() != rows.data_ptr()) throw std::runtime_error("from_dlpack copied");
    const dtensor::DistTensor x = dtensor::DistTensor::from_local(local, mesh, {dtensor::Shard(0)});
    // dtensor computes on it: x @ x^T, rows sharded, then the whole matrix on every rank.
    const dtensor::DistTensor y = dtensor::matmul(x, x.t());
    const dtensor::Tensor full = y.full_tensor();
    // Back to libtorch, again without a copy, and checked against libtorch's own product.
    const at::Tensor back = at::fromDLPack(dtensor::to_dlpack(full));
    const at::Tensor whole = torch::arange(16, torch::kFloat32).reshape({4, 4});
    if (!torch::allclose(back, whole.matmul(whole.t()))) throw std::runtime_error("results differ");
    if (rank == 0) {
      std::printf("rank 0: libtorch rows -> %s -> x @ x^T -> libtorch [%lld, %lld], equal to torch's own\n",
                  x.to_string().c_str(), static_cast<long long>(back.size(0)), static_cast<long long>(back.size(1)));
    }
  });
  std::printf("libtorch_shards: OK\n");
  return 0;
}
