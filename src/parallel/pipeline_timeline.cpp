// Timelines of pipeline steps (simulated or measured): busy time, the bubble fraction,
// the SVG picture and Chrome trace JSON.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "dtensor/error.h"
#include "dtensor/format.h"
#include "dtensor/parallel/pipeline_schedule.h"
#include "util/check.h"

namespace dtensor::parallel {
namespace {

// Fill colours per compute kind, and the legend's names.
const char* colour_of(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "#4c78a8";
    case ActionKind::Backward: return "#54a24b";
    case ActionKind::BackwardInput: return "#72b7b2";
    case ActionKind::BackwardWeight: return "#f58518";
    default: return "#9d755d";
  }
}

void write_file(const std::string& path, const std::string& text, const char* op) {
  std::ofstream out(path);
  DT_CHECK_ARG(out.good(), op, "cannot write '", path, "'");
  out << text;
  DT_CHECK_ARG(out.good(), op, "writing '", path, "' failed");
}

// Seconds as the axis shows them.
std::string time_label(double seconds, double span) {
  std::ostringstream os;
  os.precision(3);
  if (span < 1e-3) {
    os << seconds * 1e6 << " us";
  } else if (span < 1.0) {
    os << seconds * 1e3 << " ms";
  } else {
    os << seconds << " s";
  }
  return os.str();
}

// Text safe inside SVG and JSON strings (titles are plain words, parentheses and numbers).
std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

double Timeline::makespan() const {
  double end = 0;
  for (const auto& rank : entries) {
    for (const TimelineEntry& e : rank) end = std::max(end, e.end);
  }
  return end;
}

double Timeline::busy(int rank) const {
  double total = 0;
  for (const TimelineEntry& e : entries.at(static_cast<size_t>(rank))) {
    if (e.action.is_compute()) total += e.end - e.start;
  }
  return total;
}

double Timeline::bubble_fraction() const {
  const double span = makespan();
  if (span <= 0 || ranks < 1) return 0;
  double busy_total = 0;
  for (int r = 0; r < ranks; ++r) busy_total += busy(r);
  return 1.0 - busy_total / (span * ranks);
}

std::string Timeline::to_svg() const {
  constexpr double kLeft = 70, kRight = 20, kTop = 48, kRow = 34, kGap = 8, kWidth = 1000;
  const double span = std::max(makespan(), 1e-12);
  // Ranks holding several stages (interleaving) label bars "micro/chunk".
  bool chunks = false;
  for (const auto& rank : entries) {
    for (const TimelineEntry& e : rank) chunks |= e.action.stage >= ranks;
  }
  const double plot_w = kWidth - kLeft - kRight;
  const double height = kTop + ranks * (kRow + kGap) + 70;
  auto px = [&](double t) { return kLeft + plot_w * t / span; };
  std::ostringstream os;
  os.precision(6);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
     << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::ostringstream heading;
  heading.precision(3);
  heading << title << " | step " << time_label(span, span) << " | bubble " << 100.0 * bubble_fraction() << "%";
  os << "<text x=\"" << kWidth / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">" << escaped(heading.str())
     << "</text>\n";
  for (int r = 0; r < ranks; ++r) {
    const double y = kTop + r * (kRow + kGap);
    os << "<text x=\"" << kLeft - 8 << "\" y=\"" << y + kRow / 2 + 4 << "\" text-anchor=\"end\">rank " << r
       << "</text>\n<rect x=\"" << kLeft << "\" y=\"" << y << "\" width=\"" << plot_w << "\" height=\"" << kRow
       << "\" fill=\"#f4f4f4\"/>\n";
    for (const TimelineEntry& e : entries[static_cast<size_t>(r)]) {
      const double x0 = px(e.start), x1 = px(e.end);
      if (e.action.is_compute()) {
        os << "<rect x=\"" << x0 << "\" y=\"" << y << "\" width=\"" << std::max(x1 - x0, 0.5) << "\" height=\""
           << kRow << "\" fill=\"" << colour_of(e.action.kind) << "\" stroke=\"white\" stroke-width=\"0.5\"><title>"
           << e.action.to_string() << " " << time_label(e.start, span) << " - " << time_label(e.end, span)
           << "</title></rect>\n";
        // The micro-batch number where it fits (stage too when a rank holds several).
        const std::string label = chunks ? std::to_string(e.action.micro) + "/" + std::to_string(e.action.stage / ranks)
                                         : std::to_string(e.action.micro);
        if (x1 - x0 >= 7.0 * static_cast<double>(label.size())) {
          os << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << y + kRow / 2 + 4
             << "\" text-anchor=\"middle\" fill=\"white\">" << label << "</text>\n";
        }
      } else {
        // A transfer: a tick at the top (send) or the bottom (receive) of the row.
        const double y0 = e.action.is_send() ? y : y + kRow - 6;
        os << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"1\" height=\"6\" fill=\"" << colour_of(e.action.kind)
           << "\"><title>" << e.action.to_string() << "</title></rect>\n";
      }
    }
  }
  // Time axis.
  const double axis_y = kTop + ranks * (kRow + kGap);
  for (double t : nice_ticks(0, span, 8)) {
    if (t < 0 || t > span * 1.0001) continue;
    os << "<line x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << axis_y << "\" y2=\"" << axis_y + 5
       << "\" stroke=\"black\"/>\n<text x=\"" << px(t) << "\" y=\"" << axis_y + 17 << "\" text-anchor=\"middle\">"
       << time_label(t, span) << "</text>\n";
  }
  // Legend.
  double lx = kLeft;
  const double ly = axis_y + 34;
  const std::pair<ActionKind, const char*> legend[] = {{ActionKind::Forward, "forward"},
                                                        {ActionKind::Backward, "backward"},
                                                        {ActionKind::BackwardInput, "backward (input)"},
                                                        {ActionKind::BackwardWeight, "backward (weight)"},
                                                        {ActionKind::SendActivation, "send / receive"}};
  for (const auto& [kind, name] : legend) {
    os << "<rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"12\" height=\"12\" fill=\"" << colour_of(kind)
       << "\"/>\n<text x=\"" << lx + 16 << "\" y=\"" << ly + 10 << "\">" << name << "</text>\n";
    lx += 30 + 7.0 * static_cast<double>(std::string(name).size());
  }
  os << "<rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"12\" height=\"12\" fill=\"#f4f4f4\" stroke=\"#ccc\"/>\n"
     << "<text x=\"" << lx + 16 << "\" y=\"" << ly + 10 << "\">idle (bubble)</text>\n</svg>\n";
  return os.str();
}

std::string Timeline::to_chrome_trace() const {
  std::ostringstream os;
  os.precision(15);
  os << "{\"traceEvents\":[";
  bool first = true;
  for (int r = 0; r < ranks; ++r) {
    os << (first ? "" : ",") << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << r << ",\"tid\":" << r
       << ",\"args\":{\"name\":\"rank " << r << "\"}}";
    first = false;
    for (const TimelineEntry& e : entries[static_cast<size_t>(r)]) {
      const bool compute = e.action.is_compute();
      os << ",{\"name\":\"" << e.action.to_string() << "\",\"cat\":\"" << (compute ? "pipeline" : "comm")
         << "\",\"ph\":\"X\",\"ts\":" << e.start * 1e6 << ",\"dur\":" << (e.end - e.start) * 1e6
         << ",\"pid\":" << r << ",\"tid\":" << r << "}";
    }
  }
  os << "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"title\":\"" << escaped(title) << "\",\"bubble_fraction\":"
     << bubble_fraction() << "}}\n";
  return os.str();
}

void Timeline::write_svg(const std::string& path) const { write_file(path, to_svg(), "Timeline::write_svg"); }

void Timeline::write_chrome_trace(const std::string& path) const {
  write_file(path, to_chrome_trace(), "Timeline::write_chrome_trace");
}

}  // namespace dtensor::parallel
