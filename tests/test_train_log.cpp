// The progress display (plain lines when not a terminal, in-place redraws on one),
// the summary, and the loss curve files.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "dtensor/format.h"
#include "test_helpers.h"
#include "train_log.h"

using namespace dtensor;
using namespace dtensor::tools;

namespace {

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

StepStats stats(int64_t step, double loss) {
  StepStats s;
  s.step = step;
  s.loss = loss;
  s.tokens = 2048;
  s.seconds = 0.05;
  s.peak_memory_bytes = {12 * 1024 * 1024 + 300 * 1024, 3 * 1024 + 512};
  return s;
}

}  // namespace

TEST(TrainLog, PlainLinesWhenNotATerminal) {
  std::FILE* out = std::tmpfile();
  TrainLog log(120, TrainLog::Mode::Auto, out);  // a file is not a tty
  EXPECT_FALSE(log.is_terminal());
  StepStats first = stats(0, 4.1589);
  first.lr = 3e-4;
  log.step(first);
  log.step(stats(1, 3.5));
  const std::string summary = log.finish();
  const std::string text = read_all(out);
  std::fclose(out);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  EXPECT_EQ(text,
            "step   1/120 | loss 4.1589 | lr 3.00e-04 | 41.0k tok/s | 50.0 ms | peak mem r0 12.3 MiB, r1 3.50 KiB\n"
            "step   2/120 | loss 3.5000 | 41.0k tok/s | 50.0 ms | peak mem r0 12.3 MiB, r1 3.50 KiB\n" +
                summary + "\n");
  EXPECT_EQ(summary,
            "done: 2 steps in 0.10 s | loss 4.1589 -> 3.5000 (best 3.5000 at step 2) | 41.0k tok/s"
            " | peak mem r0 12.3 MiB, r1 3.50 KiB");
}

TEST(TrainLog, TerminalRedrawsInPlace) {
  std::FILE* out = std::tmpfile();
  TrainLog log(3, TrainLog::Mode::Terminal, out);
  log.step(stats(0, 2.0));
  log.step(stats(1, 1.0));
  log.finish();
  const std::string text = read_all(out);
  std::fclose(out);
  const std::string erase = "\r\033[2K";
  EXPECT_EQ(text.rfind(erase + "step 1/3", 0), 0u) << text;
  EXPECT_NE(text.find(erase + "step 2/3"), std::string::npos);
  // Progress lines stay on one terminal row: the only newlines end the last line and the summary.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
}

TEST(TrainLog, LossCurveCsvAndSvg) {
  std::FILE* sink = std::tmpfile();
  TrainLog log(50, TrainLog::Mode::Plain, sink);
  for (int64_t s = 0; s < 50; ++s) log.step(stats(s, 4.0 * std::exp(-0.05 * static_cast<double>(s)) + 0.5));
  std::fclose(sink);
  const std::string base = ::testing::TempDir() + "dtensor_loss_" + std::to_string(::getpid());
  const std::string svg_path = log.write_loss_curve(base + ".csv", "GPT <tiny> loss");
  EXPECT_EQ(svg_path, base + ".svg");
  const std::string csv = read_file(base + ".csv");
  // The most any rank held: r0's 12.3 MiB.
  EXPECT_EQ(csv.rfind("step,loss,seconds,peak_bytes\n1,4.5,0.05,12890112\n2,4.3049177", 0), 0u) << csv.substr(0, 80);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 51);
  const std::string svg = read_file(svg_path);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("GPT &lt;tiny&gt; loss</text>"), std::string::npos);  // escaped title
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">loss</text>"), std::string::npos);
  // Ticks: steps 0..50 by 10, losses 0.5..4.5 by 0.5 or 1.
  for (const char* tick : {">10</text>", ">50</text>", ">1</text>", ">4</text>"}) {
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  }
  const size_t points = svg.find("points=\"");
  ASSERT_NE(points, std::string::npos);
  const std::string list = svg.substr(points + 8, svg.find('"', points + 8) - points - 8);
  EXPECT_EQ(std::count(list.begin(), list.end(), ','), 50);  // one x,y pair per step
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  std::remove((base + ".csv").c_str());
  std::remove(svg_path.c_str());
  EXPECT_THROW_MSG(log.write_csv("/nonexistent/loss.csv"), std::invalid_argument,
                   "[TrainLog] cannot write loss curve file \"/nonexistent/loss.csv\"");
}

TEST(TrainLog, Formatting) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(format_count(980), "980");
  EXPECT_EQ(format_count(45210), "45.2k");
  EXPECT_EQ(format_count(1.234e6), "1.23M");
  EXPECT_EQ(nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(nice_ticks(1, 50, 6), (std::vector<double>{10, 20, 30, 40, 50}));
  EXPECT_EQ(nice_ticks(3, 3, 5), (std::vector<double>{2.8, 3.0, 3.2}));  // a constant curve still gets an axis
}
