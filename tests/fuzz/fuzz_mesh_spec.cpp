// libFuzzer target: parse_mesh_spec ("dp=2,tp=4") on any text. What parses must
// print canonically and parse back to the same spec; what does not must fail with
// std::invalid_argument.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "dtensor/device_mesh.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  dtensor::MeshSpec spec;
  try {
    spec = dtensor::parse_mesh_spec(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  if (spec.shape.empty() || spec.shape.size() != spec.names.size()) std::abort();
  for (int64_t s : spec.shape) {
    if (s < 1) std::abort();
  }
  const std::string printed = spec.to_string();
  const dtensor::MeshSpec again = dtensor::parse_mesh_spec(printed);
  if (again.shape != spec.shape || again.names != spec.names || again.to_string() != printed) std::abort();
  return 0;
}
