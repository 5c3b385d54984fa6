// checkpoint::load: each rank plans the byte ranges its targets need, reads and
// verifies them into host buffers, and only when every rank succeeded are the targets
// written (checkpoint.h). One exchange, at the end.
#include <chrono>
#include <filesystem>
#include <functional>

#include "checkpoint/exchange.h"
#include "checkpoint/files.h"
#include "checkpoint/load_entries.h"
#include "checkpoint/manifest.h"
#include "checkpoint/xxhash.h"
#include "dtensor/autograd.h"
#include "dtensor/checkpoint.h"
#include "util/check.h"

namespace dtensor::checkpoint {

namespace {

namespace fs = std::filesystem;
using namespace detail;
constexpr const char* kOp = "checkpoint::load";

// One target's plan and the host buffer its bytes are read into.
struct Staged {
  std::string name;
  const EntryRecord* record = nullptr;
  Box box;        // the part of the global tensor this rank needs
  Tensor buffer;  // contiguous host tensor of box's shape
};

// A read of one chunk into one staged target.
struct ChunkRead {
  Staged* target = nullptr;
  const ChunkRecord* chunk = nullptr;
  std::vector<ByteRun> runs;
};

const char* kind_text(EntryKind kind) {
  switch (kind) {
    case EntryKind::DistTensor: return "a DistTensor";
    case EntryKind::Tensor: return "a Tensor";
    case EntryKind::Int: return "an integer";
    case EntryKind::Float: return "a float";
    default: return "a string";
  }
}

// Checks a target against its saved entry and returns the box it needs (tensors).
Box check_target(const char* op, const std::string& name, const Value& target, const EntryRecord& saved) {
  const EntryKind want = entry_kind_of(target);
  const bool compatible = is_tensor_kind(want) ? is_tensor_kind(saved.kind) : want == saved.kind;
  DT_CHECK_ARG(compatible, op, "entry '", name, "': the target is ", kind_text(want), ", the checkpoint holds ",
               kind_text(saved.kind));
  if (const auto* d = std::get_if<DistTensor>(&target)) {
    DT_CHECK_ARG(d->defined(), op, "entry '", name, "': the target DistTensor is undefined (it gives the layout)");
    DT_CHECK_ARG(d->dtype() == saved.dtype && d->shape() == saved.shape, op, "entry '", name, "': the target is ",
                 dtype_name(d->dtype()), " ", d->shape(), ", the checkpoint holds ", dtype_name(saved.dtype), " ",
                 saved.shape);
    return block_of(d->shape(), d->mesh().shape(), d->placements(), d->mesh().coordinate());
  }
  if (const auto* t = std::get_if<Tensor>(&target)) {
    DT_CHECK_ARG(!t->defined() || (t->dtype() == saved.dtype && t->shape() == saved.shape), op, "entry '", name,
                 "': the target is ", dtype_name(t->dtype()), " ", t->shape(), ", the checkpoint holds ",
                 dtype_name(saved.dtype), " ", saved.shape);
    return full_box(saved.shape);
  }
  return {};
}

// Where an unstaged load may read a target's bytes directly: its own memory when that is
// a contiguous host tensor holding the value (not a zero of a Partial(sum) dim).
Tensor direct_destination(const Value& target) {
  Tensor local;
  if (const auto* d = std::get_if<DistTensor>(&target)) {
    for (int dim = 0; dim < d->mesh().ndim(); ++dim) {
      if (d->placements()[static_cast<size_t>(dim)].is_partial()) return {};
    }
    local = d->to_local();
  } else if (const auto* t = std::get_if<Tensor>(&target)) {
    local = *t;
  }
  if (!local.defined() || local.device() != Device::cpu() || !local.is_contiguous()) return {};
  return local;
}

// Reads one file's chunk reads, verifying whole blocks when block_bytes > 0.
void read_file_chunks(const char* op, const std::string& dir, const FileRecord& file, std::vector<ChunkRead*>& reads,
                      int64_t block_bytes, LoadStats& stats) {
  const File f(dir + "/" + file.name, "r");
  const int64_t size = f.size();
  DT_CHECK_ARG(size == file.bytes, op, "\"", f.path(), "\" has ", size, " bytes, the manifest says ", file.bytes,
               " (truncated or replaced)");
  stats.files_read.push_back(file.name);
  std::vector<unsigned char> scratch;
  for (ChunkRead* read : reads) {
    const EntryRecord& entry = *read->target->record;
    const ChunkRecord& chunk = *read->chunk;
    const int64_t chunk_bytes = entry.chunk_bytes(chunk);
    auto* dest = static_cast<unsigned char*>(read->target->buffer.data_ptr());
    for (const ByteRun& run : read->runs) stats.bytes_needed += run.length;
    for (const ByteRange& range : read_ranges(read->runs, chunk_bytes, block_bytes)) {
      // A range that is exactly one run goes straight into the buffer.
      const ByteRun* whole = nullptr;
      for (const ByteRun& run : read->runs) {
        if (run.source == range.begin && run.length == range.length()) whole = &run;
      }
      unsigned char* into;
      if (whole) {
        into = dest + whole->destination;
      } else {
        scratch.resize(static_cast<size_t>(range.length()));
        into = scratch.data();
      }
      f.read_at(into, range.length(), chunk.begin + range.begin);
      stats.bytes_read += range.length();
      if (block_bytes > 0) {
        for (int64_t at = range.begin; at < range.end; at += block_bytes) {
          const int64_t n = std::min(block_bytes, chunk_bytes - at);
          const uint64_t sum = xxh64(into + (at - range.begin), static_cast<size_t>(n));
          const int64_t block = at / block_bytes;
          DT_CHECK_ARG(sum == chunk.checksums[static_cast<size_t>(block)], op, "\"", f.path(), "\", entry '",
                       read->target->name, "': checksum mismatch in block ", block, " (file bytes ", chunk.begin + at,
                       "-", chunk.begin + at + n, "): the file is corrupted");
        }
      }
      if (whole) continue;
      for (const ByteRun& run : read->runs) {
        const int64_t begin = std::max(run.source, range.begin), end = std::min(run.source + run.length, range.end);
        if (begin >= end) continue;
        std::memcpy(dest + run.destination + (begin - run.source), into + (begin - range.begin),
                    static_cast<size_t>(end - begin));
      }
    }
  }
}

// Writes the staged values into the targets (after every rank succeeded).
void commit(StateDict& state, std::vector<Staged>& staged, const ManifestData& manifest) {
  NoGradGuard no_grad;
  for (Staged& s : staged) {
    Value& target = state.at(s.name);
    if (auto* d = std::get_if<DistTensor>(&target)) {
      Tensor local = d->to_local();
      // Partial(sum) dims keep the value on coordinate 0 and zeros elsewhere (the
      // creation rule of dist_tensor.h); the other Partial ops hold it everywhere.
      bool zero = false;
      for (int dim = 0; dim < d->mesh().ndim(); ++dim) {
        const Placement& p = d->placements()[static_cast<size_t>(dim)];
        zero = zero || (p.is_partial() && p.reduce_op() == ReduceOp::Sum && d->mesh().coordinate(dim) != 0);
      }
      if (zero) {
        local.fill_(0);
      } else if (local.data_ptr() != s.buffer.data_ptr()) {
        local.copy_(s.buffer);
      }
    } else if (auto* t = std::get_if<Tensor>(&target)) {
      if (t->defined()) {
        if (t->data_ptr() != s.buffer.data_ptr()) Tensor(*t).copy_(s.buffer);
      } else {
        *t = s.buffer;
      }
    }
  }
  for (auto& [name, target] : state) {
    const auto it = manifest.entries.find(name);
    if (it != manifest.entries.end() && !is_tensor_kind(it->second.kind)) target = it->second.value;
  }
}

}  // namespace

Manifest read_manifest(const std::string& dir) { return summarize(read_manifest_data(dir, "checkpoint")); }

namespace detail {

ManifestData read_manifest_data(const std::string& dir, const char* op) {
  const std::string path = dir + "/manifest.json";
  DT_CHECK_ARG(fs::exists(path), op, "\"", dir, "\" holds no checkpoint (no manifest.json)");
  return parse_manifest(read_file(path), path);
}

LoadStats load_entries(const char* op, const std::string& dir, const std::string& source,
                       const std::function<ManifestData()>& read_entries, StateDict& state, const Group& group,
                       const LoadOptions& options) {
  DT_CHECK_ARG(group.defined(), op, "the group is undefined");
  const auto start = std::chrono::steady_clock::now();
  LoadStats stats;
  ManifestData manifest;
  std::vector<Staged> staged;
  Outcome mine = Outcome::ok("");
  try {
    manifest = read_entries();
    // Plan: every target's box, the chunks it meets, grouped by file.
    staged.reserve(state.size());
    for (const auto& [name, target] : state) {
      const auto it = manifest.entries.find(name);
      if (it == manifest.entries.end()) {
        stats.missing.push_back(name);
        continue;
      }
      const EntryRecord& saved = it->second;
      const Box box = check_target(op, name, target, saved);
      if (is_tensor_kind(saved.kind)) {
        const Tensor direct = options.staged ? Tensor() : direct_destination(target);
        staged.push_back({name, &saved, box, direct.defined() ? direct : Tensor::empty(box_shape(box), saved.dtype)});
      }
    }
    if (!options.allow_missing && !stats.missing.empty()) {
      std::string names;
      for (size_t i = 0; i < stats.missing.size() && i < 5; ++i) names += (i ? ", '" : "'") + stats.missing[i] + "'";
      if (stats.missing.size() > 5) names += ", ... (" + std::to_string(stats.missing.size()) + " in all)";
      throw std::invalid_argument(
          ::dtensor::detail::concat("[", op, "] \"", source, "\" has no entry ", names,
                                    " (LoadOptions::allow_missing keeps such targets as they are)"));
    }
    std::vector<ChunkRead> reads;
    for (Staged& s : staged) {
      const int64_t element = static_cast<int64_t>(dtype_size(s.record->dtype));
      for (const ChunkRecord& chunk : s.record->chunks) {
        const std::optional<Box> part = intersect(chunk.box, s.box);
        if (!part) continue;
        reads.push_back({&s, &chunk, byte_runs(chunk.box, s.box, *part, element)});
      }
    }
    std::map<int64_t, std::vector<ChunkRead*>> by_file;
    for (ChunkRead& r : reads) by_file[r.chunk->file].push_back(&r);
    for (auto& [file, file_reads] : by_file) {
      read_file_chunks(op, dir, manifest.files[static_cast<size_t>(file)], file_reads,
                       options.verify ? manifest.block_bytes : 0, stats);
    }
  } catch (...) {
    mine = Outcome::current_failure();
  }
  throw_first_failure(exchange(group, mine), group.rank());
  commit(state, staged, manifest);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace detail

LoadStats load(const std::string& dir, StateDict& state, const Group& group, const LoadOptions& options) {
  return load_entries(
      kOp, dir, dir, [&] { return read_manifest_data(dir, kOp); }, state, group, options);
}

}  // namespace dtensor::checkpoint
