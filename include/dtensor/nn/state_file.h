// Named tensors in a file: a model's parameters (state_dict()) with a few metadata
// strings (its configuration), written by one training run and read by another
// program (examples/train_gpt --save, examples/generate --load).
//
//   nn::save_state_file("gpt.dtstate", model.state_dict(), {{"layers", "4"}});
//   nn::StateFile f = nn::load_state_file("gpt.dtstate");
//   model.load_state_dict(f.tensors);
//
// The format (version 1), little-endian throughout:
//   "DTSTATE\0"                 8 bytes of magic
//   u32 version                 1
//   u64 n, then n entries       metadata: u32 length + key bytes, u32 length + value bytes
//   u64 n, then n entries       tensors: u32 length + name bytes, u8 dtype (DType's
//                               value), u8 ndim, ndim x i64 sizes, u64 byte count, the
//                               elements in row-major order
//   u64 checksum                FNV-1a 64 of every byte before it
// Names are unique and sorted (std::map order). Loading checks the magic, the version,
// every length against what is left, each dtype, each byte count against the shape,
// the checksum and that nothing follows it, and throws std::invalid_argument naming
// the file and what is wrong.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "dtensor/tensor.h"

namespace dtensor::nn {

struct StateFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// The file's bytes (tensors are copied from any device and layout to contiguous CPU).
std::string serialize_state(const std::map<std::string, Tensor>& tensors,
                            const std::map<std::string, std::string>& metadata = {});
// `source` names the bytes in errors (a path).
StateFile deserialize_state(std::string_view bytes, const std::string& source = "<bytes>");

// Writes through a temporary file renamed into place, so a reader never sees half a file.
void save_state_file(const std::string& path, const std::map<std::string, Tensor>& tensors,
                     const std::map<std::string, std::string>& metadata = {});
StateFile load_state_file(const std::string& path);

}  // namespace dtensor::nn
