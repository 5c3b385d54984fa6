// libFuzzer target: train_gpt's config reader (examples/common/train_config.h) on any
// text. It either returns a config or throws std::invalid_argument (any other
// exception, a crash or a sanitizer report is a bug). What it accepts is a JSON
// object whose every key is in the table; reading the same text again gives the same
// values.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "train_config.h"

using dtensor::tools::TrainConfig;
using dtensor::tools::TrainKey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  TrainConfig config;
  try {
    config = dtensor::tools::parse_train_config(text, "fuzz");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) std::abort();
  for (const auto& item : doc.items()) {
    bool known = false;
    for (const TrainKey& key : dtensor::tools::train_keys()) known = known || item.key() == key.name;
    if (!known) std::abort();
  }
  const TrainConfig again = dtensor::tools::parse_train_config(text, "fuzz");
  for (const TrainKey& key : dtensor::tools::train_keys()) {
    std::visit(
        [&](auto member) {
          if (!(config.*member == again.*member)) std::abort();
        },
        key.member);
  }
  return 0;
}
