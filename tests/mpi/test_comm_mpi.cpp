// The shared collective cases on the mpi backend (one process per rank), plus
// what differs there: init, timeouts of non-blocking waits, and the fingerprint
// check of DTENSOR_DEBUG=collectives. Run by CTest under mpirun -np 2 and 4.
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

TEST(CommMpi, RecvTimeoutNamesOpGroupAndPeer) {
  Group world = init("mpi");
  Group sub = world.split(0);
  sub.set_timeout(200ms);
  Tensor buffer = Tensor::zeros({1});  // outlives the timed-out receive
  if (world.rank() == 0) {
    try {
      recv(sub, buffer, 1, 99);
      ADD_FAILURE() << "no timeout";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), "[recv] timed out after 0.2 s in group '" + sub.name() + "'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "no send from rank 1 for 4 bytes with tag 99")) << e.what();
    }
  }
  barrier(world);
  // The late send completes the abandoned receive, so nothing stays pending.
  if (world.rank() == 1) send(sub, Tensor::ones({1}), 0, 99);
  barrier(world);
}

TEST(CommMpi, CollectiveTimeoutNamesOpAndGroup) {
  // With fingerprints on, the late rank could not complete the abandoned call.
  if (debug_mode()) GTEST_SKIP() << "the fingerprint exchange times out instead";
  Group world = init("mpi");
  Group sub = world.split(0);
  sub.set_timeout(200ms);  // a set timeout makes blocking calls poll
  Tensor t = Tensor::ones({4});
  if (world.rank() == 0) {
    try {
      all_reduce_(sub, t);
      ADD_FAILURE() << "no timeout";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), "[all_reduce] timed out after 0.2 s in group '" + sub.name() + "'"))
          << e.what();
    }
  }
  barrier(world);
  sub.set_timeout(std::chrono::minutes(1));
  if (world.rank() != 0) all_reduce_(sub, t);  // completes rank 0's abandoned call
  barrier(world);
}

TEST(CommMpi, P2PSizeMismatchIsAnError) {
  Group world = init("mpi");
  if (world.rank() == 0) send(world, Tensor::ones({2}), 1, 4);
  if (world.rank() == 1) EXPECT_THROW(recv(world, Tensor::empty({3}), 0, 4), std::invalid_argument);
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
