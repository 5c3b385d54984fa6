// The shared collective cases on the mpi backend (one process per rank), plus
// what differs there: init, point-to-point timeouts (cancelled), dropped Works, and
// the fingerprint check of DTENSOR_DEBUG=collectives. Run by CTest under mpirun -np
// 2 and 4. Faults that end the job (a collective timing out, a rank dying) are in
// mpi_faults.cpp, one mpirun each.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "test_comm_cases.h"

using namespace dtensor;
using namespace std::chrono_literals;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool debug_mode() {
  const char* env = std::getenv("DTENSOR_DEBUG");
  return env && contains(env, "collectives");
}

class MpiCase : public ::testing::TestWithParam<comm_cases::NamedCase> {};

TEST_P(MpiCase, MatchesDirectComputation) { GetParam().run(init("mpi")); }

INSTANTIATE_TEST_SUITE_P(Comm, MpiCase, ::testing::ValuesIn(comm_cases::kCases),
                         [](const ::testing::TestParamInfo<comm_cases::NamedCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(CommMpi, InitGivesTheMpiWorld) {
  Group world = init("mpi");
  EXPECT_EQ(world.backend(), "mpi");
  EXPECT_EQ(world.size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_TRUE(init("any") == world);  // started by mpirun
  EXPECT_TRUE(is_available("mpi"));
}

TEST(CommMpi, RecvTimeoutCancelsTheReceiveAndRetiresTheGroup) {
  Group world = init("mpi");
  Group sub = world.split(0);
  sub.set_timeout(200ms);
  if (world.rank() == 0) {
    Tensor buffer = Tensor::zeros({1});
    try {
      recv(sub, buffer, 1, 99);
      ADD_FAILURE() << "no timeout";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), "[recv] timed out after 0.2 s in group '" + sub.name() + "'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "no send from rank 1 for 4 bytes with tag 99")) << e.what();
    }
    // The receive was cancelled (a late send cannot land in `buffer`), and the group
    // refuses further calls, saying why.
    try {
      barrier(sub);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), "can no longer be used: [recv] timed out after 0.2 s")) << e.what();
    }
  }
  barrier(world);
}

TEST(CommMpi, DroppedWorksStillCompleteWithTheirBuffersAlive) {
  Group world = init("mpi");
  const int n = world.size();
  if (world.rank() == 0) {
    // Every handle to the tensors goes away before the other ranks even arrive.
    all_reduce_async(world, Tensor::full({65536}, 1.0), Tensor::empty({65536}));
    recv_async(world, Tensor::empty({16}), 1, 77);  // never sent: cancelled at exit
  } else {
    std::this_thread::sleep_for(50ms);
  }
  if (world.rank() != 0) {
    // The async form: MPI never matches a non-blocking collective with a blocking one.
    Tensor t = Tensor::full({65536}, 1.0);
    all_reduce_async(world, t, t).wait();
    EXPECT_EQ(t.to_vector<float>()[65535], static_cast<float>(n));
  }
  barrier(world);
}

TEST(CommMpi, P2PSizeMismatchIsAnError) {
  Group world = init("mpi");
  if (world.rank() == 0) send(world, Tensor::ones({2}), 1, 4);
  if (world.rank() == 1) EXPECT_THROW(recv(world, Tensor::empty({3}), 0, 4), std::invalid_argument);
  barrier(world);
}

// A receive found complete by polling (Work::is_completed, as the pipeline runtime
// polls an activation's header) then waited: its data arrived whole, and a short
// message is still reported, by the wait.
TEST(CommMpi, PolledReceivesCheckTheirSizes) {
  Group world = init("mpi");
  if (world.rank() == 0) {
    send(world, Tensor::full({5}, 3.0), 1, 8);
    send(world, Tensor::ones({2}), 1, 9);
  }
  if (world.rank() == 1) {
    for (const int64_t size : {5, 3}) {
      const Tensor got = Tensor::empty({size});
      Work work = recv_async(world, got, 0, size == 5 ? 8 : 9);
      while (!work.is_completed()) std::this_thread::sleep_for(1ms);
      if (size == 5) {
        work.wait();
        EXPECT_EQ(got.to_vector<float>(), std::vector<float>(5, 3.0f));
      } else {
        EXPECT_THROW(work.wait(), std::invalid_argument);
      }
    }
  }
  barrier(world);
}

TEST(CommMpiDebug, MismatchedCallsNameBothCalls) {
  if (!debug_mode()) GTEST_SKIP() << "needs DTENSOR_DEBUG=collectives";
  Group world = init("mpi");
  Tensor t = Tensor::ones({world.rank() == 1 ? 5 : 8});
  try {
    all_reduce(world, t);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string other = world.rank() == 1 ? "all_reduce(f32, 8 elements" : "all_reduce(f32, 5 elements";
    EXPECT_TRUE(contains(e.what(), "ranks made different calls in group 'world'")) << e.what();
    EXPECT_TRUE(contains(e.what(), other)) << e.what();
  }
  // A dtype mismatch, on every rank.
  try {
    all_reduce(world, Tensor::ones({4}, world.rank() == 1 ? DType::F64 : DType::F32));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), world.rank() == 1 ? "all_reduce(f32, 4 elements" : "all_reduce(f64, 4 elements"))
        << e.what();
  }
  // Split sizes on one rank and none on the other: MPI_Alltoallv against MPI_Alltoall.
  const int n = world.size();
  Tensor in = Tensor::ones({2 * n}), out = Tensor::empty({2 * n});
  try {
    if (world.rank() == 0) {
      all_to_all_into(world, in, out);
    } else {
      all_to_all_into(world, in, out, std::vector<int64_t>(n, 2), std::vector<int64_t>(n, 2));
    }
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), world.rank() == 0 ? "all_to_all(f32, split sizes given)"
                                                     : "all_to_all(f32, no split sizes, 2 elements to each rank)"))
        << e.what();
  }
  // The strided exchange (MPI_Alltoallw) against the v-form.
  try {
    const std::vector<int64_t> twos(n, 2);
    if (world.rank() == 0) {
      comm::all_to_all_blocks(world, in, comm::blocks_along(in, 0, twos), out, comm::blocks_along(out, 0, twos));
    } else {
      all_to_all_into(world, in, out, twos, twos);
    }
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), world.rank() == 0 ? "all_to_all(f32, split sizes given)"
                                                     : "all_to_all(f32, strided blocks)"))
        << e.what();
  }
  barrier(world);
}

// Prints failures of every rank with its rank (the default printer runs on rank 0 only).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "",
                   result.line_number(), result.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  Group world = init("mpi");
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world.rank() != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(world.rank()));
  const int failed = RUN_ALL_TESTS();
  // Every process exits with the same status: failed if any rank failed.
  Tensor any_failed = Tensor::full({1}, failed != 0 ? 1.0 : 0.0);
  all_reduce_(world, any_failed, ReduceOp::Max);
  return any_failed.item<float>() > 0 ? 1 : 0;
}
