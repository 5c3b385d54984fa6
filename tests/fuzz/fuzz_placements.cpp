// libFuzzer target: parse_placements on any text. What parses must print and parse
// back to the same placements; what does not must fail with std::invalid_argument.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "dtensor/placement.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  dtensor::Placements placements;
  try {
    placements = dtensor::parse_placements(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const std::string printed = dtensor::placements_to_string(placements);
  if (dtensor::parse_placements(printed) != placements) std::abort();
  if (dtensor::placements_to_string(dtensor::parse_placements(printed)) != printed) std::abort();
  return 0;
}
