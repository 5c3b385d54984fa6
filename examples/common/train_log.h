// The training progress display, the run summary and the loss curve files (the
// dtensor_tools target of examples/common; not part of libdtensor).
//
//   TrainLog log(total_steps);                 // auto: redraw on a terminal, lines when piped
//   for (...) log.step({step, loss, tokens, seconds, peak_bytes_per_rank});
//   log.finish();                              // summary line(s)
//   log.write_loss_curve("loss.csv");          // loss.csv and loss.svg
//
// One line per step: "step   12/200 | loss 3.4521 | lr 3.00e-04 | 45.2k tok/s |
// 123.4 ms | peak mem r0 12.3 MiB, r1 12.3 MiB" (then "| host r0 ..." where ranks hold
// memory on cpu:1, the host side of offloading). On a terminal it redraws in place
// ('\r' and the ANSI erase-line sequence); into a pipe or file every line stays.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/parallel/trainer.h"  // StepStats

namespace dtensor::tools {

class TrainLog {
 public:
  enum class Mode { Auto, Terminal, Plain };
  // Writes to `out` (stdout by default). Auto: Terminal when out is a tty.
  explicit TrainLog(int64_t total_steps, Mode mode = Mode::Auto, std::FILE* out = stdout);

  void step(const StepStats& stats);
  // A line of its own between progress lines (a checkpoint written, ...); on a
  // terminal the redrawn progress line is kept above it.
  void note(const std::string& text);
  // Prints the summary (after a newline that ends a redrawn line) and returns it.
  std::string finish();

  bool is_terminal() const { return terminal_; }
  const std::vector<StepStats>& history() const { return history_; }
  // The progress line for `stats`, without any terminal control sequence.
  std::string format_line(const StepStats& stats) const;
  std::string summary() const;

  // "step,loss,seconds,peak_bytes" lines, one per logged step (1-based steps as
  // displayed; peak_bytes: the most any rank held during the step).
  void write_csv(const std::string& path) const;
  // A line chart of loss against step with ticked, labelled axes and a title.
  void write_svg(const std::string& path, const std::string& title = "training loss") const;
  // Writes `csv_path` and the SVG beside it (the same name with .svg); returns the
  // SVG path. Throws std::invalid_argument naming a path that cannot be written.
  std::string write_loss_curve(const std::string& csv_path, const std::string& title = "training loss") const;

 private:
  int64_t total_steps_;
  bool terminal_;
  std::FILE* out_;
  bool line_open_ = false;  // a redrawn line is on screen without its newline
  std::vector<StepStats> history_;
};

}  // namespace dtensor::tools
