// Pipeline schedules: the generated lists, the checker over many (p, m, v), what it
// catches, and the simulator against the textbook bubble fractions.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "dtensor/parallel/pipeline_schedule.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace dtensor::parallel;

namespace {

std::string list_of(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.actions[static_cast<size_t>(rank)]) out += (out.empty() ? "" : " ") + a.to_string();
  return out;
}

// The per-stage costs of an interleaved schedule whose model is split into p*v equal
// chunks: a chunk costs 1/v of a rank's share.
ActionCosts chunked(double forward, double backward, int virtual_stages) {
  return ActionCosts::uniform(forward / virtual_stages, backward / virtual_stages);
}

}  // namespace

TEST(PipelineSchedule, OneFOneBListsAreWarmupSteadyCooldown) {
  const Schedule s = one_f_one_b(2, 3);
  EXPECT_EQ(list_of(s, 0), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2");
  EXPECT_EQ(list_of(s, 1), "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2");
  const Schedule g = gpipe(2, 2);
  EXPECT_EQ(list_of(g, 0), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  EXPECT_EQ(list_of(g, 1), "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1");
  // One rank, two virtual stages: the stages hand over without messages.
  const Schedule one = interleaved_1f1b(1, 2, 2);
  for (const Action& a : one.actions[0]) EXPECT_TRUE(a.is_compute()) << a.to_string();
  EXPECT_EQ(one.stages_of(0), (std::vector<int>{0, 1}));
}

TEST(PipelineSchedule, EveryScheduleIsCheckedOverManyShapes) {
  int checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const ScheduleReport g = check_schedule(gpipe(p, m));
      const ScheduleReport f = check_schedule(one_f_one_b(p, m));
      const ScheduleReport z = check_schedule(zero_bubble(p, m));
      check_schedule(forward_only(p, m));
      checked += 4;
      for (int r = 0; r < p; ++r) {
        // GPipe holds every micro-batch; 1F1B at most p - r (p on rank 0); zero
        // bubble keeps 1F1B's bound of p.
        EXPECT_EQ(g.peak_in_flight[static_cast<size_t>(r)], m) << "GPipe p=" << p << " m=" << m << " rank " << r;
        EXPECT_EQ(f.peak_in_flight[static_cast<size_t>(r)], std::min(p - r, m)) << "1F1B p=" << p << " m=" << m;
        EXPECT_LE(z.peak_in_flight[static_cast<size_t>(r)], p) << "zero bubble p=" << p << " m=" << m;
      }
      // Two messages per micro-batch per boundary (activation and gradient).
      EXPECT_EQ(f.messages, 2 * m * (p - 1));
      for (int v = 1; v <= 4; ++v) {
        if (m % p != 0) continue;
        const ScheduleReport i = check_schedule(interleaved_1f1b(p, m, v));
        ++checked;
        EXPECT_EQ(i.messages, p == 1 ? 0 : 2 * m * (p * v - 1)) << "p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(PipelineSchedule, CheckerNamesWhatIsWrong) {
  // Rank 1 runs its backward before the forward it needs.
  Schedule s = one_f_one_b(2, 2);
  auto& r1 = s.actions[1];
  std::swap(r1[1], r1[2]);  // 1F0 <-> 1B0
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "1B0 on rank 1 comes before 1F0, which it needs");

  // A receive without its send.
  s = one_f_one_b(2, 2);
  s.actions[0].erase(s.actions[0].begin() + 1);  // 0SEND_F0
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "1RECV_F0 on rank 1 has no matching 0SEND_F0 on rank 0");

  // Receives of one channel out of the order of its sends.
  s = gpipe(2, 2);
  std::swap(s.actions[1][0], s.actions[1][2]);  // 1RECV_F0 <-> 1RECV_F1
  std::swap(s.actions[1][1], s.actions[1][3]);  // and their forwards
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "receives of a channel must come in the order of its sends");

  // A cycle of waits: rank 0 waits for the gradient of micro-batch 0 before sending
  // the activation of micro-batch 1, and rank 1 needs that activation before it runs
  // the backward that sends the gradient... only if rank 1 does forward 1 first.
  s = gpipe(2, 2);
  // rank 0: F0 SEND_F0 RECV_B0 B0 F1 SEND_F1 RECV_B1 B1
  s.actions[0] = {{ActionKind::Forward, 0, 0},      {ActionKind::SendActivation, 0, 0},
                  {ActionKind::RecvGradient, 0, 0}, {ActionKind::Backward, 0, 0},
                  {ActionKind::Forward, 0, 1},      {ActionKind::SendActivation, 0, 1},
                  {ActionKind::RecvGradient, 0, 1}, {ActionKind::Backward, 0, 1}};
  // rank 1 (GPipe): both forwards first, so it waits for activation 1 that rank 0
  // sends only after the gradient of micro-batch 0 rank 1 has not sent yet.
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument,
                   "a cycle of waits: rank 0 at 0B0 waits for 1SEND_B0 on rank 1; rank 1 at 1F1 waits for 0SEND_F1 on rank 0");

  // A missing compute action, a duplicate, the wrong rank, a transfer to itself.
  s = gpipe(2, 2);
  s.actions[1].pop_back();
  s.actions[1].pop_back();
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "no rank runs 1B1");
  s = gpipe(2, 2);
  s.actions[0].push_back({ActionKind::Backward, 0, 1});
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "0B1 appears twice");
  s = gpipe(2, 2);
  s.actions[0].push_back({ActionKind::Forward, 1, 0});
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "1F0 is on rank 0, its stage runs on rank 1");
  s = interleaved_1f1b(1, 2, 2);
  s.actions[0].insert(s.actions[0].begin() + 1, {ActionKind::SendActivation, 0, 0});
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "rank 0 would send to itself");
  // A split backward in a schedule that does not split.
  s = gpipe(1, 1);
  s.actions[0].push_back({ActionKind::BackwardWeight, 0, 0});
  EXPECT_THROW_MSG(check_schedule(s), std::invalid_argument, "0W0 does not belong in this schedule");
}

TEST(PipelineSchedule, BadShapesAndNamesAreClearErrors) {
  EXPECT_THROW_MSG(interleaved_1f1b(4, 6, 2), std::invalid_argument,
                   "the micro-batch count must be a multiple of the pipeline ranks");
  EXPECT_THROW_MSG(interleaved_1f1b(4, 6, 2), std::invalid_argument, "use 4 or 8");
  EXPECT_THROW_MSG(one_f_one_b(2, 0), std::invalid_argument, "[one_f_one_b] expected at least 1 micro-batch, got 0");
  EXPECT_THROW_MSG(gpipe(0, 4), std::invalid_argument, "expected at least 1 pipeline rank");
  EXPECT_THROW_MSG(make_schedule(ScheduleKind::GPipe, 2, 4, 2), std::invalid_argument,
                   "virtual stages are for the interleaved schedule");
  EXPECT_THROW_MSG(parse_schedule_kind("pipedream"), std::invalid_argument,
                   "unknown schedule 'pipedream': expected gpipe, 1f1b, interleaved, zero-bubble or forward-only");
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                         ScheduleKind::ZeroBubble, ScheduleKind::ForwardOnly}) {
    EXPECT_EQ(parse_schedule_kind(schedule_kind_name(k)), k);
  }
}

TEST(PipelineSimulator, UniformStagesGiveTheTextbookBubble) {
  for (int p : {1, 2, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        const Timeline t = simulate(make_schedule(kind, p, m), ActionCosts::uniform(1.0, 2.0));
        EXPECT_NEAR(t.bubble_fraction(), theoretical_bubble(kind, p, m), 1e-12)
            << schedule_kind_name(kind) << " p=" << p << " m=" << m;
        EXPECT_NEAR(t.makespan(), 3.0 * (m + p - 1), 1e-9);
      }
      for (int v : {2, 3, 4}) {
        if (m % p != 0) continue;
        const Timeline t = simulate(interleaved_1f1b(p, m, v), chunked(1.0, 2.0, v));
        EXPECT_NEAR(t.bubble_fraction(), theoretical_bubble(ScheduleKind::Interleaved1F1B, p, m, v), 1e-12)
            << "interleaved p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

TEST(PipelineSimulator, ZeroBubbleIsBelowOneFOneB) {
  for (int p : {2, 4, 8}) {
    for (int m = 2; m <= 16; ++m) {
      // Backward = input part + weight part, each half of it.
      const ActionCosts costs = ActionCosts::uniform(1.0, 2.0);
      const double zb = simulate(zero_bubble(p, m), costs).bubble_fraction();
      const double f = simulate(one_f_one_b(p, m), costs).bubble_fraction();
      EXPECT_LT(zb, f) << "p=" << p << " m=" << m;
      // ZB-H1 with F = I = W: the warm-up and cool-down leave (p-1) x (F + I - W)
      // idle per rank against 1F1B's (p-1) x (F + I + W).
      // With fewer micro-batches than ranks there are not enough W to fill the cool-down.
      if (m >= p) {
        EXPECT_NEAR(zb, theoretical_bubble(ScheduleKind::ZeroBubble, p, m), 1e-12) << "p=" << p << " m=" << m;
      }
    }
  }
}

TEST(PipelineSimulator, TransferCostsDelayTheReceiver) {
  ActionCosts costs = ActionCosts::uniform(1.0, 2.0);
  costs.transfer = 0.5;
  // p = 2, m = 1: F0 on rank 0, 0.5 s to rank 1, F0 and B0 there, 0.5 s back, B0.
  const Timeline t = simulate(one_f_one_b(2, 1), costs);
  EXPECT_NEAR(t.makespan(), 1 + 0.5 + 1 + 2 + 0.5 + 2, 1e-12);
  EXPECT_NEAR(t.busy(0), 3.0, 1e-12);
  // Per-stage costs: a slow last stage stretches the step.
  ActionCosts uneven = ActionCosts::uniform(1.0, 2.0);
  uneven.forward = {1.0, 2.0};
  uneven.backward = {2.0, 4.0};
  EXPECT_NEAR(simulate(one_f_one_b(2, 4), uneven).makespan(), 1 + 4 * 6 + 2, 1e-12);
  uneven.forward = {1.0, 2.0, 3.0};
  EXPECT_THROW_MSG(simulate(one_f_one_b(2, 4), uneven), std::invalid_argument, "one value or one per stage (2), got 3");
}

TEST(PipelineTimeline, SvgAndChromeTraceShowEveryRankAndAction) {
  Timeline t = simulate(one_f_one_b(2, 2), ActionCosts::uniform(1.0, 2.0));
  t.title = "1F1B p=2 m=2";
  const std::string svg = t.to_svg();
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("rank 1"), std::string::npos);
  EXPECT_NE(svg.find("<title>1B1 "), std::string::npos);
  EXPECT_NE(svg.find("bubble 33.3%"), std::string::npos) << svg.substr(0, 400);
  const std::string json = t.to_chrome_trace();
  EXPECT_NE(json.find("\"name\":\"0F0\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"rank 1\""), std::string::npos);
  const std::string path = ::testing::TempDir() + "/pipeline_timeline.svg";
  t.write_svg(path);
  std::ifstream in(path);
  EXPECT_TRUE(in.good());
  EXPECT_THROW_MSG(t.write_svg("/nonexistent/dir/x.svg"), std::invalid_argument, "cannot write '/nonexistent/dir/x.svg'");
}
