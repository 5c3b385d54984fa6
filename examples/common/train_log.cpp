// Progress lines, the run summary, and the loss curve as CSV and SVG.
#include "train_log.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <stdexcept>

#include "dtensor/format.h"

namespace dtensor::tools {

namespace {

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

}  // namespace

TrainLog::TrainLog(int64_t total_steps, Mode mode, std::FILE* out) : total_steps_(total_steps), out_(out) {
  if (total_steps < 0) {
    throw std::invalid_argument("[TrainLog] expected total_steps >= 0, got " + std::to_string(total_steps));
  }
  if (out == nullptr) throw std::invalid_argument("[TrainLog] expected an output stream, got null");
  terminal_ = mode == Mode::Terminal || (mode == Mode::Auto && ::isatty(::fileno(out)) == 1);
}

std::string TrainLog::format_line(const StepStats& s) const {
  const int width = static_cast<int>(std::to_string(total_steps_).size());
  std::ostringstream os;
  char head[64];
  std::snprintf(head, sizeof(head), "step %*lld/%lld", width, static_cast<long long>(s.step + 1),
                static_cast<long long>(total_steps_));
  os << head << " | loss " << printf_string("%.4f", s.loss);
  if (s.lr) os << " | lr " << printf_string("%.2e", *s.lr);
  os << " | " << format_count(s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : NAN) << " tok/s | "
     << printf_string("%.1f", s.seconds * 1e3) << " ms";
  if (!s.peak_memory_bytes.empty()) {
    os << " | peak mem";
    for (size_t r = 0; r < s.peak_memory_bytes.size(); ++r) {
      os << (r ? ", r" : " r") << r << " " << format_bytes(s.peak_memory_bytes[r]);
    }
  }
  if (!s.peak_host_memory_bytes.empty()) {
    os << " | host";
    for (size_t r = 0; r < s.peak_host_memory_bytes.size(); ++r) {
      os << (r ? ", r" : " r") << r << " " << format_bytes(s.peak_host_memory_bytes[r]);
    }
  }
  return os.str();
}

void TrainLog::step(const StepStats& stats) {
  history_.push_back(stats);
  const std::string line = format_line(stats);
  if (terminal_) {
    // Carriage return + erase line: the new line replaces the old one in place.
    std::fprintf(out_, "\r\033[2K%s", line.c_str());
    line_open_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void TrainLog::note(const std::string& text) {
  if (line_open_) std::fputc('\n', out_);
  line_open_ = false;
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

std::string TrainLog::summary() const {
  if (history_.empty()) return "no steps were run";
  double seconds = 0;
  int64_t tokens = 0;
  size_t best = 0;
  for (size_t i = 0; i < history_.size(); ++i) {
    seconds += history_[i].seconds;
    tokens += history_[i].tokens;
    if (history_[i].loss < history_[best].loss) best = i;
  }
  std::ostringstream os;
  os << "done: " << history_.size() << " steps in " << printf_string("%.2f", seconds) << " s | loss "
     << printf_string("%.4f", history_.front().loss) << " -> " << printf_string("%.4f", history_.back().loss)
     << " (best " << printf_string("%.4f", history_[best].loss) << " at step " << history_[best].step + 1 << ") | "
     << format_count(seconds > 0 ? static_cast<double>(tokens) / seconds : NAN) << " tok/s";
  // Peak memory per rank over the whole run (and on the host side of offloading).
  for (const bool host : {false, true}) {
    std::vector<int64_t> peaks;
    for (const StepStats& s : history_) {
      const std::vector<int64_t>& step = host ? s.peak_host_memory_bytes : s.peak_memory_bytes;
      if (peaks.size() < step.size()) peaks.resize(step.size(), 0);
      for (size_t r = 0; r < step.size(); ++r) peaks[r] = std::max(peaks[r], step[r]);
    }
    if (peaks.empty()) continue;
    os << (host ? " | host" : " | peak mem");
    for (size_t r = 0; r < peaks.size(); ++r) os << (r ? ", r" : " r") << r << " " << format_bytes(peaks[r]);
  }
  return os.str();
}

std::string TrainLog::finish() {
  const std::string text = summary();
  if (line_open_) std::fputc('\n', out_);
  line_open_ = false;
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
  return text;
}

void TrainLog::write_csv(const std::string& path) const {
  std::ofstream out(path);
  if (!out.good()) throw std::invalid_argument("[TrainLog] cannot write loss curve file \"" + path + "\"");
  // peak_bytes: the most any rank held during the step (the estimator's "memory per
  // device" is the most loaded rank's); empty when the step did not report peaks.
  out << "step,loss,seconds,peak_bytes\n";
  out.precision(9);
  for (const StepStats& s : history_) {
    out << s.step + 1 << "," << s.loss << "," << s.seconds << ",";
    if (!s.peak_memory_bytes.empty()) {
      out << *std::max_element(s.peak_memory_bytes.begin(), s.peak_memory_bytes.end());
    }
    out << "\n";
  }
  out.close();
  if (out.fail()) throw std::invalid_argument("[TrainLog] error writing loss curve file \"" + path + "\"");
}

namespace {

std::string tick_label(double v) {
  const double a = std::fabs(v);
  if (v == 0) return "0";
  if (a >= 1e5 || a < 1e-3) return printf_string("%.1e", v);
  if (std::floor(v) == v) return printf_string("%.0f", v);
  return printf_string(a >= 10 ? "%.1f" : "%.2f", v);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace

void TrainLog::write_svg(const std::string& path, const std::string& title) const {
  constexpr double kWidth = 640, kHeight = 400;
  constexpr double kLeft = 70, kRight = 20, kTop = 40, kBottom = 55;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  // Data range, widened to the outermost ticks so the curve sits inside the axes.
  double x_lo = 1, x_hi = 1, y_lo = 0, y_hi = 1;
  bool first = true;
  for (const StepStats& s : history_) {
    if (!std::isfinite(s.loss)) continue;
    const double x = static_cast<double>(s.step + 1);
    x_lo = first ? x : std::min(x_lo, x);
    x_hi = first ? x : std::max(x_hi, x);
    y_lo = first ? s.loss : std::min(y_lo, s.loss);
    y_hi = first ? s.loss : std::max(y_hi, s.loss);
    first = false;
  }
  const std::vector<double> x_ticks = nice_ticks(x_lo, x_hi, 6);
  const std::vector<double> y_ticks = nice_ticks(y_lo, y_hi, 5);
  x_lo = std::min(x_lo, x_ticks.front());
  x_hi = std::max(x_hi, x_ticks.back());
  y_lo = std::min(y_lo, y_ticks.front());
  y_hi = std::max(y_hi, y_ticks.back());
  if (x_hi == x_lo) x_hi = x_lo + 1;
  if (y_hi == y_lo) y_hi = y_lo + 1;
  auto px = [&](double x) { return kLeft + (x - x_lo) / (x_hi - x_lo) * plot_w; };
  auto py = [&](double y) { return kTop + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h; };

  std::ostringstream os;
  os.precision(6);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
     << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << kWidth / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" << xml_escape(title)
     << "</text>\n";
  // Grid lines and tick labels.
  for (double t : x_ticks) {
    os << "<line x1=\"" << px(t) << "\" y1=\"" << kTop << "\" x2=\"" << px(t) << "\" y2=\"" << kTop + plot_h
       << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << px(t) << "\" y=\"" << kTop + plot_h + 18
       << "\" text-anchor=\"middle\">" << tick_label(t) << "</text>\n";
  }
  for (double t : y_ticks) {
    os << "<line x1=\"" << kLeft << "\" y1=\"" << py(t) << "\" x2=\"" << kLeft + plot_w << "\" y2=\"" << py(t)
       << "\" stroke=\"#e0e0e0\"/>\n<text x=\"" << kLeft - 8 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">"
       << tick_label(t) << "</text>\n";
  }
  // Axes and their labels.
  os << "<line x1=\"" << kLeft << "\" y1=\"" << kTop + plot_h << "\" x2=\"" << kLeft + plot_w << "\" y2=\""
     << kTop + plot_h << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\"" << kTop + plot_h
     << "\" stroke=\"black\"/>\n"
     << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kHeight - 12 << "\" text-anchor=\"middle\">step</text>\n"
     << "<text x=\"18\" y=\"" << kTop + plot_h / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
     << kTop + plot_h / 2 << ")\">loss</text>\n";
  os << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  bool any = false;
  for (const StepStats& s : history_) {
    if (!std::isfinite(s.loss)) continue;  // a skipped (overflowed) step leaves a gap in value only
    os << (any ? " " : "") << px(static_cast<double>(s.step + 1)) << "," << py(s.loss);
    any = true;
  }
  os << "\"/>\n</svg>\n";

  std::ofstream out(path);
  if (!out.good()) throw std::invalid_argument("[TrainLog] cannot write loss chart \"" + path + "\"");
  out << os.str();
  out.close();
  if (out.fail()) throw std::invalid_argument("[TrainLog] error writing loss chart \"" + path + "\"");
}

std::string TrainLog::write_loss_curve(const std::string& csv_path, const std::string& title) const {
  write_csv(csv_path);
  const size_t slash = csv_path.find_last_of('/');
  const size_t dot = csv_path.find_last_of('.');
  const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string svg_path = (has_extension ? csv_path.substr(0, dot) : csv_path) + ".svg";
  write_svg(svg_path, title);
  return svg_path;
}

}  // namespace dtensor::tools
