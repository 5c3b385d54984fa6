// The threads backend: every shared case on world sizes 1, 2, 3, 4, 5 and 8, then
// what only a single process can test cheaply: faults, timeouts, mismatched calls,
// init and launch.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <numeric>
#include <thread>

#include "comm/block_all_to_all.h"
#include "test_comm_cases.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace std::chrono_literals;

namespace {

struct CaseAndSize {
  comm_cases::NamedCase c;
  int world;
};

std::vector<CaseAndSize> all_cases() {
  std::vector<CaseAndSize> out;
  for (const auto& c : comm_cases::kCases) {
    for (int world : {1, 2, 3, 4, 5, 8}) out.push_back({c, world});
  }
  return out;
}

void PrintTo(const CaseAndSize& p, std::ostream* os) { *os << p.c.name << " on " << p.world << " ranks"; }

class ThreadsCase : public ::testing::TestWithParam<CaseAndSize> {};

TEST_P(ThreadsCase, MatchesDirectComputation) {
  const auto& p = GetParam();
  launch(p.world, [&](Group world) {
    ASSERT_EQ(world.size(), p.world);
    ASSERT_EQ(world.backend(), "threads");
    p.c.run(world);
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, ThreadsCase, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<CaseAndSize>& info) {
                           return std::string(info.param.c.name) + "_world" + std::to_string(info.param.world);
                         });

// Runs launch and returns the message of the exception it rethrows ("" if none).
template <class Exception = std::exception>
std::string launch_error(int n, const std::function<void(Group)>& fn) {
  try {
    launch(n, fn);
  } catch (const Exception& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Group::device(): threads and mpi communicate from the CPU (nccl: the rank's GPU,
// test_cuda_nccl).
TEST(CommThreads, AGroupCommunicatesFromTheCpu) {
  launch(2, [](Group world) {
    EXPECT_EQ(world.device(), Device::cpu());
    EXPECT_EQ(world.split(0).device(), Device::cpu());
    EXPECT_EQ(self_group().device(), Device::cpu());
  });
  EXPECT_THROW(Group().device(), std::invalid_argument);
}

TEST(CommThreads, ThrowingRankReleasesPeersQuickly) {
  std::atomic<int> released{0};
  std::string peer_message;
  std::mutex mutex;
  const std::string error = launch_error(4, [&](Group world) {
    if (world.rank() == 2) throw std::invalid_argument("rank two broke");
    try {
      all_reduce(world, Tensor::ones({4}));
    } catch (const std::runtime_error& e) {
      released++;
      std::lock_guard<std::mutex> lock(mutex);
      peer_message = e.what();
      throw;
    }
  });
  EXPECT_EQ(error, "rank two broke");  // the first error, rethrown as it was
  EXPECT_EQ(released.load(), 3);
  EXPECT_TRUE(contains(peer_message, "[all_reduce]")) << peer_message;
  // Released by the abort, not by the 10-minute timeout (no wall-clock bound: the
  // machine may be loaded; bench_faults measures the release times).
  EXPECT_TRUE(contains(peer_message, "rank 2 failed: rank two broke")) << peer_message;
}

TEST(CommThreads, ThrowingRankReleasesAsyncWorkAndP2P) {
  std::atomic<int> released{0};
  const std::string error = launch_error(3, [&](Group world) {
    if (world.rank() == 0) {
      std::this_thread::sleep_for(50ms);
      throw std::runtime_error("late failure");
    }
    Tensor t = Tensor::ones({4});
    Work w = all_reduce_async(world, t, t);
    try {
      recv(world, Tensor::empty({1}), 0);
    } catch (const std::runtime_error&) {
      released++;
    }
    EXPECT_THROW(w.wait(), std::runtime_error);
  });
  EXPECT_EQ(error, "late failure");
  EXPECT_EQ(released.load(), 2);
}

TEST(CommThreads, RankThatReturnedFailsItsPeersAtOnce) {
  // Rank 1 returns after its (async) call without the next one rank 0 makes, rank 2
  // without the send rank 0 waits for: rank 0 learns it at once, not at the timeout.
  std::string collective, receive;
  EXPECT_THROW(launch(3,
                      [&](Group world) {
                        Group pair = world.split(world.rank() < 2 ? 0 : 1);
                        if (world.rank() == 1) {
                          Tensor t = Tensor::ones({4});
                          all_reduce_async(pair, t, t).wait();
                          return;
                        }
                        if (world.rank() == 2) return;
                        all_reduce(pair, Tensor::ones({4}));  // matches rank 1's async call
                        try {
                          all_reduce(pair, Tensor::ones({4}));
                        } catch (const std::runtime_error& e) {
                          collective = e.what();
                        }
                        try {
                          recv(world, Tensor::empty({1}), 2);
                        } catch (const std::runtime_error& e) {
                          receive = e.what();
                          throw;
                        }
                      }),
               std::runtime_error);
  EXPECT_TRUE(contains(collective, "[all_reduce] rank 1 (launch rank 1) of group 'world/c0'")) << collective;
  EXPECT_TRUE(contains(collective, "returned from its launch function without making this call")) << collective;
  EXPECT_TRUE(contains(receive, "[recv] rank 2 of group 'world'")) << receive;
}

TEST(CommThreads, MissingRankTimesOutNamingOpGroupAndRanks) {
  const std::string error = launch_error<std::runtime_error>(3, [&](Group world) {
    world.set_timeout(200ms);
    if (world.rank() == 1) {  // stuck elsewhere (a rank that returns fails peers at once)
      std::this_thread::sleep_for(600ms);
      return;
    }
    all_reduce(world, Tensor::ones({2}));
  });
  EXPECT_TRUE(contains(error, "[all_reduce] timed out after 0.2 s in group 'world'")) << error;
  EXPECT_TRUE(contains(error, "ranks [1] did not arrive")) << error;
}

TEST(CommThreads, TimeoutInSubGroupAndRecvNamesThem) {
  const std::string error = launch_error<std::runtime_error>(4, [&](Group world) {
    Group sub = world.split(world.rank() / 2);
    sub.set_timeout(150ms);
    if (world.rank() == 3) {  // stuck elsewhere
      std::this_thread::sleep_for(600ms);
      return;
    }
    if (world.rank() == 2) recv(sub, Tensor::empty({2}), 1, 9);
    if (world.rank() < 2) barrier(sub);
  });
  EXPECT_TRUE(contains(error, "[recv] timed out after 0.15 s in group 'world/c1'")) << error;
  EXPECT_TRUE(contains(error, "no send from rank 1 (launch rank 3) for 8 bytes with tag 9")) << error;
}

TEST(CommThreads, TimeoutsOutsideOneMillisecondToOneYearAreRejected) {
  for (const char* bad : {"0", "-1", "0.0001", "inf", "-inf", "nan", "1e300", "31536001", "5s", "", "ten"}) {
    EXPECT_THROW_MSG(comm::parse_timeout_seconds(bad), std::invalid_argument,
                     std::string("[DTENSOR_TIMEOUT_S] expected a number of seconds from 0.001 to 31536000 "
                                 "(1 ms to one year), got '") +
                         bad + "'");
  }
  EXPECT_EQ(comm::parse_timeout_seconds("0.001"), 1ms);
  EXPECT_EQ(comm::parse_timeout_seconds("2.5"), 2500ms);
  EXPECT_EQ(comm::parse_timeout_seconds("31536000"), comm::kMaxTimeout);
  launch(2, [&](Group world) {
    EXPECT_THROW_MSG(world.set_timeout(0ms), std::invalid_argument, "expected a timeout from 1 ms to one year");
    EXPECT_THROW_MSG(world.set_timeout(std::chrono::milliseconds::max()), std::invalid_argument,
                     "got 9223372036854775807 ms");
    // The longest timeout computes its deadlines without overflow (UBSan checks it).
    world.set_timeout(comm::kMaxTimeout);
    EXPECT_EQ(all_reduce(world, Tensor::ones({2})).to_vector<float>()[1], 2.0f);
    if (world.rank() == 0) send(world, Tensor::ones({1}), 1);
    if (world.rank() == 1) recv(world, Tensor::empty({1}), 0);
  });
}

TEST(CommThreads, DifferentCollectivesNameBothCalls) {
  std::atomic<int> mismatches{0};
  launch(2, [&](Group world) {
    Tensor t = Tensor::ones({8});
    try {
      if (world.rank() == 0)
        all_reduce(world, t);
      else
        all_gather(world, t, 0, {8, 8});
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, "rank 0 called all_reduce(f32, 8 elements, sum)")) << msg;
      EXPECT_TRUE(contains(msg, "rank 1 called all_gather(f32, counts [8, 8])")) << msg;
      mismatches++;
    }
    // The group stays usable after a mismatch both ranks saw.
    EXPECT_EQ(all_reduce(world, t).to_vector<float>()[0], 2.0f);
  });
  EXPECT_EQ(mismatches.load(), 2);
}

TEST(CommThreads, DifferentSizesAndSplitsAreMismatches) {
  launch(3, [&](Group world) {
    Tensor t = Tensor::ones({world.rank() == 1 ? 5 : 4});
    try {
      all_reduce(world, t);
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "rank 1 called all_reduce(f32, 5 elements, sum)")) << e.what();
    }
    // all_to_all: rank 2 expects 3 rows from rank 0, which sends 2.
    Tensor in = Tensor::ones({6, 1});
    std::vector<int64_t> recv = world.rank() == 2 ? std::vector<int64_t>{3, 2, 1} : std::vector<int64_t>{2, 2, 2};
    Tensor out = Tensor::empty({6, 1});
    EXPECT_THROW(all_to_all_async(world, in, out, recv, {2, 2, 2}).wait(), std::invalid_argument);
    // Split sizes on some ranks and none on others (equal either way) is a mismatch:
    // on MPI the two are different routines.
    try {
      if (world.rank() == 0)
        all_to_all_into(world, in, out);
      else
        all_to_all_into(world, in, out, {2, 2, 2}, {2, 2, 2});
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "rank 0 called all_to_all(f32, counts [2, 2, 2] -> [2, 2, 2], no split sizes)"))
          << e.what();
      EXPECT_TRUE(contains(e.what(), "rank 1 called all_to_all(f32, counts [2, 2, 2] -> [2, 2, 2], split sizes given)"))
          << e.what();
    }
    // The strided exchange against the plain one: different algorithms, a mismatch.
    try {
      if (world.rank() == 0) {
        comm::all_to_all_blocks(world, in, comm::blocks_along(in, 0, {2, 2, 2}), out,
                                comm::blocks_along(out, 0, {2, 2, 2}));
      } else {
        all_to_all_into(world, in, out, {2, 2, 2}, {2, 2, 2});
      }
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "strided blocks")) << e.what();
    }
  });
}

TEST(CommThreads, P2PSizeMismatchIsReportedOnBothSides) {
  std::atomic<int> errors{0};
  launch(2, [&](Group world) {
    try {
      if (world.rank() == 0)
        send(world, Tensor::ones({4}), 1, 3);
      else
        recv(world, Tensor::empty({3}), 0, 3);
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "rank 0 sent 16 bytes of f32 with tag 3 to rank 1")) << e.what();
      errors++;
    }
  });
  EXPECT_EQ(errors.load(), 2);
}

// The copy plans of the strided exchange (run here by the host, as 2D copies on a
// GPU): each element of the piece lands where the element-by-element walk puts it,
// exactly once; layouts that cut the stream alike (or a dense side) take one copy,
// others one per run of a lcm(widths) period.
TEST(CommThreads, PieceCopyPlansMoveEachElementOnceInFewCopies) {
  auto layout = [](int64_t rows, int64_t stride, int64_t offset, int64_t width) {
    comm::BlockLayout l;
    l.rows = rows;
    l.stride = stride;
    l.offsets = {offset};
    l.widths = {width};
    return l;
  };
  // Where element i of the piece lies.
  auto at = [](const comm::BlockLayout& l, int64_t i) {
    return l.offsets[0] + i / l.widths[0] * l.stride + i % l.widths[0];
  };
  auto check = [&](const comm::BlockLayout& to, const comm::BlockLayout& from, size_t max_copies) {
    const std::string what = "to " + std::to_string(to.rows) + "x" + std::to_string(to.widths[0]) + " from " +
                             std::to_string(from.rows) + "x" + std::to_string(from.widths[0]);
    const std::vector<comm::PieceCopy> plan = comm::plan_piece_copy(to, 0, from, 0);
    EXPECT_LE(plan.size(), max_copies) << what;
    std::map<int64_t, int64_t> source_of;  // destination element -> source element
    for (const comm::PieceCopy& c : plan) {
      EXPECT_GE(c.dst_pitch, c.width) << what;
      EXPECT_GE(c.src_pitch, c.width) << what;
      for (int64_t h = 0; h < c.height; ++h) {
        for (int64_t w = 0; w < c.width; ++w) {
          EXPECT_TRUE(source_of.emplace(c.dst_offset + h * c.dst_pitch + w, c.src_offset + h * c.src_pitch + w).second)
              << what << ": element written twice";
        }
      }
    }
    ASSERT_EQ(static_cast<int64_t>(source_of.size()), from.count(0)) << what;
    for (int64_t i = 0; i < from.count(0); ++i)
      EXPECT_EQ(source_of[at(to, i)], at(from, i)) << what << " element " << i;
  };
  check(layout(6, 10, 2, 3), layout(6, 8, 1, 3), 1);   // the same width: one 2D copy
  check(layout(1, 0, 5, 18), layout(6, 8, 1, 3), 1);   // a dense destination
  check(layout(3, 6, 0, 6), layout(6, 8, 1, 3), 1);    // dense rows (stride == width)
  check(layout(1, 0, 0, 18), layout(1, 0, 7, 18), 1);  // both dense: one flat copy
  check(layout(4, 9, 1, 6), layout(6, 7, 2, 4), 4);    // widths 6 and 4: 4 runs per 12, twice
  check(layout(3, 11, 0, 5), layout(5, 4, 0, 3), 7);   // widths 5 and 3: one period of 7 runs
  check(layout(0, 4, 0, 3), layout(0, 5, 0, 3), 0);    // empty
  for (int64_t fw = 1; fw <= 5; ++fw) {
    for (int64_t tw = 1; tw <= 5; ++tw) {
      for (int64_t periods = 1; periods <= 3; ++periods) {
        const int64_t count = std::lcm(fw, tw) * periods;
        check(layout(count / tw, tw + 2, 3, tw), layout(count / fw, fw + 1, 1, fw),
              static_cast<size_t>(count / fw + count / tw));
      }
    }
  }
}

TEST(CommThreads, AsyncOverlapsWithComputeAndKeepsOrder) {
  launch(4, [&](Group world) {
    std::vector<Tensor> ts;
    std::vector<Work> works;
    for (int k = 0; k < 6; ++k) {
      ts.push_back(Tensor::full({1000}, world.rank() + k));
      works.push_back(all_reduce_async(world, ts.back(), ts.back()));
    }
    Tensor mine = all_reduce(world, Tensor::ones({3}));  // after the queued ones
    EXPECT_EQ(mine.to_vector<float>()[2], 4.0f);
    for (int k = 0; k < 6; ++k) {
      works[k].wait();
      EXPECT_TRUE(works[k].is_completed());
      EXPECT_EQ(ts[k].to_vector<float>()[999], 6.0f + 4 * k);
    }
  });
}

TEST(CommThreads, SizeOneGroupReturnsItsInput) {
  launch(1, [&](Group world) {
    Tensor t = Tensor::ones({3});
    EXPECT_TRUE(all_reduce(world, t).shares_storage(t));
    EXPECT_TRUE(all_gather(world, t).shares_storage(t));
    EXPECT_TRUE(reduce_scatter(world, t).shares_storage(t));
    EXPECT_TRUE(all_reduce_async(world, t, t).is_completed());
  });
}

TEST(CommThreads, InitFindsTheLaunchedWorldAndRejectsUnknownNames) {
  Group single = init("threads");
  EXPECT_EQ(single.size(), 1);
  EXPECT_EQ(single.backend(), "threads");
  launch(3, [&](Group world) {
    EXPECT_TRUE(init("threads") == world);
    EXPECT_TRUE(init("any") == world);
  });
  try {
    init("gloo");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "[init] unknown backend 'gloo'; valid backends: threads, mpi, nccl, any");
  }
  EXPECT_TRUE(is_available("threads"));
  EXPECT_FALSE(is_available("gloo"));
  EXPECT_EQ(is_available("mpi"), DTENSOR_WITH_MPI == 1);
}

#if !DTENSOR_WITH_MPI
TEST(CommThreads, MpiInABuildWithoutMpiSaysHowToGetIt) {
  try {
    init("mpi");
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "has no MPI backend")) << e.what();
    EXPECT_TRUE(contains(e.what(), "-DDTENSOR_WITH_MPI=ON")) << e.what();
  }
  EXPECT_EQ(init("any").backend(), "threads");
}
#endif

TEST(CommThreads, LaunchGivesEachRankItsOwnMemoryCounters) {
  launch(3, [&](Group world) {
    const int64_t before = memory_stats().live_bytes;
    Tensor t = Tensor::empty({256 * (world.rank() + 1)});  // 1, 2, 3 KiB
    EXPECT_EQ(memory_stats().live_bytes - before, 1024 * (world.rank() + 1));
    barrier(world);
  });
  EXPECT_THROW(launch(0, [](Group) {}), std::invalid_argument);
}

TEST(CommThreads, UndefinedGroupAndBadArgumentsAreRejected) {
  EXPECT_THROW(all_reduce(Group(), Tensor::ones({1})), std::invalid_argument);
  launch(2, [&](Group world) {
    EXPECT_THROW(broadcast_(world, Tensor::ones({1}), 2), std::invalid_argument);
    EXPECT_THROW(send(world, Tensor::ones({1}), 5), std::invalid_argument);
    EXPECT_THROW(all_gather_async(world, Tensor::ones({2}), Tensor::empty({3})), std::invalid_argument);
    EXPECT_THROW(reduce_scatter(world, Tensor::ones({4}), ReduceOp::Sum, 0, {1, 1}), std::invalid_argument);
    EXPECT_THROW_MSG(all_gather(world, Tensor::ones({2, 3}), 0, {5, 5}), std::invalid_argument,
                     "sizes say rank " + std::to_string(world.rank()));
    EXPECT_THROW_MSG(all_gather_into(world, Tensor::ones({2, 3}), Tensor::empty({4, 2})), std::invalid_argument,
                     "output shape must be [4, 3], got [4, 2]");
    // all_to_all: an odd dim 0 without split sizes, a wrong number of sizes, a wrong sum.
    EXPECT_THROW_MSG(all_to_all(world, Tensor::ones({3})), std::invalid_argument,
                     "without input split sizes, dim 0 (3) must divide by the group size 2");
    EXPECT_THROW_MSG(all_to_all_into(world, Tensor::ones({4}), Tensor::empty({4}), {2, 2}, {4}), std::invalid_argument,
                     "expected 2 input split sizes, got [4]");
    EXPECT_THROW_MSG(all_to_all_into(world, Tensor::ones({4}), Tensor::empty({4}), {1, 2}, {2, 2}),
                     std::invalid_argument, "split sizes must sum to dim 0: output [4] with [1, 2]");
    EXPECT_THROW_MSG(all_to_all_into(world, Tensor::ones({4, 2}), Tensor::empty({4, 3})), std::invalid_argument,
                     "input and output must agree after dim 0");
    // The strided exchange: a piece past the end of its tensor.
    Tensor in = Tensor::ones({4}), out = Tensor::empty({4});
    comm::BlockLayout wide = comm::blocks_along(in, 0, {2, 2});
    wide.widths[1] = 3;
    EXPECT_THROW_MSG(comm::all_to_all_blocks(world, in, wide, out, comm::blocks_along(out, 0, {2, 2})),
                     std::invalid_argument, "send piece 1 ends at element 5, past the 4 elements");
  });
  launch(1, [&](Group alone) {
    Tensor in = Tensor::ones({4}), out = Tensor::empty({3});
    EXPECT_THROW_MSG(
        comm::all_to_all_blocks(alone, in, comm::blocks_along(in, 0, {4}), out, comm::blocks_along(out, 0, {3})),
        std::invalid_argument, "a group of one sends 4 elements to itself but expects 3");
  });
}

}  // namespace
