// Numbers for people: byte sizes, counts, axis ticks.
#include "dtensor/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dtensor {

namespace {

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  return printf_string(value < 10 ? "%.2f" : "%.1f", value) + " " + units[unit];
}

std::string format_count(double value) {
  if (!std::isfinite(value)) return "-";
  if (value >= 1e9) return printf_string("%.2fG", value / 1e9);
  if (value >= 1e6) return printf_string("%.2fM", value / 1e6);
  if (value >= 1e3) return printf_string("%.1fk", value / 1e3);
  return printf_string("%.0f", value);
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {  // a single value: one tick around it
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const int exponent = static_cast<int>(std::floor(std::log10(raw)));
  const double magnitude = std::pow(10.0, exponent);
  double multiple = 1;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    multiple = m;
    if (m * magnitude >= raw) break;
  }
  // Tick k is k * multiple * 10^exponent; for negative exponents dividing by 10^-exponent
  // keeps labels exact (0.6, not 0.6000000000000001).
  const double scale = std::pow(10.0, std::abs(exponent));
  auto tick = [&](int64_t k) {
    const double units = static_cast<double>(k) * multiple;
    return exponent < 0 ? units / scale : units * scale;
  };
  const double step = multiple * magnitude;
  std::vector<double> ticks;
  for (auto k = static_cast<int64_t>(std::ceil(lo / step - 1e-9)); tick(k) <= hi + step * 1e-9; ++k) {
    ticks.push_back(tick(k));
  }
  return ticks;
}

}  // namespace dtensor
