// The timeline tracer: Chrome trace JSON with one track per rank, step filtering,
// and nothing recorded while disabled.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "dtensor/group.h"
#include "dtensor/trace.h"
#include "test_helpers.h"

using namespace dtensor;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return nlohmann::json::parse(text);
}

}  // namespace

TEST(Trace, ChromeJsonWithOneTrackPerRankAndChosenSteps) {
  const std::string path = ::testing::TempDir() + "dtensor_trace_" + std::to_string(::getpid()) + ".json";
  Tracer::start(path);
  launch(2, [&](Group world) {
    Tracer::record_steps(1, 2);  // steps 1 and 2 of 0..3
    for (int64_t step = 0; step < 4; ++step) {
      Tracer::begin_step(step);
      TraceSpan outer("step", "train");
      {
        TraceSpan inner("forward", "compute");
        barrier(world);
      }
      Tracer::counter("loss", 4.0 - static_cast<double>(step));
      Tracer::instant(std::string("checkpoint \"") + std::to_string(step) + "\"", "io");
    }
  });
  EXPECT_EQ(Tracer::stop(), path);
  const size_t recorded = Tracer::events().size();
  { TraceSpan after("after stop"); }
  EXPECT_EQ(Tracer::events().size(), recorded) << "a disabled tracer recorded a span";

  const nlohmann::json doc = read_json(path);
  std::remove(path.c_str());
  const nlohmann::json& events = doc.at("traceEvents");
  ASSERT_TRUE(events.is_array());
  std::map<std::pair<int64_t, std::string>, int> count;  // (pid, name) -> events
  std::map<int64_t, double> step_dur, forward_dur;
  for (const nlohmann::json& e : events) {
    const int64_t pid = e.at("pid").get<int64_t>();
    EXPECT_EQ(e.at("tid").get<int64_t>(), pid);
    const std::string name = e.at("name").get<std::string>();
    const std::string ph = e.at("ph").get<std::string>();
    ++count[{pid, name}];
    if (ph == "X") {
      EXPECT_GE(e.at("ts").get<double>(), 0);
      EXPECT_GE(e.at("dur").get<double>(), 0);
      (name == "step" ? step_dur : forward_dur)[pid] += e.at("dur").get<double>();
    }
    if (ph == "C") {
      EXPECT_TRUE(e.at("args").contains("loss"));
    }
  }
  // Per rank: step, forward, the barrier (collectives mark the timeline), loss, two
  // checkpoints and the track name; nothing else.
  EXPECT_EQ(count.size(), 14u);
  for (int64_t pid : {0, 1}) {
    EXPECT_EQ((count[{pid, "step"}]), 2) << "rank " << pid;
    EXPECT_EQ((count[{pid, "forward"}]), 2);
    EXPECT_EQ((count[{pid, "barrier"}]), 2);
    EXPECT_EQ((count[{pid, "loss"}]), 2);
    EXPECT_EQ((count[{pid, "checkpoint \"1\""}]), 1);  // escaped in the JSON, intact after parsing
    EXPECT_EQ((count[{pid, "checkpoint \"0\""}]), 0);  // step 0 was not chosen
    EXPECT_EQ((count[{pid, "process_name"}]), 1);
    EXPECT_GE(step_dur[pid], forward_dur[pid]);  // the inner span lies within the outer
  }
}

TEST(Trace, RankPlaceholderAndUnwritablePath) {
  Tracer::start();
  Tracer::set_rank(3);
  { TraceSpan span("work"); }
  EXPECT_EQ(Tracer::stop(), "");  // no path given: nothing written
  const std::vector<TraceEvent> events = Tracer::events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].pid, 3);
  const std::string pattern = ::testing::TempDir() + "dtensor_trace_" + std::to_string(::getpid()) + ".{rank}.json";
  Tracer::write(pattern);
  const std::string written = ::testing::TempDir() + "dtensor_trace_" + std::to_string(::getpid()) + ".3.json";
  EXPECT_EQ(read_json(written).at("traceEvents").size(), 2u);  // the span and the track name
  std::remove(written.c_str());
  EXPECT_THROW_MSG(Tracer::write("/nonexistent/dir/trace.json"), std::invalid_argument,
                   "[trace] cannot write trace file \"/nonexistent/dir/trace.json\"");
  Tracer::set_rank(0);
}
