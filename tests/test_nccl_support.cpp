// The NCCL backend's decisions that need no GPU (comm/nccl_support.h), and what
// init("nccl") says where it cannot run: no GPU, or a build without NCCL. The
// collectives themselves run in test_cuda_nccl (label cuda, on a GPU machine).
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/cuda/cuda_runtime.h"
#include "comm/nccl/nccl_backend.h"
#include "comm/nccl_support.h"
#include "dtensor/group.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace dtensor::comm;

using dtensor::testing::ScopedEnv;

TEST(NcclSupport, EachRankTakesTheGpuOfItsLocalRankAndNeverShares) {
  EXPECT_EQ(nccl_device_for(0, 1, 1, true), 0);
  EXPECT_EQ(nccl_device_for(3, 4, 8, true), 3);
  EXPECT_THROW_MSG(nccl_device_for(0, 1, 0, true), std::runtime_error,
                   "needs a GPU per rank, and this machine has none");
  EXPECT_THROW_MSG(nccl_device_for(1, 2, 1, true), std::runtime_error,
                   "2 ranks on this host, 1 GPU (NCCL does not allow two ranks on one GPU; the threads backend runs "
                   "several ranks on one GPU)");
  EXPECT_THROW(nccl_device_for(2, 2, 4, true), std::invalid_argument);
  // Processes under a launcher: the visible GPUs may be each one's own.
  EXPECT_EQ(nccl_device_for(3, 4, 1, false), 0);
  EXPECT_EQ(nccl_device_for(5, 8, 4, false), 1);
  EXPECT_THROW_MSG(nccl_device_for(0, 2, 0, false), std::runtime_error,
                   "needs a GPU per rank, and this machine has none");
}

TEST(NcclSupport, TheLauncherSaysWhichRankOfItsHostAProcessIs) {
  ScopedEnv a("OMPI_COMM_WORLD_LOCAL_RANK", nullptr), b("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr),
      c("MPI_LOCALRANKID", nullptr), d("MPI_LOCALNRANKS", nullptr), e("SLURM_LOCALID", nullptr),
      f("SLURM_NTASKS_PER_NODE", nullptr), g("LOCAL_RANK", nullptr), h("LOCAL_WORLD_SIZE", nullptr);
  EXPECT_FALSE(local_rank_from_env().has_value());
  {
    ScopedEnv rank("SLURM_LOCALID", "1"), size("SLURM_NTASKS_PER_NODE", "4");
    ASSERT_TRUE(local_rank_from_env().has_value());
    EXPECT_EQ(local_rank_from_env()->rank, 1);
    EXPECT_EQ(local_rank_from_env()->size, 4);
    // Open MPI's variables come first.
    ScopedEnv ompi_rank("OMPI_COMM_WORLD_LOCAL_RANK", "2"), ompi_size("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
    EXPECT_EQ(local_rank_from_env()->rank, 2);
    EXPECT_EQ(local_rank_from_env()->size, 3);
  }
  ScopedEnv bad_rank("LOCAL_RANK", "5"), bad_size("LOCAL_WORLD_SIZE", "4");  // rank outside the size
  EXPECT_FALSE(local_rank_from_env().has_value());
}

TEST(NcclSupport, RowBlocksMapOntoNcclsEqualBlocks) {
  EXPECT_EQ(block_route({3, 3, 3}, 1), BlockRoute::Direct);
  EXPECT_EQ(block_route({3, 3, 3}, 5), BlockRoute::Packed);
  EXPECT_EQ(block_route({4, 3, 3}, 1), BlockRoute::PerRank);
  EXPECT_EQ(block_route({0, 3}, 2), BlockRoute::PerRank);
  EXPECT_EQ(block_route({7}, 1), BlockRoute::Direct);
}

TEST(NcclSupport, BoolReducesAsBytes) {
  EXPECT_EQ(nccl_reduce_op(DType::Bool, ReduceOp::Sum), ReduceOp::Max);  // or
  EXPECT_EQ(nccl_reduce_op(DType::Bool, ReduceOp::Max), ReduceOp::Max);
  EXPECT_EQ(nccl_reduce_op(DType::Bool, ReduceOp::Min), ReduceOp::Min);  // and
  EXPECT_EQ(nccl_reduce_op(DType::Bool, ReduceOp::Product), ReduceOp::Min);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
    EXPECT_EQ(nccl_reduce_op(DType::BF16, op), op);
  }
}

TEST(NcclSupport, InitSaysWhyItCannotRunHere) {
  if (backend::cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible: test_cuda_nccl runs the backend";
  EXPECT_FALSE(is_available("nccl"));
  for (const std::string& name : available_backends()) EXPECT_NE(name, "nccl");
  const std::string want =
      nccl_compiled() ? "needs a GPU per rank, and this machine has none" : "this build of dtensor has no NCCL backend";
  EXPECT_THROW_MSG(init("nccl"), std::runtime_error, want);
  launch(2, [&](Group) { EXPECT_THROW_MSG(init("nccl"), std::runtime_error, want); });
}
