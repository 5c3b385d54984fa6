// XXH64 (Yann Collet's xxHash, 64-bit variant, seed 0 by default): the checksum of
// checkpoint data blocks (internal). Fast (several GB/s per core, well above disk
// speed) and standard, so a checkpoint's blocks can be verified with any xxHash tool
// (Python: xxhash.xxh64(data).hexdigest()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtensor::checkpoint::detail {

uint64_t xxh64(const void* data, size_t length, uint64_t seed = 0);
// 16 lower-case hex digits, as xxhash's hexdigest() prints it.
std::string hex64(uint64_t value);
// The inverse of hex64; false when `text` is not 16 hex digits.
bool parse_hex64(const std::string& text, uint64_t& value);

}  // namespace dtensor::checkpoint::detail
