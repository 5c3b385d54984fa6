// The safetensors header (internal): the format of every checkpoint data file.
//
// A safetensors file is: u64 little-endian N; N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...,
//    "__metadata__": {"<key>": "<value>"}}
// padded with spaces so that the data starts at a multiple of 8; then the tensors'
// bytes, row-major, little-endian, with offsets relative to the data start, contiguous
// from 0 and without holes. Any safetensors reader opens a checkpoint's files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/dtype.h"
#include "dtensor/error.h"
#include "dtensor/tensor.h"

namespace dtensor::checkpoint::detail {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  int64_t begin = 0;  // bytes, relative to the data section
  int64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  int64_t data_offset = 0;  // 8 + N: where the data section starts in the file
};

// "F32", "BF16", "I64", "BOOL", ...
std::string_view safetensors_dtype(DType dtype);
// The dtype of a safetensors name; throws std::invalid_argument naming it (and the
// names dtensor reads) when dtensor has no such dtype (F8_E4M3, U8, ...).
DType parse_safetensors_dtype(std::string_view name, const std::string& where);

// The header bytes (length word, JSON, padding) for `tensors` laid out in order from
// data offset 0 (their begin/end are filled in), with `metadata`.
std::string make_safetensors_header(std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata);

// Parses the N JSON bytes of a header of a file of `file_bytes` bytes. Checks what
// the format requires (a JSON object of tensor entries with known dtypes, shapes and
// offsets that match, contiguous from 0 and ending at the file's end) and throws
// std::invalid_argument naming `source` and the problem.
SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t file_bytes, const std::string& source);
// The N of the first 8 bytes, checked against the file size and the 100 MB limit.
int64_t safetensors_header_length(const unsigned char* first8, int64_t file_bytes, const std::string& source);

}  // namespace dtensor::checkpoint::detail
