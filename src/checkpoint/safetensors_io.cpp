// One safetensors file for a whole state: export without gathering, import onto any
// layout (checkpoint.h).
#include <cstdio>
#include <filesystem>

#include "checkpoint/exchange.h"
#include "checkpoint/files.h"
#include "checkpoint/load_entries.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save_steps.h"
#include "util/check.h"

namespace dtensor::checkpoint {

using namespace detail;
namespace fs = std::filesystem;

namespace {

constexpr const char* kExport = "checkpoint::export_safetensors";
constexpr const char* kImport = "checkpoint::import_safetensors";

const std::string& file_name_of(const NameMap& names, const std::string& name) {
  const auto it = names.find(name);
  return it == names.end() ? name : it->second;
}

std::string value_text(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    char text[40];
    std::snprintf(text, sizeof(text), "%.17g", *d);
    return text;
  }
  return std::get<std::string>(v);
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Runs `step` on this rank and agrees on the outcome (every rank throws the first failure).
template <class F>
void agreed(const Group& group, F&& step) {
  Outcome mine = Outcome::ok("");
  try {
    step();
  } catch (...) {
    mine = Outcome::current_failure();
  }
  throw_first_failure(exchange(group, mine), group.rank());
}

}  // namespace

void export_safetensors(const std::string& path, const StateDict& state, const Group& group,
                        const ExportOptions& options) {
  DT_CHECK_ARG(group.defined(), kExport, "the group is undefined");
  DT_CHECK_ARG(!path.empty(), kExport, "the path is empty");
  const int rank = group.rank();
  const std::string tmp = path + ".tmp";
  SaveInput input = take_save_input(state, group, /*copy=*/false);
  Outcome mine = input.described;
  if (rank == 0 && !mine.failed()) {
    try {
      DT_CHECK_ARG(options.overwrite || !fs::exists(path), kExport, "\"", path,
                   "\" already exists (ExportOptions::overwrite replaces it)");
    } catch (...) {
      mine = Outcome::current_failure();
    }
  }
  const std::vector<Outcome> given = exchange(group, mine);
  throw_first_failure(given, rank);
  // The same header on every rank: the tensors in the order of their names in the file,
  // numbers and strings as text.
  const std::map<std::string, Resolved> resolved = resolve_given(given);
  std::map<std::string, std::string> entry_of;  // name in the file -> entry name
  std::map<std::string, std::string> metadata = options.metadata;
  for (const auto& [name, r] : resolved) {
    const std::string& file_name = file_name_of(options.names, name);
    DT_CHECK_ARG(!entry_of.count(file_name) && !metadata.count(file_name) && file_name != "__metadata__", kExport,
                 "entry '", name, "' would be \"", file_name, "\" in the file, a name already taken");
    if (r.record.kind == EntryKind::DistTensor || r.record.kind == EntryKind::Tensor) {
      entry_of[file_name] = name;
    } else {
      metadata[file_name] = value_text(r.record.value);
    }
  }
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [file_name, name] : entry_of) {
    tensors.push_back({file_name, resolved.at(name).record.dtype, resolved.at(name).record.shape, 0, 0});
  }
  const std::string header = make_safetensors_header(tensors, metadata);
  const int64_t data_offset = static_cast<int64_t>(header.size());
  const int64_t total = data_offset + (tensors.empty() ? 0 : tensors.back().end);

  // Rank 0 makes the file at its full size; then every rank writes its blocks in place.
  agreed(group, [&] {
    if (rank != 0) return;
    File f(tmp, "w");
    f.write_all(header.data(), data_offset);
    f.resize(total);
  });
  try {
    agreed(group, [&] {
      File f(tmp, "u");
      for (size_t i = 0; i < tensors.size(); ++i) {
        const std::string& name = entry_of.at(tensors[i].name);
        if (!resolved.at(name).writers.count(rank)) continue;
        const Tensor& piece = input.pieces.at(name);
        const Box& box = input.boxes.at(name);
        const auto* bytes = static_cast<const unsigned char*>(piece.data_ptr());
        for (const ByteRun& run :
             byte_runs(box, full_box(tensors[i].shape), box, static_cast<int64_t>(dtype_size(tensors[i].dtype)))) {
          f.write_at(bytes + run.source, run.length, data_offset + tensors[i].begin + run.destination);
        }
      }
      f.sync();
    });
    agreed(group, [&] {
      if (rank != 0) return;
      fs::rename(tmp, path);
      sync_directory(parent_directory(path));
    });
  } catch (...) {
    if (rank == 0) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
    }
    throw;
  }
}

LoadStats import_safetensors(const std::string& path, StateDict& state, const Group& group,
                             const ImportOptions& options) {
  // The file's header as one-chunk entries under the targets' names.
  const auto read_entries = [&] {
    const File f(path, "r");
    const int64_t size = f.size();
    unsigned char first8[8] = {};
    DT_CHECK_ARG(size >= 8, kImport, "\"", path, "\" has ", size, " bytes: not a safetensors file");
    f.read_at(first8, 8, 0);
    const int64_t n = safetensors_header_length(first8, size, path);
    std::string json(static_cast<size_t>(n), '\0');
    f.read_at(json.data(), n, 8);
    const SafetensorsHeader header = parse_safetensors_header(json, size, path);
    std::map<std::string, const SafetensorsTensor*> by_name;
    for (const SafetensorsTensor& t : header.tensors) by_name[t.name] = &t;
    ManifestData m;
    m.world_size = 1;
    m.files = {{base_name(path), size}};
    for (const auto& [name, target] : state) {
      const auto it = by_name.find(file_name_of(options.names, name));
      if (it == by_name.end()) continue;
      const SafetensorsTensor& t = *it->second;
      EntryRecord e;
      e.kind = EntryKind::Tensor;
      e.dtype = t.dtype;
      e.shape = t.shape;
      if (shape_numel(t.shape) > 0) e.chunks.push_back({full_box(t.shape), 0, header.data_offset + t.begin, {}});
      m.entries.emplace(name, std::move(e));
    }
    return m;
  };
  return load_entries(kImport, parent_directory(path), path, read_entries, state, group,
                      {.allow_missing = options.allow_missing, .verify = false, .staged = options.staged});
}

}  // namespace dtensor::checkpoint
