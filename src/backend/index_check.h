// The range check of index operands (embedding ids, cross-entropy targets), shared by
// the CPU kernels and the CUDA entries so that both devices raise one message
// (internal).
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/check.h"

namespace dtensor::backend {

// std::invalid_argument "[op] <what> <id> at position <position> is outside [0, limit)".
inline void check_index(int64_t id, int64_t limit, size_t position, const char* op, const char* what) {
  DT_CHECK_ARG(id >= 0 && id < limit, op, what, " ", id, " at position ", position, " is outside [0, ", limit, ")");
}

}  // namespace dtensor::backend
