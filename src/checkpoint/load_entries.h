// The load of checkpoint::load and checkpoint::import_safetensors (internal): the
// entries of `read_entries()` (a checkpoint's manifest, or a safetensors file's header
// as one-chunk entries without checksums) read into `state`'s targets from files in
// `dir`. Errors name `op` and, for missing entries, `source`.
#pragma once

#include <functional>
#include <string>

#include "checkpoint/manifest.h"
#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint::detail {

// <dir>/manifest.json parsed; std::invalid_argument naming `op` when dir holds none.
ManifestData read_manifest_data(const std::string& dir, const char* op);

LoadStats load_entries(const char* op, const std::string& dir, const std::string& source,
                       const std::function<ManifestData()>& read_entries, StateDict& state, const Group& group,
                       const LoadOptions& options);

}  // namespace dtensor::checkpoint::detail
