// manifest.json: writing and strict parsing (manifest.h).
#include "checkpoint/manifest.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "checkpoint/xxhash.h"
#include "util/check.h"

namespace dtensor::checkpoint::detail {

namespace {

using json = nlohmann::json;
constexpr const char* kOp = "checkpoint";
constexpr const char* kFormat = "dtensor-checkpoint";
constexpr int64_t kVersion = 1;

constexpr std::pair<EntryKind, std::string_view> kKinds[] = {
    {EntryKind::DistTensor, "dist_tensor"},
    {EntryKind::Tensor, "tensor"},
    {EntryKind::Int, "int"},
    {EntryKind::Float, "float"},
    {EntryKind::String, "string"},
};

json float_to_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// Field access that names the place of a missing or mistyped field.
class Fields {
 public:
  Fields(const json& object, std::string where) : object_(object), where_(std::move(where)) {
    DT_CHECK_ARG(object.is_object(), kOp, where_, ": expected a JSON object");
  }
  const json& at(const char* key) const {
    DT_CHECK_ARG(object_.contains(key), kOp, where_, ": missing \"", key, "\"");
    return object_[key];
  }
  // In [min, max]: byte counts and offsets stay far from overflowing when added.
  int64_t integer(const char* key, int64_t min = 0, int64_t max = int64_t{1} << 60) const {
    const json& v = at(key);
    DT_CHECK_ARG(v.is_number_integer() && v.get<int64_t>() >= min && v.get<int64_t>() <= max, kOp, where_, ": \"", key,
                 "\" must be an integer in [", min, ", ", max, "]");
    return v.get<int64_t>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    DT_CHECK_ARG(v.is_string(), kOp, where_, ": \"", key, "\" must be a string");
    return v.get<std::string>();
  }
  std::vector<int64_t> integers(const char* key) const {
    const json& v = at(key);
    DT_CHECK_ARG(v.is_array(), kOp, where_, ": \"", key, "\" must be an array of integers");
    std::vector<int64_t> out;
    for (const json& x : v) {
      DT_CHECK_ARG(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < (int64_t{1} << 48), kOp, where_,
                   ": \"", key, "\" must hold non-negative integers");
      out.push_back(x.get<int64_t>());
    }
    return out;
  }
  const std::string& where() const { return where_; }

 private:
  const json& object_;
  std::string where_;
};

void check_chunks(const EntryRecord& e, const ManifestData& m, const std::string& where) {
  int64_t covered = 0;
  for (size_t i = 0; i < e.chunks.size(); ++i) {
    const ChunkRecord& c = e.chunks[i];
    DT_CHECK_ARG(c.box.size() == e.shape.size(), kOp, where, ": chunk ", i, " has ", c.box.size(), " dims, the shape ",
                 e.shape.size());
    for (size_t d = 0; d < c.box.size(); ++d) {
      DT_CHECK_ARG(c.box[d].length > 0 && c.box[d].end() <= e.shape[d], kOp, where, ": chunk ", i,
                   " does not lie inside shape ", e.shape, " (dim ", d, ": offset ", c.box[d].offset, ", size ",
                   c.box[d].length, ")");
    }
    DT_CHECK_ARG(c.file >= 0 && c.file < static_cast<int64_t>(m.files.size()), kOp, where, ": chunk ", i,
                 " names file ", c.file, ", the manifest lists ", m.files.size());
    const int64_t bytes = e.chunk_bytes(c);
    DT_CHECK_ARG(c.begin + bytes <= m.files[static_cast<size_t>(c.file)].bytes, kOp, where, ": chunk ", i, " (bytes ",
                 c.begin, "-", c.begin + bytes, ") lies outside ", m.files[static_cast<size_t>(c.file)].name, " (",
                 m.files[static_cast<size_t>(c.file)].bytes, " bytes)");
    DT_CHECK_ARG(static_cast<int64_t>(c.checksums.size()) == block_count(bytes, m.block_bytes), kOp, where, ": chunk ",
                 i, " has ", c.checksums.size(), " checksums, its ", bytes, " bytes make ",
                 block_count(bytes, m.block_bytes), " blocks");
    covered += box_numel(c.box);
    // Pairwise overlap (bounded: past a few hundred chunks only the count is checked).
    if (e.chunks.size() <= 256) {
      for (size_t j = 0; j < i; ++j) {
        DT_CHECK_ARG(!intersect(c.box, e.chunks[j].box), kOp, where, ": chunks ", j, " and ", i, " overlap");
      }
    }
  }
  DT_CHECK_ARG(covered == shape_numel(e.shape), kOp, where, ": the chunks hold ", covered, " elements, shape ", e.shape,
               " has ", shape_numel(e.shape));
}

}  // namespace

int64_t EntryRecord::chunk_bytes(const ChunkRecord& c) const {
  return box_numel(c.box) * static_cast<int64_t>(dtype_size(dtype));
}

EntryKind entry_kind_of(const Value& value) {
  // The order of the alternatives in checkpoint::Value.
  constexpr EntryKind kinds[] = {EntryKind::DistTensor, EntryKind::Tensor, EntryKind::Int, EntryKind::Float,
                                 EntryKind::String};
  return kinds[value.index()];
}

std::string_view entry_kind_name(EntryKind kind) {
  for (const auto& [k, name] : kKinds) {
    if (k == kind) return name;
  }
  return "tensor";
}

std::string manifest_to_json(const ManifestData& m) {
  json files = json::array();
  for (const FileRecord& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  json entries = json::object();
  for (const auto& [name, e] : m.entries) {
    json j = {{"kind", entry_kind_name(e.kind)}};
    if (is_tensor_kind(e.kind)) {
      j["dtype"] = dtype_name(e.dtype);
      j["shape"] = e.shape;
      if (e.kind == EntryKind::DistTensor) {
        j["mesh"] = e.mesh;
        j["placements"] = e.placements;
      }
      json chunks = json::array();
      for (const ChunkRecord& c : e.chunks) {
        json offsets = json::array(), sizes = json::array(), sums = json::array();
        for (const Range& r : c.box) {
          offsets.push_back(r.offset);
          sizes.push_back(r.length);
        }
        for (uint64_t s : c.checksums) sums.push_back(hex64(s));
        chunks.push_back(
            {{"offsets", offsets}, {"sizes", sizes}, {"file", c.file}, {"begin", c.begin}, {"checksums", sums}});
      }
      j["chunks"] = chunks;
    } else if (e.kind == EntryKind::Int) {
      j["value"] = std::get<int64_t>(e.value);
    } else if (e.kind == EntryKind::Float) {
      j["value"] = float_to_json(std::get<double>(e.value));
    } else {
      j["value"] = std::get<std::string>(e.value);
    }
    entries[name] = j;
  }
  const json out = {
      {"format", kFormat},   {"version", kVersion}, {"world_size", m.world_size}, {"block_bytes", m.block_bytes},
      {"checksum", "xxh64"}, {"files", files},      {"entries", entries}};
  return out.dump(1) + "\n";
}

ManifestData parse_manifest(std::string_view text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(::dtensor::detail::concat("[", kOp, "] ", source, ": not valid JSON (", e.what(), ")"));
  }
  const Fields top(root, source);
  DT_CHECK_ARG(top.string("format") == kFormat, kOp, source, ": \"format\" is not \"", kFormat, "\"");
  const int64_t version = top.integer("version");
  DT_CHECK_ARG(version == kVersion, kOp, source, ": version ", version, ", this build reads version ", kVersion);
  DT_CHECK_ARG(top.string("checksum") == "xxh64", kOp, source, ": unknown \"checksum\" (expected \"xxh64\")");
  ManifestData m;
  m.world_size = top.integer("world_size", 1);
  m.block_bytes = top.integer("block_bytes", 1, int64_t{1} << 40);
  const json& files = top.at("files");
  DT_CHECK_ARG(files.is_array(), kOp, source, ": \"files\" must be an array");
  for (size_t i = 0; i < files.size(); ++i) {
    const Fields f(files[i], source + ", files[" + std::to_string(i) + "]");
    FileRecord record{f.string("name"), f.integer("bytes")};
    // Plain names inside the checkpoint directory only.
    DT_CHECK_ARG(
        !record.name.empty() && record.name.find('/') == std::string::npos && record.name != "." && record.name != "..",
        kOp, f.where(), ": \"", record.name, "\" is not a file name");
    m.files.push_back(std::move(record));
  }
  const json& entries = top.at("entries");
  DT_CHECK_ARG(entries.is_object(), kOp, source, ": \"entries\" must be an object");
  for (const auto& [name, value] : entries.items()) {
    const Fields f(value, source + ", entry \"" + name + "\"");
    EntryRecord e;
    const std::string kind = f.string("kind");
    bool known = false;
    for (const auto& [k, n] : kKinds) {
      if (n == kind) {
        e.kind = k;
        known = true;
      }
    }
    DT_CHECK_ARG(known, kOp, f.where(), ": unknown kind \"", kind, "\"");
    if (is_tensor_kind(e.kind)) {
      try {
        e.dtype = parse_dtype(f.string("dtype"));
      } catch (const std::invalid_argument&) {
        throw std::invalid_argument(
            ::dtensor::detail::concat("[", kOp, "] ", f.where(), ": unknown dtype \"", f.string("dtype"), "\""));
      }
      e.shape = f.integers("shape");
      // Elements at most 2^56 (checked before each product: no overflow for any input),
      // so every chunk's byte count fits with room to spare.
      int64_t numel = 1;
      for (int64_t size : e.shape) {
        DT_CHECK_ARG(size == 0 || numel <= (int64_t{1} << 56) / size, kOp, f.where(), ": shape ", e.shape,
                     " is too large");
        numel *= size;
      }
      if (e.kind == EntryKind::DistTensor) {
        e.mesh = f.string("mesh");
        e.placements = f.string("placements");
      }
      const json& chunks = f.at("chunks");
      DT_CHECK_ARG(chunks.is_array(), kOp, f.where(), ": \"chunks\" must be an array");
      for (size_t i = 0; i < chunks.size(); ++i) {
        const Fields c(chunks[i], f.where() + ", chunk " + std::to_string(i));
        ChunkRecord chunk;
        const std::vector<int64_t> offsets = c.integers("offsets"), sizes = c.integers("sizes");
        DT_CHECK_ARG(offsets.size() == sizes.size(), kOp, c.where(), ": offsets and sizes differ in length");
        for (size_t d = 0; d < offsets.size(); ++d) chunk.box.push_back({offsets[d], sizes[d]});
        chunk.file = c.integer("file");
        chunk.begin = c.integer("begin");
        const json& sums = c.at("checksums");
        DT_CHECK_ARG(sums.is_array(), kOp, c.where(), ": \"checksums\" must be an array");
        for (const json& s : sums) {
          uint64_t v = 0;
          DT_CHECK_ARG(s.is_string() && parse_hex64(s.get<std::string>(), v), kOp, c.where(),
                       ": a checksum is not 16 hex digits");
          chunk.checksums.push_back(v);
        }
        e.chunks.push_back(std::move(chunk));
      }
      check_chunks(e, m, f.where());
    } else {
      const json& v = f.at("value");
      if (e.kind == EntryKind::Int) {
        DT_CHECK_ARG(v.is_number_integer(), kOp, f.where(), ": \"value\" must be an integer");
        e.value = v.get<int64_t>();
      } else if (e.kind == EntryKind::Float) {
        if (v.is_number()) {
          e.value = v.get<double>();
        } else {
          DT_CHECK_ARG(v == "nan" || v == "inf" || v == "-inf", kOp, f.where(),
                       ": \"value\" must be a number, \"nan\", \"inf\" or \"-inf\"");
          const std::string s = v.get<std::string>();
          e.value = s == "nan" ? std::nan("") : s == "inf" ? HUGE_VAL : -HUGE_VAL;
        }
      } else {
        DT_CHECK_ARG(v.is_string(), kOp, f.where(), ": \"value\" must be a string");
        e.value = v.get<std::string>();
      }
    }
    m.entries.emplace(name, std::move(e));
  }
  return m;
}

Manifest summarize(const ManifestData& manifest) {
  Manifest out;
  out.world_size = manifest.world_size;
  for (const auto& [name, e] : manifest.entries) out.entries[name] = entry_info(e);
  return out;
}

EntryInfo entry_info(const EntryRecord& record) {
  EntryInfo info;
  info.kind = record.kind;
  info.dtype = record.dtype;
  info.shape = record.shape;
  info.mesh = record.mesh;
  info.placements = record.placements;
  info.chunks = static_cast<int64_t>(record.chunks.size());
  if (!is_tensor_kind(record.kind)) info.value = record.value;
  return info;
}

}  // namespace dtensor::checkpoint::detail
