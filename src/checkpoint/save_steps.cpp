// The steps of a save that save() and AsyncSaver share (save_steps.h).
#include "checkpoint/save_steps.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/files.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/xxhash.h"
#include "dtensor/autograd.h"
#include "util/check.h"

namespace dtensor::checkpoint::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kOp = "checkpoint::save";

// What one rank gives for one entry.
struct Given {
  int rank = 0;
  EntryKind kind = EntryKind::Tensor;
  DType dtype = DType::F32;
  Shape shape;
  std::string mesh, placements;
  std::vector<int> mesh_ranks;  // DistTensor: world ranks of its mesh, row-major
  Shape mesh_shape;
  std::vector<int64_t> coordinate;  // DistTensor: this rank's
  Value value;                      // numbers and strings
};

}  // namespace

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.safetensors", rank);
  return name;
}

namespace {

json value_to_json(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) {
    // Exact round trip: the bits as an integer.
    int64_t bits;
    std::memcpy(&bits, d, sizeof bits);
    return bits;
  }
  return std::get<std::string>(v);
}

Value value_from_json(EntryKind kind, const json& j) {
  if (kind == EntryKind::Int) return j.get<int64_t>();
  if (kind == EntryKind::Float) {
    const int64_t bits = j.get<int64_t>();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  return j.get<std::string>();
}

Tensor host_copy(const Tensor& t, bool copy);

// The tensors this rank writes, ready on the host: Partial mesh dims reduced first.
// Collective over each DistTensor's mesh (every member gives the same entries), so it
// runs before anything that could fail on one rank alone.
std::map<std::string, Tensor> host_pieces(const StateDict& state, bool copy) {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> pieces;
  for (const auto& [name, value] : state) {
    if (const auto* d = std::get_if<DistTensor>(&value)) {
      if (!d->defined() || !d->mesh().is_member()) continue;  // reported by describe()
      DistTensor t = *d;
      bool partial = false;
      Placements reduced = t.placements();
      for (Placement& p : reduced) {
        if (p.is_partial()) {
          p = Replicate();
          partial = true;
        }
      }
      if (partial) t = t.redistribute(reduced);
      pieces[name] = host_copy(t.to_local(), copy && !partial);
    } else if (const auto* t = std::get_if<Tensor>(&value)) {
      if (t->defined()) pieces[name] = host_copy(*t, copy);
    }
  }
  return pieces;
}

// A contiguous host tensor with `t`'s values: `t` itself where it already is one,
// unless the caller needs a copy it can keep while `t` changes.
Tensor host_copy(const Tensor& t, bool copy) {
  const Tensor host = t.to(Device::cpu()).contiguous();
  return copy && host.shares_storage(t) ? host.clone() : host;
}

// Exchange 1's payload: what this rank gives.
std::string describe(const StateDict& state, const Group& group) {
  json entries = json::array();
  for (const auto& [name, value] : state) {
    json e = {{"name", name}, {"kind", entry_kind_name(entry_kind_of(value))}};
    if (const auto* d = std::get_if<DistTensor>(&value)) {
      DT_CHECK_ARG(d->defined(), kOp, "entry '", name, "' is an undefined DistTensor");
      DT_CHECK_ARG(d->mesh().world() == group, kOp, "entry '", name, "' lives on mesh ", d->mesh().to_string(),
                   " over another group than the one saving (pass the world group its mesh was built from)");
      DT_CHECK_ARG(d->mesh().is_member(), kOp, "entry '", name, "' lives on mesh ", d->mesh().to_string(),
                   ", which this rank is not in (give each rank only the tensors it holds)");
      e["dtype"] = dtype_name(d->dtype());
      e["shape"] = d->shape();
      e["mesh"] = d->mesh().to_string();
      e["mesh_ranks"] = d->mesh().ranks();
      e["mesh_shape"] = d->mesh().shape();
      e["coordinate"] = d->mesh().coordinate();
      e["placements"] = placements_to_string(d->placements());
    } else if (const auto* t = std::get_if<Tensor>(&value)) {
      DT_CHECK_ARG(t->defined(), kOp, "entry '", name, "' is an undefined Tensor");
      e["dtype"] = dtype_name(t->dtype());
      e["shape"] = t->shape();
    } else {
      e["value"] = value_to_json(value);
    }
    entries.push_back(std::move(e));
  }
  return entries.dump();
}

std::map<std::string, std::vector<Given>> parse_given(const std::vector<Outcome>& outcomes) {
  std::map<std::string, std::vector<Given>> given;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    for (const json& e : json::parse(outcomes[r].text)) {
      Given g;
      g.rank = static_cast<int>(r);
      const std::string kind = e["kind"].get<std::string>();
      for (EntryKind k :
           {EntryKind::DistTensor, EntryKind::Tensor, EntryKind::Int, EntryKind::Float, EntryKind::String}) {
        if (entry_kind_name(k) == kind) g.kind = k;
      }
      if (is_tensor_kind(g.kind)) {
        g.dtype = parse_dtype(e["dtype"].get<std::string>());
        g.shape = e["shape"].get<Shape>();
      }
      if (g.kind == EntryKind::DistTensor) {
        g.mesh = e["mesh"].get<std::string>();
        g.mesh_ranks = e["mesh_ranks"].get<std::vector<int>>();
        g.mesh_shape = e["mesh_shape"].get<Shape>();
        g.coordinate = e["coordinate"].get<std::vector<int64_t>>();
        g.placements = e["placements"].get<std::string>();
      } else if (!is_tensor_kind(g.kind)) {
        g.value = value_from_json(g.kind, e["value"]);
      }
      given[e["name"].get<std::string>()].push_back(std::move(g));
    }
  }
  return given;
}

// Numbers and strings compare by value (floats by their bits, so NaN equals NaN).
bool same_scalar(const Value& a, const Value& b) {
  if (a.index() != b.index()) return false;
  if (const auto* i = std::get_if<int64_t>(&a)) return *i == std::get<int64_t>(b);
  if (const auto* d = std::get_if<double>(&a)) {
    return std::memcmp(d, &std::get<double>(b), sizeof(double)) == 0;
  }
  return std::get<std::string>(a) == std::get<std::string>(b);
}

std::string describe_value(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return ::dtensor::detail::concat(*d);
  return "\"" + std::get<std::string>(v) + "\"";
}

std::map<std::string, Resolved> resolve(const std::map<std::string, std::vector<Given>>& given) {
  std::map<std::string, Resolved> out;
  for (const auto& [name, list] : given) {
    const Given& first = list.front();  // the lowest rank (outcomes are in rank order)
    for (const Given& g : list) {
      DT_CHECK_ARG(g.kind == first.kind, kOp, "entry '", name, "' is a ", entry_kind_name(first.kind), " on rank ",
                   first.rank, " and a ", entry_kind_name(g.kind), " on rank ", g.rank);
      if (is_tensor_kind(g.kind)) {
        DT_CHECK_ARG(g.dtype == first.dtype && g.shape == first.shape, kOp, "entry '", name, "' is ",
                     dtype_name(first.dtype), " ", first.shape, " on rank ", first.rank, " and ", dtype_name(g.dtype),
                     " ", g.shape, " on rank ", g.rank);
      } else {
        DT_CHECK_ARG(same_scalar(g.value, first.value), kOp, "entry '", name, "' is ", describe_value(first.value),
                     " on rank ", first.rank, " and ", describe_value(g.value), " on rank ", g.rank,
                     " (numbers and strings must be equal on the ranks that give them)");
      }
    }
    Resolved r;
    r.record.kind = first.kind;
    r.record.dtype = first.dtype;
    r.record.shape = first.shape;
    r.record.value = first.value;
    if (first.kind == EntryKind::DistTensor) {
      // Written from the mesh of the lowest rank that gives it (a tied weight lives on
      // two meshes; their values are equal).
      r.record.mesh = first.mesh;
      r.record.placements = first.placements;
      const Placements placements = parse_placements(first.placements);
      for (const Given& g : list) {
        if (g.mesh_ranks == first.mesh_ranks && writes_block(g.shape, g.mesh_shape, placements, g.coordinate)) {
          r.writers.insert(g.rank);
        }
      }
    } else if (first.kind == EntryKind::Tensor && shape_numel(first.shape) > 0) {
      r.writers.insert(first.rank);
    }
    out.emplace(name, std::move(r));
  }
  return out;
}

}  // namespace

std::map<std::string, Resolved> resolve_given(const std::vector<Outcome>& given) { return resolve(parse_given(given)); }

std::string write_rank_file(const std::string& tmp, int rank, const std::map<std::string, Resolved>& resolved,
                            const std::map<std::string, Tensor>& pieces, const std::map<std::string, Box>& boxes,
                            int64_t block_bytes, SaveStats& stats) {
  std::vector<SafetensorsTensor> tensors;
  std::vector<const Tensor*> data;
  for (const auto& [name, r] : resolved) {
    if (!r.writers.count(rank)) continue;
    const Tensor& piece = pieces.at(name);
    tensors.push_back({name, piece.dtype(), piece.shape(), 0, 0});
    data.push_back(&piece);
  }
  json chunks = json::array();
  if (tensors.empty()) return json{{"bytes", 0}, {"chunks", chunks}}.dump();
  const std::string header = make_safetensors_header(tensors, {{"format", "dtensor"}});
  File file(tmp + "/" + rank_file_name(rank), "w");
  file.write_all(header.data(), static_cast<int64_t>(header.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto* bytes = static_cast<const unsigned char*>(data[i]->data_ptr());
    const int64_t n = static_cast<int64_t>(data[i]->nbytes());
    json sums = json::array();
    for (int64_t at = 0; at < n; at += block_bytes) {
      sums.push_back(hex64(xxh64(bytes + at, static_cast<size_t>(std::min(block_bytes, n - at)))));
    }
    file.write_all(bytes, n);
    const Box& box = boxes.at(tensors[i].name);
    json offsets = json::array(), sizes = json::array();
    for (const Range& r : box) {
      offsets.push_back(r.offset);
      sizes.push_back(r.length);
    }
    chunks.push_back({{"name", tensors[i].name},
                      {"begin", static_cast<int64_t>(header.size()) + tensors[i].begin},
                      {"offsets", offsets},
                      {"sizes", sizes},
                      {"checksums", sums}});
    ++stats.chunks_written;
  }
  file.sync();
  stats.bytes_written = file.size();
  return json{{"bytes", stats.bytes_written}, {"chunks", chunks}}.dump();
}

ManifestData assemble(const std::map<std::string, Resolved>& resolved, const std::vector<std::string>& written,
                      int64_t world_size, int64_t block_bytes) {
  ManifestData m;
  m.world_size = world_size;
  m.block_bytes = block_bytes;
  for (const auto& [name, r] : resolved) m.entries[name] = r.record;
  for (size_t rank = 0; rank < written.size(); ++rank) {
    const json w = json::parse(written[rank]);
    if (w["chunks"].empty()) continue;
    const int64_t file = static_cast<int64_t>(m.files.size());
    m.files.push_back({rank_file_name(static_cast<int>(rank)), w["bytes"].get<int64_t>()});
    for (const json& c : w["chunks"]) {
      ChunkRecord chunk;
      const auto offsets = c["offsets"].get<std::vector<int64_t>>();
      const auto sizes = c["sizes"].get<std::vector<int64_t>>();
      for (size_t d = 0; d < offsets.size(); ++d) chunk.box.push_back({offsets[d], sizes[d]});
      chunk.file = file;
      chunk.begin = c["begin"].get<int64_t>();
      for (const json& s : c["checksums"]) {
        uint64_t v = 0;
        parse_hex64(s.get<std::string>(), v);
        chunk.checksums.push_back(v);
      }
      m.entries.at(c["name"].get<std::string>()).chunks.push_back(std::move(chunk));
    }
  }
  return m;
}

void commit(const std::string& tmp, const std::string& dir, bool overwrite) {
  sync_directory(tmp);  // the files' names (each file was fsynced by its writer)
  const std::string old = dir + ".old";
  if (fs::exists(dir)) {
    DT_CHECK_ARG(overwrite, kOp, "\"", dir, "\" already exists (SaveOptions::overwrite replaces it)");
    fs::remove_all(old);
    fs::rename(dir, old);
  }
  fs::rename(tmp, dir);
  sync_directory(parent_directory(dir));
  fs::remove_all(old);
}

SaveInput take_save_input(const StateDict& state, const Group& group, bool copy) {
  SaveInput in;
  in.pieces = host_pieces(state, copy);
  try {
    in.described = Outcome::ok(describe(state, group));
    for (const auto& [name, value] : state) {
      if (const auto* d = std::get_if<DistTensor>(&value)) {
        in.boxes[name] = block_of(d->shape(), d->mesh().shape(), d->placements(), d->mesh().coordinate());
      } else if (const auto* t = std::get_if<Tensor>(&value)) {
        in.boxes[name] = full_box(t->shape());
      }
    }
  } catch (...) {
    in.described = Outcome::current_failure();
  }
  return in;
}

void prepare_directory(const std::string& dir, bool overwrite) {
  DT_CHECK_ARG(overwrite || !fs::exists(dir), kOp, "\"", dir, "\" already exists (SaveOptions::overwrite replaces it)");
  const std::string tmp = dir + ".tmp";
  fs::remove_all(tmp);  // a crashed save's leftovers
  fs::create_directories(tmp);
}

std::vector<Outcome> exchange_descriptions(const std::string& dir, const SaveInput& input, const Group& group,
                                           bool overwrite) {
  Outcome mine = input.described;
  if (group.rank() == 0 && !mine.failed()) {
    try {
      prepare_directory(dir, overwrite);
    } catch (...) {
      mine = Outcome::current_failure();
    }
  }
  std::vector<Outcome> given = exchange(group, mine);
  throw_first_failure(given, group.rank());
  return given;
}

void remove_temporary(const std::string& dir) {
  std::error_code ignored;
  fs::remove_all(dir + ".tmp", ignored);
}

void finish_save(const std::string& dir, const std::map<std::string, Resolved>& resolved,
                 const std::vector<std::string>& written, int64_t world_size, const SaveOptions& options) {
  const std::string tmp = dir + ".tmp";
  try {
    const ManifestData m = assemble(resolved, written, world_size, options.block_bytes);
    write_file(tmp + "/manifest.json", manifest_to_json(m));
    fault_point("manifest", 0);
    commit(tmp, dir, options.overwrite);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  fault_point("committed", 0);
}

}  // namespace dtensor::checkpoint::detail
