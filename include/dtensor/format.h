// Numbers for people: the progress lines and charts of the tools (examples/common)
// and the pipeline timeline chart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {

// "12.3 MiB", "512 B", "1.50 GiB".
std::string format_bytes(int64_t bytes);
// "45.2k", "1.23M", "980".
std::string format_count(double value);
// Round tick values covering [lo, hi] with about `target` ticks (1-2-5 steps).
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

}  // namespace dtensor
