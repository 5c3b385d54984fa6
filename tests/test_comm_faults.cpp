// Fault paths of the threads backend: what every rank sees when one fails, and
// that no fault lets a peer touch memory a rank already gave back (each memory case
// read or wrote freed memory before the rendezvous could be left only by poisoning
// the group; an ASan build of this file finds those). Then deadlocks across groups,
// the user-level call in mismatch messages, mismatches the size exchange catches,
// and DTENSOR_FAULT on 2, 4 and 8 ranks.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "comm/comm_backend.h"
#include "comm/fault_injection.h"
#include "dtensor/dtensor.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace std::chrono_literals;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Each rank's error message ("" if it ended without one), and launch's. Bounds are
// checked through the messages (a release by the fault, not by a long timeout),
// never by the wall clock of a machine other builds may load.
struct Outcome {
  std::vector<std::string> rank_errors;
  std::string launch_error;
};

Outcome run_ranks(int n, const std::function<void(Group)>& fn) {
  Outcome out;
  out.rank_errors.resize(n);
  std::mutex mutex;
  try {
    launch(n, [&](Group world) {
      try {
        fn(world);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        out.rank_errors[world.rank()] = e.what();
        throw;
      }
    });
  } catch (const std::exception& e) {
    out.launch_error = e.what();
  }
  return out;
}

// ---- memory safety on fault paths -----------------------------------------------------

TEST(CommFaults, ThrowingRankNeverReleasesPeersFromACallInProgress) {
  // Ranks 0 and 1 all-reduce 256 KiB in their own group while rank 2 throws: an
  // abort used to release a rank from the barrier that ends a call, and its caller
  // freed the output a peer was still writing.
  for (int trial = 0; trial < 20; ++trial) {
    std::atomic<int> wrong{0};
    const Outcome out = run_ranks(3, [&](Group world) {
      Group pair = world.split(world.rank() < 2 ? 0 : 1);
      if (world.rank() == 2) {
        std::this_thread::sleep_for(std::chrono::microseconds(200 * trial));
        throw std::runtime_error("rank two broke");
      }
      for (int k = 0; k < 200; ++k) {
        Tensor out = all_reduce(pair, Tensor::full({65536}, world.rank() + k));
        if (out.to_vector<float>()[65535] != 1.0f + 2 * k) wrong++;
      }
    });
    EXPECT_EQ(out.launch_error, "rank two broke");
    EXPECT_EQ(wrong.load(), 0);  // a call that returned has the right result
    for (int r = 0; r < 2; ++r) {
      if (!out.rank_errors[r].empty()) {
        EXPECT_TRUE(contains(out.rank_errors[r], "rank 2 failed: rank two broke")) << out.rank_errors[r];
      }
    }
  }
}

TEST(CommFaults, LatePeerNeverRunsAReturnedRanksCall) {
  // Rank 0's all_reduce times out and returns (its buffers and descriptor freed);
  // rank 1 arrives later and must fail instead of completing into them.
  const Outcome out = run_ranks(2, [&](Group world) {
    world.set_timeout(50ms);
    if (world.rank() == 0) {
      {
        Tensor t = Tensor::ones({4096});
        EXPECT_THROW_MSG(all_reduce_(world, t), std::runtime_error, "[all_reduce] timed out after 0.05 s");
      }
      std::this_thread::sleep_for(300ms);  // rank 1 arrives while rank 0 is elsewhere
      return;
    }
    std::this_thread::sleep_for(150ms);
    Tensor t = Tensor::ones({4096});
    all_reduce_(world, t);
  });
  EXPECT_TRUE(contains(out.rank_errors[1], "[all_reduce] released from group 'world' because rank 0 left this call: "
                                           "[all_reduce] timed out after 0.05 s"))
      << out.rank_errors[1];
  // The group is unusable afterwards, and says why.
  const Outcome later = run_ranks(2, [&](Group world) {
    world.set_timeout(50ms);
    Tensor t = Tensor::ones({4});
    if (world.rank() == 0) EXPECT_THROW(all_reduce_(world, t), std::runtime_error);
    if (world.rank() == 1) std::this_thread::sleep_for(150ms);
    if (world.rank() == 1) EXPECT_THROW(all_reduce_(world, t), std::runtime_error);
    EXPECT_THROW_MSG(barrier(world), std::runtime_error, "can no longer be used: rank 0 left an earlier call");
  });
  EXPECT_EQ(later.launch_error, "");
}

TEST(CommFaults, LatePeerNeverWritesIntoAnAbortedRanksBuffers) {
  // Rank 0 waits for rank 1 in their group; rank 2 throws, releasing rank 0, which
  // frees its tensor; rank 1 arrives afterwards.
  const Outcome out = run_ranks(3, [&](Group world) {
    Group pair = world.split(world.rank() < 2 ? 0 : 1);
    if (world.rank() == 2) throw std::runtime_error("rank two broke");
    if (world.rank() == 1) std::this_thread::sleep_for(100ms);
    Tensor t = Tensor::ones({4096});
    all_reduce_(pair, t);
  });
  EXPECT_EQ(out.launch_error, "rank two broke");
  EXPECT_TRUE(contains(out.rank_errors[0], "rank 2 failed: rank two broke")) << out.rank_errors[0];
  EXPECT_TRUE(contains(out.rank_errors[1], "rank 2 failed: rank two broke")) << out.rank_errors[1];
}

TEST(CommFaults, LateSendNeverWritesIntoATimedOutRecv) {
  const Outcome out = run_ranks(2, [&](Group world) {
    world.set_timeout(50ms);
    if (world.rank() == 0) {
      {
        Tensor buffer = Tensor::zeros({4096});
        EXPECT_THROW_MSG(recv(world, buffer, 1, 7), std::runtime_error, "no send from rank 1 for 16384 bytes with tag 7");
      }
      std::this_thread::sleep_for(300ms);
      return;
    }
    std::this_thread::sleep_for(150ms);
    send(world, Tensor::ones({4096}), 0, 7);  // nobody receives it any more
  });
  EXPECT_TRUE(contains(out.rank_errors[1], "[send] timed out after 0.05 s")) << out.rank_errors[1];
}

TEST(CommFaults, DroppedWorkStillRunsWithItsBuffersAlive) {
  // Rank 0 drops the Work of an async all_reduce (and every handle to its tensors)
  // before rank 1 even arrives; the call still happens and rank 1 gets the sum.
  launch(2, [&](Group world) {
    if (world.rank() == 0) {
      all_reduce_async(world, Tensor::full({65536}, 1.0), Tensor::empty({65536}));
      Tensor t = Tensor::full({8}, 1.0);
      send_async(world, t, 1, 3);  // a send dropped before its receive is posted
    } else {
      std::this_thread::sleep_for(50ms);
      Tensor t = Tensor::full({65536}, 2.0);
      all_reduce_(world, t);
      EXPECT_EQ(t.to_vector<float>()[65535], 3.0f);
      Tensor got = Tensor::zeros({8});
      recv(world, got, 0, 3);
      EXPECT_EQ(got.to_vector<float>()[7], 1.0f);
    }
  });
}

TEST(CommFaults, MismatchReportedWhileAPeerAbortsNeverReadsFreedDescriptors) {
  // Ranks 0 and 1 make different calls while rank 2 throws: the mismatch path waits
  // until both ranks built their message from both descriptors before either
  // returns (an abort used to release one, which freed its descriptor while the
  // other was still formatting it).
  for (int trial = 0; trial < 30; ++trial) {
    const Outcome out = run_ranks(3, [&](Group world) {
      Group pair = world.split(world.rank() < 2 ? 0 : 1);
      if (world.rank() == 2) {
        std::this_thread::sleep_for(std::chrono::microseconds(20 * trial));
        throw std::runtime_error("rank two broke");
      }
      for (int k = 0; k < 50; ++k) {
        try {
          Tensor t = Tensor::ones({world.rank() == 0 ? 8 : 9});
          all_reduce_(pair, t);
        } catch (const std::invalid_argument& e) {
          EXPECT_TRUE(contains(e.what(), "rank 0 called all_reduce(f32, 8 elements, sum), rank 1 called "
                                         "all_reduce(f32, 9 elements, sum)"))
              << e.what();
        }
      }
    });
    EXPECT_EQ(out.launch_error, "rank two broke");
  }
}

TEST(CommFaults, AsyncRedistributionWithAnEmptyPlan) {
  // Partial on a mesh dim of size 1 to Replicate: a plan with no steps.
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2, 1});
    const Tensor local = Tensor::full({3, 4}, world.rank() + 1.0);
    DistTensor d = DistTensor::from_local(local, mesh, {Replicate(), Partial()});
    PendingRedistribute pending = d.redistribute_async({Replicate(), Replicate()});
    EXPECT_TRUE(pending.is_first_step_completed());
    DistTensor r = pending.wait();
    EXPECT_EQ(r.placements(), (Placements{Replicate(), Replicate()}));
    EXPECT_EQ(r.to_local().to_vector<float>(), local.to_vector<float>());
  });
}

// ---- deadlocks across groups -----------------------------------------------------------

TEST(CommFaults, RanksWaitingInDifferentGroupsAreReportedAtOnce) {
  // Rank 0 all-reduces on world, rank 1 on a group of the same two ranks: each waits
  // for the other forever. Found through the wait-for graph, not at the timeout.
  const Outcome out = run_ranks(2, [&](Group world) {
    Group copy = world.split(0);
    if (world.rank() == 0) all_reduce(world, Tensor::ones({4}));
    else all_reduce(copy, Tensor::ones({3}));
  });
  EXPECT_TRUE(contains(out.launch_error, "deadlock in group")) << out.launch_error;
  EXPECT_TRUE(contains(out.launch_error, "waits in group 'world' in all_reduce(f32, 4 elements, sum) for launch rank 1"))
      << out.launch_error;
  EXPECT_TRUE(contains(out.launch_error, "waits in group 'world/c0' in all_reduce(f32, 3 elements, sum) for launch rank 0"))
      << out.launch_error;
}

TEST(CommFaults, ACycleThroughThreeGroupsIsADeadlock) {
  // 0 waits for 1 in {0,1}, 1 for 2 in {1,2}, 2 for 0 in {0,2}.
  const Outcome out = run_ranks(3, [&](Group world) {
    const int r = world.rank();
    Group g01 = world.split(r < 2 ? 0 : -1);
    Group g12 = world.split(r > 0 ? 0 : -1);
    Group g02 = world.split(r != 1 ? 0 : -1);
    if (r == 0) barrier(g01);
    if (r == 1) barrier(g12);
    if (r == 2) barrier(g02);
  });
  EXPECT_TRUE(contains(out.launch_error, "deadlock in group")) << out.launch_error;
}

TEST(CommFaults, AsyncWorkOnTheGroupIsNoDeadlock) {
  // Rank 1's own thread waits in another group, but its queued async call will
  // arrive: the graph must not call that a deadlock.
  launch(2, [&](Group world) {
    Group copy = world.split(0);
    Tensor t = Tensor::ones({4});
    if (world.rank() == 0) {
      std::this_thread::sleep_for(20ms);
      all_reduce_(world, t);  // matched by rank 1's async call
      all_reduce_(copy, t);
    } else {
      Work w = all_reduce_async(world, t, t);
      Tensor u = Tensor::ones({4});
      all_reduce_(copy, u);
      w.wait();
      EXPECT_EQ(u.to_vector<float>()[0], 3.0f);  // rank 0's all-reduced t (2) + 1
    }
  });
}

// ---- point-to-point waits in the wait-for graph -------------------------------------------

TEST(CommFaults, ReceivesThatWaitForEachOtherAreADeadlock) {
  // Each rank receives first: neither send is ever posted.
  const Outcome out = run_ranks(2, [&](Group world) {
    world.set_timeout(20s);
    Tensor got = Tensor::zeros({4});
    recv(world, got, 1 - world.rank(), 5);
    send(world, got, 1 - world.rank(), 5);
  });
  EXPECT_TRUE(contains(out.launch_error, "[recv] deadlock in group 'world' (threads, size 2, this is rank "))
      << out.launch_error;
  EXPECT_TRUE(contains(out.launch_error, "in recv(16 bytes of f32 from rank 1, tag 5) for launch rank 1, which "
                                         "waits in group 'world' in recv(16 bytes of f32 from rank 0, tag 5) for "
                                         "launch rank 0") ||
              contains(out.launch_error, "in recv(16 bytes of f32 from rank 0, tag 5) for launch rank 0, which "
                                         "waits in group 'world' in recv(16 bytes of f32 from rank 1, tag 5) for "
                                         "launch rank 1"))
      << out.launch_error;
}

TEST(CommFaults, ASendWaitingForARankInACollectiveIsADeadlock) {
  // Rank 0 sends to rank 1, which waits in an all_reduce rank 0 never reaches; rank
  // 2 waits there too, for rank 0 (through the send it is blocked in).
  const Outcome out = run_ranks(3, [&](Group world) {
    world.set_timeout(20s);
    if (world.rank() == 0) {
      send(world, Tensor::ones({8}), 1);
      all_reduce(world, Tensor::ones({2}));
    } else {
      all_reduce(world, Tensor::ones({2}));
      recv(world, Tensor::empty({8}), 0);
    }
  });
  EXPECT_TRUE(contains(out.launch_error, "deadlock in group 'world'")) << out.launch_error;
  EXPECT_TRUE(contains(out.launch_error, "in send(32 bytes of f32 to rank 1, tag 0) for launch rank 1"))
      << out.launch_error;
  EXPECT_TRUE(contains(out.launch_error, "in all_reduce(f32, 2 elements, sum) for launch rank 0")) << out.launch_error;
}

TEST(CommFaults, AMatchedReceiveIsNoDeadlock) {
  // Rank 1 blocks in a barrier of another group after posting its receive: rank 0's
  // send, matched, completes; nothing is reported.
  launch(2, [&](Group world) {
    Group copy = world.split(0);
    if (world.rank() == 0) {
      std::this_thread::sleep_for(20ms);
      send(world, Tensor::full({4}, 3.0), 1);
      barrier(copy);
    } else {
      Tensor got = Tensor::zeros({4});
      Work w = recv_async(world, got, 0);
      barrier(copy);
      w.wait();
      EXPECT_EQ(got.to_vector<float>()[3], 3.0f);
    }
  });
}

TEST(CommFaults, CrossMeshMoveTheRanksDisagreeAboutFailsAtOnce) {
  // Ranks 0-1 move a tensor from front (ranks 0, 1) to back = ranks [2, 3], ranks 2-3
  // to back = [3, 2]: every send waits for a receive that is never posted.
  const Outcome out = run_ranks(4, [&](Group world) {
    world.set_timeout(20s);
    const DeviceMesh front = DeviceMesh::from_ranks(world, {0, 1}, {2}, {"front"});
    const std::vector<int> back_ranks = world.rank() < 2 ? std::vector<int>{2, 3} : std::vector<int>{3, 2};
    const DeviceMesh back = DeviceMesh::from_ranks(world, back_ranks, {2}, {"back"});
    const DistTensor x = distribute(Tensor::randn({6, 4}, 1), front, {Shard(0)});
    x.redistribute(back, {Shard(0)});
  });
  EXPECT_TRUE(contains(out.launch_error, "deadlock in group 'world'")) << out.launch_error;
  EXPECT_TRUE(contains(out.launch_error, "redistribute front=2 S(0) -> back=2 S(0) (its ")) << out.launch_error;
}

TEST(CommFaults, CrossMeshMoveWithMismatchedPiecesFailsOnBothSidesAtOnce) {
  // Rank 3 asks for S(1) where the others move to S(0): rank 1's send to it (rows
  // 3-5) meets its receive of another size (rows 3-5 of columns 2-3), and both throw,
  // while rank 3's other receive (from rank 0, which sends it nothing) is still
  // unmatched. The ranks catch the error and meet in a barrier. (Or, by timing, the
  // deadlock of that other receive is found first: below.)
  std::vector<std::string> caught(4);
  const Outcome out = run_ranks(4, [&](Group world) {
    world.set_timeout(20s);
    const int r = world.rank();
    const DeviceMesh front = DeviceMesh::from_ranks(world, {0, 1}, {2}, {"front"});
    const DeviceMesh back = DeviceMesh::from_ranks(world, {2, 3}, {2}, {"back"});
    const DistTensor x = distribute(Tensor::randn({6, 4}, 1), front, {Shard(0)});
    try {
      x.redistribute(back, {r == 3 ? Shard(1) : Shard(0)});
    } catch (const std::invalid_argument& e) {
      caught[r] = e.what();
    }
    barrier(world);
  });
  if (!out.launch_error.empty()) {
    // The other way it can end, as fast: rank 1's send had not been posted when rank 0
    // reached the barrier, so rank 3's receive from rank 0 (which will never send) and
    // rank 0's barrier wait for each other, and the wait-for graph names that deadlock
    // first (seen once in CI's ASan job on a loaded machine). Either way no rank waits
    // for the 20 s timeout.
    EXPECT_TRUE(contains(out.launch_error, "deadlock in group 'world'")) << out.launch_error;
    EXPECT_TRUE(contains(out.launch_error, "its recv(24 bytes of f32 from rank 0, tag 0)")) << out.launch_error;
    return;
  }
  for (int r : {1, 3}) {
    EXPECT_TRUE(contains(caught[r], "rank 1 sent 48 bytes of f32 with tag 0 to rank 3, which posted a recv of 24 bytes"))
        << "rank " << r << ": " << caught[r];
  }
  EXPECT_EQ(caught[0], "");
  EXPECT_EQ(caught[2], "");
}

// ---- ranks that return early ------------------------------------------------------------

TEST(CommFaults, ARankThatReturnedFailsItsPeersAtOnceWhileItsGroupsLiveOn) {
  // Rank 1 returns early (as a failed ASSERT_* does) while a handle to its group,
  // whose async worker has run, outlives its function (a test's result slot).
  std::vector<Group> kept(2);
  const Outcome out = run_ranks(2, [&](Group world) {
    world.set_timeout(20s);
    kept[world.rank()] = world;
    Tensor t = Tensor::ones({4});
    all_reduce_async(world, t, t).wait();
    if (world.rank() == 1) return;
    all_reduce_(world, t);
  });
  EXPECT_TRUE(contains(out.rank_errors[0], "[all_reduce] rank 1 of group 'world' (threads, size 2, this is rank 0) "
                                           "returned from its launch function without making this call"))
      << out.rank_errors[0];
  // The handles outlive the launch: a call on them fails instead of waiting.
  EXPECT_THROW(all_reduce_async(kept[0], Tensor::ones({4}), Tensor::empty({4})).wait(), std::runtime_error);
}

// A rank's ASSERT_* fails after async work, with a result slot that outlives the
// rank's function; the others wait for it in a collective and in a receive.
std::vector<std::string> assert_peer_errors(3);

void one_rank_fails_an_assert() {
  static std::vector<DistTensor> results(3);
  static std::mutex mutex;
  assert_peer_errors.assign(3, "");
  try {
    launch(3, [](Group world) {
      world.set_timeout(20s);
      const int r = world.rank();
      DeviceMesh mesh(world, {3});
      DistTensor x = distribute(Tensor::ones({6, 2}), mesh, {Shard(0)});
      results[r] = x.redistribute_async({Replicate()}).wait();
      ASSERT_NE(r, 1) << "rank 1 checks something false";
      try {
        if (r == 0) all_reduce(world, Tensor::ones({4}));
        if (r == 2) recv(world, Tensor::empty({4}), 1);
      } catch (const std::runtime_error& e) {
        std::lock_guard<std::mutex> lock(mutex);
        assert_peer_errors[r] = e.what();
        throw;
      }
    });
  } catch (const std::runtime_error&) {
  }
  results.assign(3, DistTensor());
}

TEST(CommFaults, AFailedAssertInOneRankReleasesTheOthersAtOnce) {
  EXPECT_FATAL_FAILURE_ON_ALL_THREADS(one_rank_fails_an_assert(), "rank 1 checks something false");
  // Released because rank 1 returned (or, for one of them, because the other then
  // failed), never through the 20 s timeout.
  for (int r : {0, 2}) {
    EXPECT_TRUE(contains(assert_peer_errors[r], "returned from its launch function without making this call") ||
                contains(assert_peer_errors[r], "failed: "))
        << "rank " << r << ": " << assert_peer_errors[r];
    EXPECT_FALSE(contains(assert_peer_errors[r], "timed out")) << assert_peer_errors[r];
  }
}

// ---- what mismatch messages name --------------------------------------------------------

TEST(CommFaults, MismatchNamesTheUserLevelCall) {
  launch(2, [&](Group world) {
    try {
      if (world.rank() == 0) all_reduce(world, Tensor::ones({8}));
      else all_gather(world, Tensor::ones({4}));  // its size exchange meets the all_reduce
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "rank 1 called all_gather (its size exchange: all_gather(i64, counts [4, 4]))"))
          << e.what();
    }
  });
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    DistTensor d = distribute(Tensor::ones({4, 4}), mesh, {Shard(0)});
    try {
      if (world.rank() == 0) d.redistribute({Replicate()});
      else d.redistribute({Shard(1)});
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "rank 0 called redistribute S(0)->R (its all_gather(")) << e.what();
      EXPECT_TRUE(contains(e.what(), "rank 1 called redistribute S(0)->S(1) (its all_to_all(")) << e.what();
    }
  });
}

TEST(CommFaults, TensorsThatCannotBeGatheredFailOnEveryRank) {
  std::atomic<int> errors{0};
  launch(2, [&](Group world) {
    try {
      all_gather(world, Tensor::ones({2, world.rank() == 0 ? 3 : 4}), 0);
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "[all_gather] the ranks' tensors do not fit together in group 'world': "
                                     "rank 0 has f32 with 1 x 3 elements before x after dim 0, rank 1 has f32 "
                                     "with 1 x 4"))
          << e.what();
      errors++;
    }
    try {
      Tensor in = Tensor::ones({4, 2}, world.rank() == 0 ? DType::F32 : DType::F64);
      all_to_all(world, in, {}, {1, 3});
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "[all_to_all] rank")) << e.what();
      errors++;
    }
  });
  EXPECT_EQ(errors.load(), 4);
}

// ---- DTENSOR_FAULT ------------------------------------------------------------------------

TEST(CommFaults, FaultSpecsParseOrSayWhatIsWrong) {
  const comm::FaultSpec s = comm::parse_fault_spec("kind:stall,rank:3,call:12");
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.call, 12);
  EXPECT_EQ(s.kind, comm::FaultSpec::Kind::Stall);
  for (const char* bad : {"rank:1,call:2", "rank:1,call:0,kind:throw", "rank:-1,call:1,kind:exit",
                          "rank:1,call:1,kind:explode", "rank:1,call:1,kind:throw,color:2", "rank=1", ""}) {
    EXPECT_THROW_MSG(comm::parse_fault_spec(bad), std::invalid_argument, "[DTENSOR_FAULT]");
  }
}

// Sets DTENSOR_FAULT for one scope.
struct FaultEnv {
  explicit FaultEnv(const std::string& spec) { setenv("DTENSOR_FAULT", spec.c_str(), 1); }
  ~FaultEnv() { unsetenv("DTENSOR_FAULT"); }
};

// Whether `message` names launch rank k as the rank that failed, left, returned or
// is missing (in the world group, group ranks are launch ranks).
bool names_rank(const std::string& message, int k) {
  const std::string K = std::to_string(k);
  const std::regex patterns[] = {
      std::regex("rank " + K + " failed"),
      std::regex("launch ranks? \\[?([0-9]+, )*" + K + "[\\],)]"),
      std::regex("rank " + K + " (of group 'world'|left)"),
      std::regex("group 'world' \\(threads, size [0-9]+, this is rank [0-9]+\\): ranks \\[([0-9]+, )*" + K + "[\\],]"),
  };
  for (const auto& p : patterns) {
    if (std::regex_search(message, p)) return true;
  }
  return false;
}

// A rank program with calls of every kind on the world and on a sub-group, async
// work in flight at most times, each result checked.
void workload(Group world, std::atomic<int>& wrong) {
  const int n = world.size(), r = world.rank();
  Group half = world.split(r % 2);
  for (int k = 0; k < 6; ++k) {
    Tensor x = Tensor::full({1000}, r + k);
    Work pending = all_reduce_async(half, x, x);
    Tensor sum = all_reduce(world, Tensor::full({64}, r));
    if (sum.to_vector<float>()[0] != n * (n - 1) / 2.0f) wrong++;
    Tensor gathered = all_gather(world, Tensor::full({r % 3 + 1}, r));
    if (gathered.numel() != [&] { int64_t t = 0; for (int s = 0; s < n; ++s) t += s % 3 + 1; return t; }()) wrong++;
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    Tensor got = Tensor::zeros({16});
    batch_send_recv(world, {P2POp::send(Tensor::full({16}, r), right), P2POp::recv(got, left)});
    if (got.to_vector<float>()[0] != left) wrong++;
    barrier(half);
    pending.wait();
    float want = 0;
    for (int s = r % 2; s < n; s += 2) want += s + k;
    if (x.to_vector<float>()[0] != want) wrong++;
  }
}

struct FaultCase {
  int n, rank;
  int64_t call;
  const char* kind;
};

TEST(CommFaults, InjectedFaultsEndEveryRankWithAnErrorNamingTheFailedOne) {
  // Calls per rank in the workload: 1 split + 6 x 6 = 37.
  std::vector<FaultCase> cases;
  for (int n : {2, 4, 8}) {
    for (const char* kind : {"throw", "exit", "stall"}) {
      for (int64_t call : {1, 2, 9, 37}) cases.push_back({n, call % 2 == 0 ? 0 : n - 1, call, kind});
    }
  }
  for (const FaultCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.kind << " at call " << c.call << " of rank " << c.rank << " of " << c.n);
    const std::string kind = c.kind;
    const FaultEnv env(detail::concat("rank:", c.rank, ",call:", c.call, ",kind:", kind));
    std::atomic<int> wrong{0};
    std::vector<char> finished(c.n, 0);
    const Outcome out = run_ranks(c.n, [&](Group world) {
      world.set_timeout(kind == "stall" ? 300ms : 20s);
      workload(world, wrong);
      finished[world.rank()] = 1;
    });
    EXPECT_EQ(wrong.load(), 0);  // a call that returned has the right result
    // A throw or an exit releases the others at once, never through their 20 s
    // timeout; a stall through the 300 ms one (when a rank needed the stalled one).
    for (int r = 0; r < c.n; ++r) {
      if (kind != "stall") EXPECT_FALSE(contains(out.rank_errors[r], "timed out")) << out.rank_errors[r];
    }
    if (kind == "throw") EXPECT_TRUE(contains(out.launch_error, "[fault]")) << out.launch_error;
    if (kind == "exit") EXPECT_TRUE(out.rank_errors[c.rank].empty()) << out.rank_errors[c.rank];
    int released = 0;
    for (int r = 0; r < c.n; ++r) {
      if (r == c.rank || finished[r]) continue;  // finished: it needed nothing more from the failed rank
      // Every other rank ended with an error naming the failed one.
      EXPECT_TRUE(names_rank(out.rank_errors[r], c.rank)) << "rank " << r << ": '" << out.rank_errors[r] << "'";
      ++released;
    }
    if (c.call < 37) EXPECT_GT(released, 0);
    if (kind == "stall" && released > 0) {
      EXPECT_TRUE(contains(out.launch_error, "timed out after 0.3 s")) << out.launch_error;
    }
  }
}

TEST(CommFaults, KillNeedsProcesses) {
  const FaultEnv env("rank:0,call:1,kind:kill");
  EXPECT_THROW_MSG(launch(2, [](Group world) { barrier(world); }), std::invalid_argument,
                   "kind kill needs one process per rank");
}

}  // namespace

// After launch returns no thread of the backend runs, however the ranks ended: with
// async work dropped on a group whose last reference its queued task holds (the
// worker then destroys the group itself and cannot join its own thread), or failed
// with work in flight.
TEST(CommFaults, NoBackendThreadOutlivesLaunch) {
  // Threads still running the program: a joined thread can stay listed in /proc for a
  // moment while the kernel finishes its exit (seen under TSan), but it has set
  // PF_EXITING (0x4, stat field 9) before its joiner could return; a detached worker
  // still running the library's code has not.
  auto live_threads = [] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream in(entry.path() / "stat");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t paren = text.rfind(')');
      if (paren == std::string::npos) continue;  // gone while read
      std::istringstream fields(text.substr(paren + 1));
      std::string state, skipped;
      uint64_t flags = 0;
      fields >> state >> skipped >> skipped >> skipped >> skipped >> skipped >> flags;  // fields 3, 4-8, 9
      constexpr uint64_t kExiting = 0x4;
      n += state != "Z" && state != "X" && (flags & kExiting) == 0;
    }
    return n;
  };
  auto dropped_on_a_split = [](Group world) {
    Group g = world.split(0);
    all_reduce_async(g, Tensor::ones({1 << 14}), Tensor::empty({1 << 14}));  // dropped; g goes with the task
  };
  auto failed_in_flight = [](Group world) {
    world.set_timeout(std::chrono::milliseconds(200));
    Work w = all_reduce_async(world, Tensor::ones({1 << 14}), Tensor::empty({1 << 14}));
    if (world.rank() == 1) throw std::runtime_error("rank 1 fails with work in flight");
    all_reduce(world, Tensor::ones({4}));
  };
  launch(2, dropped_on_a_split);  // any lazily made pools exist before the count
  const int before = live_threads();
  int left = 0;
  for (int i = 0; i < 40; ++i) {
    launch(i % 2 ? 2 : 4, dropped_on_a_split);
    left += live_threads() > before;
    try {
      launch(2, failed_in_flight);
    } catch (const std::exception&) {
    }
    left += live_threads() > before;
  }
  EXPECT_EQ(left, 0) << "of 80 launches, " << left << " returned with a backend thread still running";
}

// What a backend driven by the threads world (nccl) asks to fail fast: the reason a
// launch rank failed, from any group of the launch.
TEST(CommFaults, AGroupSaysWhyItsRanksCanNoLongerCommunicate) {
  std::atomic<bool> thrown{false};
  std::string seen;
  EXPECT_ANY_THROW(launch(2, [&](Group world) {
    Group pair = world.split(0);
    if (world.rank() == 1) {
      EXPECT_EQ(pair.impl()->failure(), "");  // nothing failed yet
      thrown = true;
      throw std::runtime_error("rank one broke");
    }
    while (pair.impl()->failure().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    seen = pair.impl()->failure();
  }));
  EXPECT_TRUE(thrown.load());
  EXPECT_NE(seen.find("rank 1 failed: rank one broke"), std::string::npos) << seen;
}
