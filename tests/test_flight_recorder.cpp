// The flight recorder (dtensor/flight_recorder.h) on the threads backend: what each
// call leaves in the record, its states, the dumps a failed launch writes for every
// rank, and what the analysis names for a stalled rank, a mismatch, an unmatched
// receive and a rank without a record.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/collective_args.h"
#include "dtensor/dtensor.h"
#include "dtensor/flight_recorder.h"
#include "test_helpers.h"

using namespace dtensor;
using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using dtensor::testing::ScopedEnv;
using dtensor::testing::ScratchDir;

const json& group_named(const json& record, const std::string& name) {
  for (const json& g : record.at("groups")) {
    if (g.at("name") == name) return g;
  }
  throw std::runtime_error("no group " + name + " in " + record.dump());
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(FlightRecorder, RecordsEachCallWithItsNumberSizesAndState) {
  launch(2, [](Group world) {
    const int r = world.rank();
    all_reduce(world, Tensor::ones({4}));
    Tensor gathered = Tensor::empty({6, 2});
    all_gather_async(world, Tensor::ones({3, 2}), gathered).wait();
    broadcast(world, Tensor::ones({5}), 1);
    if (r == 0) send(world, Tensor::ones({7}), 1, 3);
    if (r == 1) recv(world, Tensor::empty({7}), 0, 3);
    barrier(world);
    Group pair = world.split(0);
    all_reduce(pair, Tensor::ones({2}, DType::F64));

    const json record = json::parse(flight_record_json(world));
    EXPECT_EQ(record.at("format"), "dtensor-flight-record");
    EXPECT_EQ(record.at("rank"), r);
    EXPECT_EQ(record.at("world_size"), 2);
    EXPECT_EQ(record.at("backend"), "threads");
    const json& w = group_named(record, "world");
    EXPECT_EQ(w.at("ranks"), json::array({0, 1}));
    EXPECT_EQ(w.at("calls"), 5);  // all_reduce, all_gather, broadcast, barrier, split
    EXPECT_EQ(w.at("p2p_calls"), 1);
    const json& e = w.at("entries");
    ASSERT_EQ(e.size(), 6u);
    const std::vector<std::string> ops{"all_reduce", "all_gather", "broadcast", r == 0 ? "send" : "recv",
                                       "barrier",    "split"};
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(e[i].at("op"), ops[i]) << i;
      EXPECT_EQ(e[i].at("state"), "completed") << i;
      EXPECT_GE(e[i].at("done_us").get<int64_t>(), e[i].at("issued_us").get<int64_t>()) << i;
    }
    EXPECT_EQ(e[0].at("seq"), 0);
    EXPECT_EQ(e[0].at("in"), 4);
    EXPECT_EQ(e[0].at("dtype"), "f32");
    EXPECT_EQ(e[1].at("seq"), 1);
    EXPECT_EQ(e[1].at("in"), 6);
    EXPECT_EQ(e[1].at("out"), 12);
    EXPECT_EQ(e[1].at("async"), true);
    EXPECT_EQ(e[2].at("root"), 1);
    EXPECT_EQ(e[3].at("peer"), 1 - r);
    EXPECT_EQ(e[3].at("tag"), 3);
    EXPECT_EQ(e[3].at("seq"), 0);  // the first message between the two with tag 3
    EXPECT_EQ(e[4].at("seq"), 3);
    const json& child = group_named(record, pair.name());
    EXPECT_EQ(child.at("entries").at(0).at("dtype"), "f64");
    EXPECT_EQ(child.at("calls"), 1);
  });
}

TEST(FlightRecorder, NamesTheLibraryCallACollectiveBelongsTo) {
  launch(2, [](Group world) {
    DeviceMesh mesh(world, {2}, {"dp"});
    DistTensor x = distribute(Tensor::arange(8, DType::F32), mesh, {Shard(0)});
    x.redistribute({Replicate()});
    const json record = json::parse(flight_record_json(world));
    bool found = false;
    for (const json& g : record.at("groups")) {
      for (const json& e : g.at("entries")) found |= contains(e.value("context", ""), "redistribute");
    }
    EXPECT_TRUE(found) << record.dump(1);
  });
}

TEST(FlightRecorder, AnAsyncCallIsStartedUntilItCompletes) {
  std::atomic<bool> looked{false};
  launch(2, [&](Group world) {
    if (world.rank() == 1) {
      while (!looked.load()) std::this_thread::sleep_for(1ms);
      barrier(world);
      return;
    }
    Work work = barrier_async(world);
    const json before = json::parse(flight_record_json(world));
    looked = true;
    work.wait();
    const json after = json::parse(flight_record_json(world));
    EXPECT_EQ(group_named(before, "world").at("entries").at(0).at("state"), "started");
    EXPECT_EQ(group_named(after, "world").at("entries").at(0).at("state"), "completed");
  });
}

TEST(FlightRecorder, ADroppedWorkIsAskedWhetherItCompletedWhenDumped) {
  launch(2, [](Group world) {
    { all_reduce_async(world, Tensor::ones({3}), Tensor::empty({3})); }  // dropped at once
    barrier(world);
    std::string state;
    for (int i = 0; i < 500 && state != "completed"; ++i) {
      const json record = json::parse(flight_record_json(world));
      const json& first = group_named(record, "world").at("entries").at(0);
      EXPECT_EQ(first.at("dropped"), true);
      state = first.at("state");
      std::this_thread::sleep_for(2ms);
    }
    EXPECT_EQ(state, "completed");
  });
}

TEST(FlightRecorder, KeepsTheLastEntriesOfEachGroup) {
  launch(2, [](Group world) {
    const Tensor t = Tensor::ones({1});
    for (int i = 0; i < 2100; ++i) all_reduce_(world, t);
    const json record = json::parse(flight_record_json(world));
    const json& w = group_named(record, "world");
    EXPECT_EQ(w.at("calls"), 2100);
    ASSERT_EQ(w.at("entries").size(), static_cast<size_t>(record.at("capacity").get<int64_t>()));
    EXPECT_EQ(w.at("entries").back().at("seq"), 2099);
    EXPECT_EQ(w.at("entries").front().at("seq"), 2100 - record.at("capacity").get<int64_t>());
  });
}

TEST(FlightRecorder, AStalledRankIsNamedAsTheOneThatNeverArrived) {
  ScratchDir dir;
  ScopedEnv where("DTENSOR_FLIGHT_RECORDER", dir.path().c_str());
  ScopedEnv fault("DTENSOR_FAULT", "rank:2,call:3,kind:stall");
  EXPECT_THROW(launch(3,
                      [](Group world) {
                        world.set_timeout(300ms);
                        for (int i = 0; i < 4; ++i) all_reduce(world, Tensor::ones({8}));
                      }),
               std::runtime_error);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(fs::exists(dir.path() + "/rank-" + std::to_string(r) + ".json")) << r;
  const FlightAnalysis analysis = analyze_flight_records(dir.path());
  EXPECT_EQ(analysis.world_size, 3);
  EXPECT_EQ(analysis.ranks_read, (std::vector<int>{0, 1, 2}));
  ASSERT_FALSE(analysis.consistent());
  const FlightFinding& first = analysis.findings.front();
  EXPECT_EQ(first.kind, FlightFinding::Kind::NeverArrived) << analysis.report();
  EXPECT_EQ(first.group, "world");
  EXPECT_EQ(first.seq, 2);
  EXPECT_EQ(first.ranks, std::vector<int>{2});
  EXPECT_TRUE(contains(analysis.report(), "rank 2 never arrived at call #2 of group 'world' (ranks 0,1,2)"))
      << analysis.report();
  EXPECT_TRUE(contains(analysis.report(),
                       "Rank 2's last call, in this group or any, was #1, all_reduce(f32, 8 -> 8 "
                       "elements), completed."))
      << analysis.report();
  EXPECT_EQ(analysis.suspects, std::vector<int>{2});
}

TEST(FlightRecorder, TheFirstDisagreementIsNamed) {
  ScratchDir dir;
  ScopedEnv where("DTENSOR_FLIGHT_RECORDER", dir.path().c_str());
  EXPECT_ANY_THROW(launch(2, [](Group world) {
    world.set_timeout(2000ms);
    all_reduce(world, Tensor::ones({4}));
    if (world.rank() == 0) {
      all_reduce(world, Tensor::ones({4}));
    } else {
      broadcast(world, Tensor::ones({4}), 0);
    }
  }));
  const FlightAnalysis analysis = analyze_flight_records(dir.path());
  ASSERT_FALSE(analysis.consistent());
  const FlightFinding& first = analysis.findings.front();
  EXPECT_EQ(first.kind, FlightFinding::Kind::Mismatch) << analysis.report();
  EXPECT_EQ(first.seq, 1);
  EXPECT_TRUE(contains(first.message, "ranks disagree at call #1 of group 'world'")) << first.message;
  EXPECT_TRUE(contains(first.message, "rank 0 all_reduce(f32, 4 -> 4 elements)")) << first.message;
  EXPECT_TRUE(contains(first.message, "rank 1 broadcast(f32, 4 -> 4 elements, root 0)")) << first.message;
}

TEST(FlightRecorder, AReceiveNoPeerSentIsNamed) {
  ScratchDir dir;
  ScopedEnv where("DTENSOR_FLIGHT_RECORDER", dir.path().c_str());
  EXPECT_ANY_THROW(launch(2, [](Group world) {
    world.set_timeout(300ms);
    if (world.rank() == 1) recv(world, Tensor::empty({4}), 0, /*tag=*/3);
    if (world.rank() == 0) barrier(world);  // waits for rank 1, which waits for a send
  }));
  const FlightAnalysis analysis = analyze_flight_records(dir.path());
  const std::string report = analysis.report();
  bool named = false;
  for (const FlightFinding& f : analysis.findings) {
    named |= f.kind == FlightFinding::Kind::Unmatched &&
             contains(f.message, "rank 1 waits in recv(f32, 4 elements, from group rank 0, tag 3") &&
             contains(f.message, "which rank 0 never posted: it made 0 sends with that tag to rank 1") &&
             contains(f.message, "rank 0's last call was #0 of group 'world' (ranks 0,1): barrier");
  }
  EXPECT_TRUE(named) << report;
}

TEST(FlightRecorder, ACompleteRunIsConsistentAndDumpsOnDemand) {
  ScratchDir dir;
  launch(4, [&](Group world) {
    DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
    all_reduce(mesh.group("dp"), Tensor::ones({4}));
    all_reduce(mesh.group("tp"), Tensor::ones({4}));
    const std::string path = dump_flight_record(world, dir.path());
    EXPECT_EQ(path, dir.path() + "/rank-" + std::to_string(world.rank()) + ".json");
  });
  const FlightAnalysis analysis = analyze_flight_records(dir.path());
  EXPECT_TRUE(analysis.consistent()) << analysis.report();
  EXPECT_TRUE(contains(analysis.report(), "flight records of 4 of 4 ranks\nconsistent")) << analysis.report();
  // Groups of one name but other members are told apart: dp of rank 0 is {0, 2}.
  const json record = json::parse(std::ifstream(dir.path() + "/rank-0.json"));
  EXPECT_EQ(group_named(record, "dp").at("ranks"), json::array({0, 2}));
  EXPECT_THROW(dump_flight_record(Group(), dir.path()), std::invalid_argument);
}

TEST(FlightRecorder, RanksWithoutARecordAreTheSuspectsWhereAllOthersWait) {
  // What an MPI job leaves when one process was killed before it could dump.
  ScratchDir dir;
  for (int r = 0; r < 2; ++r) {
    json entries = json::array();
    for (int s = 3; s < 6; ++s) {  // the ring kept calls 3 to 5
      entries.push_back({{"seq", s},
                         {"op", "all_reduce"},
                         {"dtype", "bf16"},
                         {"in", 16},
                         {"out", 16},
                         {"state", s == 5 ? "issued" : "completed"},
                         {"async", false},
                         {"issued_us", 1000 + s}});
    }
    const json record = {{"format", "dtensor-flight-record"},
                         {"version", 1},
                         {"rank", r},
                         {"world_size", 3},
                         {"groups", json::array({{{"name", "world"},
                                                  {"ranks", {0, 1, 2}},
                                                  {"rank", r},
                                                  {"size", 3},
                                                  {"calls", 6},
                                                  {"p2p_calls", 0},
                                                  {"entries", entries}}})}};
    std::ofstream(dir.path() + "/rank-" + std::to_string(r) + ".json") << record.dump();
  }
  const FlightAnalysis analysis = analyze_flight_records(dir.path());
  ASSERT_EQ(analysis.findings.size(), 2u) << analysis.report();
  EXPECT_EQ(analysis.findings[0].kind, FlightFinding::Kind::NeverArrived);
  EXPECT_EQ(analysis.findings[0].ranks, std::vector<int>{2});
  EXPECT_TRUE(contains(analysis.findings[0].message,
                       "ranks 0, 1 wait in call #5 of group 'world' (ranks 0,1,2), all_reduce(bf16, 16 -> 16 "
                       "elements), issued; rank 2 of the group left no record"))
      << analysis.report();
  EXPECT_EQ(analysis.findings[1].kind, FlightFinding::Kind::NoRecord);
  EXPECT_EQ(analysis.suspects, std::vector<int>{2});

  std::ofstream(dir.path() + "/rank-2.json") << "{\"format\": \"something else\"}";
  EXPECT_THROW(analyze_flight_records(dir.path()), std::invalid_argument);
  EXPECT_THROW(analyze_flight_records(dir.path() + "/missing"), std::invalid_argument);
}

TEST(FlightRecorder, OnAMeshOnlyTheStalledRankIsTheSuspect) {
  ScratchDir dir;
  ScopedEnv where("DTENSOR_FLIGHT_RECORDER", dir.path().c_str());
  ScopedEnv fault("DTENSOR_FAULT", "rank:1,call:6,kind:stall");
  EXPECT_ANY_THROW(launch(4, [](Group world) {
    DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
    for (const char* dim : {"dp", "tp"}) Group(mesh.group(dim)).set_timeout(300ms);
    for (int i = 0; i < 3; ++i) {
      all_reduce(mesh.group("tp"), Tensor::ones({4}));
      all_reduce(mesh.group("dp"), Tensor::ones({2}));
    }
  }));
  const FlightAnalysis analysis = analyze_flight_records(dir.path());
  EXPECT_EQ(analysis.suspects, std::vector<int>{1}) << analysis.report();
  EXPECT_TRUE(contains(analysis.report(), "suspect: rank 1, which stopped communicating")) << analysis.report();
}

// A backend that completes calls after they return (nccl: when the GPU ran them)
// takes the record over: the public call returning leaves it started.
TEST(FlightRecorder, ABackendCanCompleteACallAfterItReturned) {
  launch(2, [](Group world) {
    comm::FlightRecorder& recorder = *world.impl()->flight_recorder();
    comm::FlightRef taken;
    {
      comm::FlightToken token = comm::begin_call("all_reduce", world, 16, {.dtype = DType::F32, .in_count = 4});
      taken = comm::CallContext::current().flight;  // what the backend reads while it runs the call
      ASSERT_EQ(taken.recorder, &recorder);
      recorder.defer(taken.group, taken.id);
    }  // the call returns
    EXPECT_EQ(comm::CallContext::current().flight.recorder, nullptr);
    auto state = [&] {
      return group_named(json::parse(flight_record_json(world)), "world").at("entries").at(0).at("state");
    };
    EXPECT_EQ(state(), "started");
    recorder.complete(taken.group, taken.id, comm::FlightState::Completed);  // the GPU ran it
    EXPECT_EQ(state(), "completed");
  });
}
