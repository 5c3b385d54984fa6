// libFuzzer target: the JSON config reader on any text. What parses must dump and
// parse back to the same compact text, and typed access must either answer or fail
// with std::invalid_argument; what does not parse must fail with std::invalid_argument.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "dtensor/config.h"

namespace {

template <class F>
void typed(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  dtensor::JsonValue value;
  try {
    value = dtensor::parse_json(text, "fuzz");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const std::string dumped = value.dump();
  if (dtensor::parse_json(dumped, "dump").dump() != dumped) std::abort();
  if (!value.is_object()) return 0;
  const dtensor::Config config = dtensor::Config::parse(text, "fuzz");
  for (const auto& member : value.as_object()) {
    const std::string& key = member.first;  // Clang 14 cannot capture structured bindings
    typed([&] { config.get_int(key, 0); });
    typed([&] { config.get_double(key, 0.0); });
    typed([&] { config.get_bool(key, false); });
    typed([&] { config.get_string(key, ""); });
    typed([&] { config.get_object(key); });
  }
  typed([&] { config.unknown_keys({"steps", "optimizer"}); });
  return 0;
}
