// manifest.json of a checkpoint (internal): every entry with every chunk's box, file,
// byte offset and block checksums; numbers and strings inline.
//
//   {"format": "dtensor-checkpoint", "version": 1, "world_size": 4, "block_bytes": 1048576,
//    "checksum": "xxh64",
//    "files": [{"name": "rank-00000.safetensors", "bytes": 4200}],
//    "entries": {
//      "model.w": {"kind": "dist_tensor", "dtype": "f32", "shape": [8, 4], "mesh": "dp=2",
//                  "placements": "S(0)",
//                  "chunks": [{"offsets": [0, 0], "sizes": [4, 4], "file": 0, "begin": 96,
//                              "checksums": ["ef46db3751d8e999"]}, ...]},
//      "train.step": {"kind": "int", "value": 6},
//      "optim.lr": {"kind": "float", "value": 0.0003},      (inf and nan as strings)
//      "note": {"kind": "string", "value": "..."}}}
//
// `begin` is the chunk's byte offset in its file; its length follows from its sizes and
// the dtype. Parsing checks everything a reader relies on (types, known dtypes, boxes
// inside the shape and covering it without overlap, byte ranges inside the files, one
// checksum per block) and throws std::invalid_argument naming the file and the entry.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/plan.h"
#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint::detail {

struct ChunkRecord {
  Box box;
  int64_t file = 0;                 // index into ManifestData::files
  int64_t begin = 0;                // byte offset in the file
  std::vector<uint64_t> checksums;  // XXH64 of each block of the chunk's bytes
};

struct EntryRecord {
  EntryKind kind = EntryKind::Tensor;
  DType dtype = DType::F32;
  Shape shape;
  std::string mesh, placements;  // DistTensor
  std::vector<ChunkRecord> chunks;
  Value value;  // Int, Float, String
  int64_t chunk_bytes(const ChunkRecord& c) const;
};

struct FileRecord {
  std::string name;
  int64_t bytes = 0;
};

struct ManifestData {
  int64_t world_size = 0;
  int64_t block_bytes = 0;
  std::vector<FileRecord> files;
  std::map<std::string, EntryRecord> entries;
};

std::string_view entry_kind_name(EntryKind kind);  // "dist_tensor", "tensor", "int", "float", "string"
// The kind of a state's value (its variant alternative).
EntryKind entry_kind_of(const Value& value);
inline bool is_tensor_kind(EntryKind kind) { return kind == EntryKind::DistTensor || kind == EntryKind::Tensor; }

std::string manifest_to_json(const ManifestData& manifest);
ManifestData parse_manifest(std::string_view json, const std::string& source);

// The public summary of one entry, and of a whole manifest.
EntryInfo entry_info(const EntryRecord& record);
Manifest summarize(const ManifestData& manifest);

}  // namespace dtensor::checkpoint::detail
