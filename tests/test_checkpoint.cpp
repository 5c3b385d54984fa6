// Distributed checkpoints: the shard arithmetic, the file formats, round trips between
// every pair of layouts and world sizes, errors and crashes during a save, the series of
// checkpoints of a run, and resuming training on the same mesh and on another.
#include "dtensor/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/plan.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/xxhash.h"
#include "dtensor/amp.h"
#include "dtensor/data.h"
#include "dtensor/models/gpt.h"
#include "dtensor/models/gpt_parallel.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/ddp.h"
#include "dtensor/parallel/fsdp.h"
#include "dtensor/parallel/tensor_parallel.h"
#include "dtensor/parallel/trainer.h"
#include "mesh/mesh_index.h"
#include "parallel_equivalence.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace dtensor::checkpoint;
namespace fs = std::filesystem;
namespace ckd = dtensor::checkpoint::detail;

namespace {

using dtensor::testing::ScratchDir;  // a fresh directory per test, removed afterwards

// Every element of a local tensor equals `value`.
bool all_equal(const Tensor& t, double value) {
  for (double v : t.to(DType::F64).to_vector<double>()) {
    if (v != value) return false;
  }
  return true;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// ---- shard arithmetic -------------------------------------------------------------------

using ckd::Box;
using ckd::ByteRun;

TEST(CheckpointPlan, WorkedExampleOfTheHeader) {
  // [4, 6] f32 saved S(0) on 2 ranks, loaded S(1) on 3: load rank 1 needs columns 2-3.
  const Box dest = ckd::block_of({4, 6}, {3}, {Shard(1)}, {1});
  EXPECT_EQ(dest, (Box{{0, 4}, {2, 2}}));
  const Box chunk0 = ckd::block_of({4, 6}, {2}, {Shard(0)}, {0});
  const Box chunk1 = ckd::block_of({4, 6}, {2}, {Shard(0)}, {1});
  EXPECT_EQ(ckd::byte_runs(chunk0, dest, *ckd::intersect(chunk0, dest), 4),
            (std::vector<ByteRun>{{8, 0, 8}, {32, 8, 8}}));
  EXPECT_EQ(ckd::byte_runs(chunk1, dest, *ckd::intersect(chunk1, dest), 4),
            (std::vector<ByteRun>{{8, 16, 8}, {32, 24, 8}}));
}

// For random layouts: every distinct block is written once, and the runs from the saved
// chunks put every element of any target block in its place exactly once.
TEST(CheckpointPlan, RunsReassembleEveryTargetBlockFromTheWrittenChunks) {
  const std::vector<std::pair<Shape, Placements>> layouts{
      {{1}, {Replicate()}},
      {{2}, {Shard(0)}},
      {{3}, {Shard(1)}},
      {{4}, {Shard(0)}},
      {{2, 2}, {Shard(0), Shard(1)}},
      {{2, 3}, {Shard(1), Shard(1)}},
      {{2, 2}, {Shard(0, 1), Shard(0)}},
      {{2, 2}, {Replicate(), Partial()}},
      {{2, 1, 3}, {Shard(2), Shard(0), Replicate()}},
  };
  const std::vector<Shape> shapes{{7, 5, 3}, {1, 9, 2}, {5, 1, 1}, {0, 3, 2}, {3, 4, 8}};
  for (const Shape& shape : shapes) {
    // The global tensor holds its own linear index.
    for (const auto& [save_mesh, save_p] : layouts) {
      std::vector<Box> chunks;
      const int64_t n = shape_numel(save_mesh);
      int64_t covered = 0;
      for (int64_t r = 0; r < n; ++r) {
        const auto c = mesh_index::coordinate_of(r, save_mesh);
        if (!ckd::writes_block(shape, save_mesh, save_p, c)) continue;
        chunks.push_back(ckd::block_of(shape, save_mesh, save_p, c));
        covered += ckd::box_numel(chunks.back());
      }
      EXPECT_EQ(covered, shape_numel(shape)) << "each element written once";
      for (const auto& [load_mesh, load_p] : layouts) {
        for (int64_t r = 0; r < shape_numel(load_mesh); ++r) {
          const Box dest = ckd::block_of(shape, load_mesh, load_p, mesh_index::coordinate_of(r, load_mesh));
          std::vector<int64_t> got(static_cast<size_t>(ckd::box_numel(dest)), -1);
          for (const Box& chunk : chunks) {
            const auto part = ckd::intersect(chunk, dest);
            if (!part) continue;
            // The chunk's bytes: global linear indices of its elements, row-major.
            std::vector<int64_t> bytes;
            dtensor::testing::for_each_index(ckd::box_shape(chunk), [&](const std::vector<int64_t>& i) {
              int64_t linear = 0;
              for (size_t d = 0; d < shape.size(); ++d) linear = linear * shape[d] + chunk[d].offset + i[d];
              bytes.push_back(linear);
            });
            for (const ByteRun& run : ckd::byte_runs(chunk, dest, *part, 8)) {
              for (int64_t k = 0; k < run.length / 8; ++k) {
                int64_t& slot = got[static_cast<size_t>(run.destination / 8 + k)];
                EXPECT_EQ(slot, -1) << "an element written twice";
                slot = bytes[static_cast<size_t>(run.source / 8 + k)];
              }
            }
          }
          size_t k = 0;
          dtensor::testing::for_each_index(ckd::box_shape(dest), [&](const std::vector<int64_t>& i) {
            int64_t linear = 0;
            for (size_t d = 0; d < shape.size(); ++d) linear = linear * shape[d] + dest[d].offset + i[d];
            EXPECT_EQ(got[k++], linear) << "shape " << shape_to_string(shape);
          });
        }
      }
    }
  }
}

TEST(CheckpointPlan, ReadRangesWidenToWholeBlocksAndMerge) {
  const std::vector<ByteRun> runs{{10, 0, 5}, {300, 5, 10}, {40, 15, 20}};
  EXPECT_EQ(ckd::read_ranges(runs, 350, 0), (std::vector<ckd::ByteRange>{{10, 15}, {40, 60}, {300, 310}}));
  EXPECT_EQ(ckd::read_ranges(runs, 350, 64), (std::vector<ckd::ByteRange>{{0, 64}, {256, 320}}));
  EXPECT_EQ(ckd::block_count(0, 64), 0);
  EXPECT_EQ(ckd::block_count(64, 64), 1);
  EXPECT_EQ(ckd::block_count(65, 64), 2);
}

// ---- file formats ------------------------------------------------------------------------

TEST(CheckpointFormat, Xxh64MatchesTheReferenceImplementation) {
  // Values printed by Python's xxhash package (xxhash.xxh64(data).hexdigest()).
  std::string pattern;
  for (int i = 0; i < 768; ++i) pattern.push_back(static_cast<char>(i % 256));
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", "ef46db3751d8e999"},
      {"a", "d24ec4f1a98c6e5b"},
      {"abc", "44bc2cf5ad770999"},
      {pattern, "8e03c838c596036f"},
      {std::string(31, 'x'), "60dd0d01083b99f0"},
      {std::string(32, 'y') + std::string(5, 'z'), "bba127ff6dd886e3"},
  };
  for (const auto& [data, hex] : cases) {
    EXPECT_EQ(ckd::hex64(ckd::xxh64(data.data(), data.size())), hex) << data.size() << " bytes";
    uint64_t parsed = 0;
    EXPECT_TRUE(ckd::parse_hex64(hex, parsed));
    EXPECT_EQ(ckd::hex64(parsed), hex);
  }
  uint64_t v = 0;
  EXPECT_FALSE(ckd::parse_hex64("ABCDEF0123456789", v));
  EXPECT_FALSE(ckd::parse_hex64("123", v));
}

TEST(CheckpointFormat, SafetensorsHeaderRoundTripsAndAligns) {
  std::vector<ckd::SafetensorsTensor> tensors{
      {"w", DType::F32, {2, 3}, 0, 0}, {"b", DType::BF16, {5}, 0, 0}, {"s", DType::I64, {}, 0, 0}};
  const std::string header = ckd::make_safetensors_header(tensors, {{"format", "dtensor"}});
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(tensors[1].begin, 24);
  EXPECT_EQ(tensors[2].end, 24 + 10 + 8);
  const int64_t file_bytes = static_cast<int64_t>(header.size()) + tensors[2].end;
  const int64_t n =
      ckd::safetensors_header_length(reinterpret_cast<const unsigned char*>(header.data()), file_bytes, "f");
  EXPECT_EQ(n + 8, static_cast<int64_t>(header.size()));
  const ckd::SafetensorsHeader parsed =
      ckd::parse_safetensors_header(std::string_view(header).substr(8), file_bytes, "f");
  ASSERT_EQ(parsed.tensors.size(), 3u);
  EXPECT_EQ(parsed.tensors[1].name, "b");
  EXPECT_EQ(parsed.tensors[1].dtype, DType::BF16);
  EXPECT_EQ(parsed.tensors[2].shape, Shape{});
  EXPECT_EQ(parsed.metadata.at("format"), "dtensor");
  EXPECT_THROW_MSG(ckd::parse_safetensors_header(std::string_view(header).substr(8), file_bytes - 1, "f.st"),
                   std::invalid_argument, "f.st: the tensors end at byte");
}

TEST(CheckpointFormat, SafetensorsParserRejectsWhatTheFormatForbids) {
  const auto parse = [](const std::string& json) { return ckd::parse_safetensors_header(json, 8 + 64 + 8, "x"); };
  EXPECT_THROW_MSG(parse("[1]"), std::invalid_argument, "not a JSON object");
  EXPECT_THROW_MSG(parse("{\"a\": {\"dtype\": \"F8_E4M3\", \"shape\": [1], \"data_offsets\": [0, 1]}}"),
                   std::invalid_argument, "F8_E4M3");
  EXPECT_THROW_MSG(parse("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}"),
                   std::invalid_argument, "hold 4 bytes");
  EXPECT_THROW_MSG(parse("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}"),
                   std::invalid_argument, "expected 0");
  EXPECT_THROW_MSG(parse("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}"),
                   std::invalid_argument, "non-negative");
  EXPECT_THROW_MSG(parse("{\"a\": 3}"), std::invalid_argument, "expected {");
  const unsigned char huge[8] = {0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_THROW_MSG(ckd::safetensors_header_length(huge, 100, "x"), std::invalid_argument, "does not fit");
}

// A safetensors file written by Python's safetensors package (numpy), committed:
// tests/data/python_written.safetensors (see tests/data/README.md).
TEST(CheckpointFormat, ParsesAFileThePythonPackageWrote) {
  const std::string path = std::string(DTENSOR_TEST_DATA_DIR) + "/python_written.safetensors";
  const std::string bytes = ckd::read_file(path);
  const int64_t n = ckd::safetensors_header_length(reinterpret_cast<const unsigned char*>(bytes.data()),
                                                   static_cast<int64_t>(bytes.size()), path);
  const ckd::SafetensorsHeader h = ckd::parse_safetensors_header(
      std::string_view(bytes).substr(8, static_cast<size_t>(n)), static_cast<int64_t>(bytes.size()), path);
  std::map<std::string, ckd::SafetensorsTensor> by_name;
  for (const auto& t : h.tensors) by_name[t.name] = t;
  ASSERT_EQ(by_name.size(), 3u);
  EXPECT_EQ(by_name.at("weight").shape, (Shape{2, 3}));
  EXPECT_EQ(by_name.at("weight").dtype, DType::F32);
  EXPECT_EQ(by_name.at("ids").dtype, DType::I64);
  EXPECT_EQ(by_name.at("half").dtype, DType::F16);
  // weight = arange(6) as f32.
  std::vector<float> w(6);
  std::memcpy(w.data(), bytes.data() + h.data_offset + by_name.at("weight").begin, 24);
  EXPECT_EQ(w, (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST(CheckpointFormat, ManifestRoundTripsAndRejectsBrokenOnes) {
  ckd::ManifestData m;
  m.world_size = 2;
  m.block_bytes = 8;
  m.files = {{"rank-00000.safetensors", 200}};
  ckd::EntryRecord w;
  w.kind = EntryKind::DistTensor;
  w.dtype = DType::F32;
  w.shape = {2, 4};
  w.mesh = "dp=2";
  w.placements = "S(0)";
  w.chunks = {{{{0, 1}, {0, 4}}, 0, 64, {1, 2}}, {{{1, 1}, {0, 4}}, 0, 80, {3}}};
  w.chunks[1].checksums = {3, 4};
  m.entries["w"] = w;
  ckd::EntryRecord nan_value;
  nan_value.kind = EntryKind::Float;
  nan_value.value = std::nan("");
  m.entries["x"] = nan_value;
  ckd::EntryRecord s;
  s.kind = EntryKind::String;
  s.value = std::string("hi \"there\"");
  m.entries["s"] = s;
  const std::string json = ckd::manifest_to_json(m);
  const ckd::ManifestData back = ckd::parse_manifest(json, "m.json");
  EXPECT_EQ(back.entries.at("w").chunks[0].box, w.chunks[0].box);
  EXPECT_EQ(back.entries.at("w").chunks[0].checksums, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(std::isnan(std::get<double>(back.entries.at("x").value)));
  EXPECT_EQ(std::get<std::string>(back.entries.at("s").value), "hi \"there\"");

  const auto broken = [&](const std::string& from, const std::string& to) {
    std::string j = json;
    const size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return j.replace(at, from.size(), to);
  };
  EXPECT_THROW_MSG(ckd::parse_manifest("{", "m.json"), std::invalid_argument, "m.json: not valid JSON");
  EXPECT_THROW_MSG(ckd::parse_manifest(broken("\"version\": 1", "\"version\": 7"), "m.json"), std::invalid_argument,
                   "version 7");
  EXPECT_THROW_MSG(ckd::parse_manifest(broken("\"bytes\": 200", "\"bytes\": 90"), "m.json"), std::invalid_argument,
                   "lies outside rank-00000.safetensors");
  EXPECT_THROW_MSG(ckd::parse_manifest(broken("\"dtype\": \"f32\"", "\"dtype\": \"f8\""), "m.json"),
                   std::invalid_argument, "entry \"w\": unknown dtype");
  EXPECT_THROW_MSG(ckd::parse_manifest(broken("\"shape\": [\n    2,", "\"shape\": [\n    3,"), "m.json"),
                   std::invalid_argument, "the chunks hold 8 elements");
  EXPECT_THROW_MSG(ckd::parse_manifest(broken("\"rank-00000.safetensors\"", "\"../etc/passwd\""), "m.json"),
                   std::invalid_argument, "is not a file name");
}

// ---- round trips between layouts --------------------------------------------------------

struct Layout {
  std::string name;
  Shape mesh;
  Placements placements;  // of the 2-D entry "a"; 1-D entries use Shard(0) where "a" shards
};

std::vector<Layout> round_trip_layouts() {
  return {
      {"1", {1}, {Replicate()}},
      {"2 S(0)", {2}, {Shard(0)}},
      {"2 S(1)", {2}, {Shard(1)}},
      {"2 P", {2}, {Partial()}},
      {"3 S(0)", {3}, {Shard(0)}},
      {"4 S(1)", {4}, {Shard(1)}},
      {"2x2 S(0),S(1)", {2, 2}, {Shard(0), Shard(1)}},
      {"2x2 S(0,order=1),S(0)", {2, 2}, {Shard(0, 1), Shard(0)}},
      {"2x2 R,P", {2, 2}, {Replicate(), Partial()}},
      {"2x2x2 S(1),R,S(0)", {2, 2, 2}, {Shard(1), Replicate(), Shard(0)}},
  };
}

// The 1-D entry's placements: Shard(0) where "a" is sharded on that mesh dim.
Placements one_dim(const Placements& p) {
  Placements out;
  for (const Placement& x : p) out.push_back(x.is_shard() ? Shard(0) : x);
  return out;
}

TEST(CheckpointRoundTrip, EveryPairOfLayoutsAndWorldSizesIsBitExact) {
  ScratchDir dir;
  const Tensor a = Tensor::randn({7, 5}, 11);
  const Tensor b = Tensor::randn({6}, 12).to(DType::BF16);
  const Tensor e = Tensor::zeros({0, 3});
  const std::vector<Layout> layouts = round_trip_layouts();
  for (size_t s = 0; s < layouts.size(); ++s) {
    const Layout& from = layouts[s];
    launch(static_cast<int>(shape_numel(from.mesh)), [&](Group world) {
      DeviceMesh mesh(world, from.mesh);
      StateDict state{{"a", distribute(a, mesh, from.placements)},
                      {"b", distribute(b, mesh, one_dim(from.placements))},
                      {"e", distribute(e, mesh, from.placements)},
                      {"scalar", Tensor::scalar(2.5)},
                      {"count", int64_t{world.size()}},
                      {"ratio", 0.1},
                      {"note", std::string("layout ") + from.name}};
      save(dir / std::to_string(s), state, world);
    });
  }
  for (size_t s = 0; s < layouts.size(); ++s) {
    const Layout& from = layouts[s];
    const Manifest manifest = read_manifest(dir / std::to_string(s));
    EXPECT_EQ(manifest.world_size, shape_numel(from.mesh));
    EXPECT_EQ(manifest.entries.at("a").placements, placements_to_string(from.placements));
    for (size_t t = 0; t < layouts.size(); ++t) {
      const Layout& to = layouts[t];
      // Half the pairs read straight into the targets (LoadOptions::staged off).
      const bool staged = (s + t) % 2 == 0;
      SCOPED_TRACE("saved " + from.name + ", loaded " + to.name + (staged ? "" : ", unstaged"));
      std::mutex mu;
      launch(static_cast<int>(shape_numel(to.mesh)), [&](Group world) {
        DeviceMesh mesh(world, to.mesh);
        StateDict state{{"a", zeros({7, 5}, mesh, to.placements)},
                        {"b", zeros({6}, mesh, one_dim(to.placements), DType::BF16)},
                        {"e", zeros({0, 3}, mesh, to.placements)},
                        {"scalar", Tensor()},
                        {"count", int64_t{0}},
                        {"ratio", 0.0},
                        {"note", std::string()}};
        const LoadStats stats = load(dir / std::to_string(s), state, world, {.verify = false, .staged = staged});
        const Tensor got_a = std::get<DistTensor>(state["a"]).full_tensor();
        const Tensor got_b = std::get<DistTensor>(state["b"]).full_tensor();
        // What this rank needs: its blocks of a and b (a Partial target needs the value
        // on every coordinate, zeroed afterwards where the creation rule says so).
        const auto& placements = to.placements;
        const int64_t need = ckd::box_numel(ckd::block_of({7, 5}, to.mesh, placements, mesh.coordinate())) * 4 +
                             ckd::box_numel(ckd::block_of({6}, to.mesh, one_dim(placements), mesh.coordinate())) * 2 +
                             8;
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(bitwise_equal(got_a, a));
        EXPECT_TRUE(bitwise_equal(got_b, b));
        EXPECT_TRUE(bitwise_equal(std::get<Tensor>(state["scalar"]), Tensor::scalar(2.5)));
        EXPECT_EQ(std::get<int64_t>(state["count"]), shape_numel(from.mesh));
        EXPECT_EQ(std::get<double>(state["ratio"]), 0.1);
        EXPECT_EQ(std::get<std::string>(state["note"]), "layout " + from.name);
        EXPECT_EQ(stats.bytes_needed, need);
        EXPECT_EQ(stats.bytes_read, need) << "without verification exactly the bytes needed";
      });
    }
  }
}

// A rank opens only the files holding chunks it needs; with verification it reads whole
// 1 MiB blocks, here the whole chunks.
TEST(CheckpointRoundTrip, EachRankReadsOnlyTheFilesItNeeds) {
  ScratchDir dir;
  const Tensor a = Tensor::randn({8, 4}, 3);
  launch(4, [&](Group world) {
    DeviceMesh mesh(world, {4});
    save(dir / "c", {{"a", distribute(a, mesh, {Shard(0)})}}, world);
  });
  std::vector<LoadStats> stats(2);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    StateDict state{{"a", zeros({8, 4}, mesh, {Shard(0)})}};
    stats[static_cast<size_t>(world.rank())] = load(dir / "c", state, world);
  });
  EXPECT_EQ(stats[0].files_read, (std::vector<std::string>{"rank-00000.safetensors", "rank-00001.safetensors"}));
  EXPECT_EQ(stats[1].files_read, (std::vector<std::string>{"rank-00002.safetensors", "rank-00003.safetensors"}));
  EXPECT_EQ(stats[0].bytes_needed, 64);
  EXPECT_EQ(stats[0].bytes_read, 64);
}

TEST(CheckpointRoundTrip, ReplicatedEntriesAreWrittenOnce) {
  ScratchDir dir;
  launch(4, [&](Group world) {
    DeviceMesh mesh(world, {2, 2});
    StateDict state{{"r", distribute(Tensor::ones({3, 3}), mesh, {Replicate(), Replicate()})},
                    {"t", Tensor::ones({2})}};
    save(dir / "c", state, world);
  });
  EXPECT_TRUE(fs::exists(dir / "c/rank-00000.safetensors"));
  for (int r = 1; r < 4; ++r) EXPECT_FALSE(fs::exists(dir / ("c/rank-0000" + std::to_string(r) + ".safetensors")));
}

// Pipeline stages give different entries; a tied weight on two meshes is written once.
TEST(CheckpointRoundTrip, RanksMayGiveDifferentEntriesAndTiedCopiesAreWrittenOnce) {
  ScratchDir dir;
  const Tensor tied = Tensor::randn({4, 2}, 9);
  launch(2, [&](Group world) {
    DeviceMesh pp(world, {2, 1}, {"pp", "dp"});
    const DeviceMesh stage = pp["dp"];
    StateDict state{
        {"tied", distribute(tied, stage, {Replicate()})},
        {"layer" + std::to_string(world.rank()), distribute(Tensor::full({2}, world.rank()), stage, {Shard(0)})}};
    save(dir / "c", state, world);
  });
  const Manifest m = read_manifest(dir / "c");
  EXPECT_EQ(m.entries.size(), 3u);
  EXPECT_EQ(m.entries.at("tied").chunks, 1);
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    StateDict state{{"tied", zeros({4, 2}, mesh, {Replicate()})},
                    {"layer0", zeros({2}, mesh, {Replicate()})},
                    {"layer1", zeros({2}, mesh, {Replicate()})}};
    load(dir / "c", state, world);
    EXPECT_TRUE(bitwise_equal(std::get<DistTensor>(state["tied"]).to_local(), tied));
    EXPECT_TRUE(bitwise_equal(std::get<DistTensor>(state["layer1"]).to_local(), Tensor::ones({2})));
  });
}

// ---- errors -------------------------------------------------------------------------------

// Every rank's exception message, in rank order (empty when it returned).
template <class F>
std::vector<std::string> errors_of(int ranks, F&& fn) {
  std::vector<std::string> out(static_cast<size_t>(ranks));
  launch(ranks, [&](Group world) {
    try {
      fn(world);
    } catch (const std::exception& e) {
      out[static_cast<size_t>(world.rank())] = e.what();
    }
  });
  return out;
}

void expect_all_contain(const std::vector<std::string>& errors, const std::string& fragment) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find(fragment), std::string::npos) << "rank " << r << ": \"" << errors[r] << "\"";
  }
}

TEST(CheckpointErrors, BadTargetsFailOnEveryRankAndChangeNothing) {
  ScratchDir dir;
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    save(dir / "c", {{"w", distribute(Tensor::randn({4, 2}, 1), mesh, {Shard(0)})}, {"n", int64_t{3}}}, world);
  });
  // Loads a state whose "w" target is zeros of `shape` and `dtype` plus `more`.
  const auto attempt = [&](const Shape& shape, DType dtype, const StateDict& more) {
    return errors_of(2, [&](Group world) {
      DeviceMesh mesh(world, {2});
      StateDict state = more;
      const DistTensor w = zeros(shape, mesh, {Shard(0)}, dtype);
      state["w"] = w;
      try {
        load(dir / "c", state, world);
      } catch (...) {
        EXPECT_TRUE(all_equal(w.to_local(), 0.0)) << "nothing half-loaded";
        throw;
      }
    });
  };
  expect_all_contain(attempt({4, 2}, DType::F32, {{"missing", int64_t{0}}}), "no entry 'missing'");
  expect_all_contain(attempt({4, 3}, DType::F32, {}), "entry 'w': the target is f32 [4, 3]");
  expect_all_contain(attempt({4, 2}, DType::F64, {}), "the checkpoint holds f32 [4, 2]");
  expect_all_contain(attempt({4, 2}, DType::F32, {{"n", std::string()}}),
                     "entry 'n': the target is a string, the checkpoint holds an integer");
  expect_all_contain(errors_of(1,
                               [&](Group world) {
                                 StateDict s;
                                 load(dir / "nowhere", s, world);
                               }),
                     "holds no checkpoint");
}

TEST(CheckpointErrors, CorruptedAndTruncatedFilesAreNamedAndNothingIsHalfLoaded) {
  ScratchDir dir;
  const Tensor w = Tensor::randn({64, 8}, 1);
  const auto save_it = [&] {
    launch(2, [&](Group world) {
      DeviceMesh mesh(world, {2});
      save(dir / "c", {{"w", distribute(w, mesh, {Shard(0)})}}, world, {.overwrite = true, .block_bytes = 256});
    });
  };
  const auto load_it = [&] {
    return errors_of(2, [&](Group world) {
      DeviceMesh mesh(world, {2});
      StateDict state{{"w", full({64, 8}, 7.0, mesh, {Shard(0)})}};
      try {
        load(dir / "c", state, world);
      } catch (...) {
        EXPECT_TRUE(all_equal(std::get<DistTensor>(state["w"]).to_local(), 7.0)) << "nothing half-loaded";
        throw;
      }
    });
  };
  save_it();
  {
    // Flip one byte in the middle of rank 1's chunk.
    std::fstream f(dir / "c/rank-00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-300, std::ios::end);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(-300, std::ios::end);
    f.write(&c, 1);
  }
  const std::vector<std::string> corrupted = load_it();
  expect_all_contain(corrupted, "rank-00001.safetensors\", entry 'w': checksum mismatch in block");
  EXPECT_EQ(corrupted[0].rfind("rank 1: ", 0), 0u) << corrupted[0];
  save_it();
  fs::resize_file(dir / "c/rank-00000.safetensors", fs::file_size(dir / "c/rank-00000.safetensors") - 10);
  expect_all_contain(load_it(), "rank-00000.safetensors\" has");
}

TEST(CheckpointErrors, RanksThatDisagreeFailTheSaveOnEveryRank) {
  ScratchDir dir;
  expect_all_contain(errors_of(2,
                               [&](Group world) {
                                 save(dir / "a", {{"t", Tensor::zeros({world.rank() + 1})}}, world);
                               }),
                     "entry 't' is f32 [1] on rank 0 and f32 [2] on rank 1");
  expect_all_contain(errors_of(2,
                               [&](Group world) {
                                 save(dir / "b", {{"n", int64_t{world.rank()}}}, world);
                               }),
                     "entry 'n' is 0 on rank 0 and 1 on rank 1");
  expect_all_contain(errors_of(2,
                               [&](Group world) {
                                 save(dir / "c", {{"x", DistTensor()}}, world);
                               }),
                     "entry 'x' is an undefined DistTensor");
  EXPECT_FALSE(fs::exists(dir / "a"));
  EXPECT_FALSE(fs::exists(dir / "a.tmp"));
  launch(1, [&](Group world) { save(dir / "d", {{"n", int64_t{1}}}, world); });
  expect_all_contain(errors_of(1, [&](Group world) { save(dir / "d", {{"n", int64_t{2}}}, world); }), "already exists");
}

// A save that fails at any point leaves the previous checkpoint loadable and no
// directory that looks complete.
TEST(CheckpointErrors, AFailedSaveLeavesThePreviousCheckpoint) {
  ScratchDir dir;
  const auto save_value = [&](double v) {
    return errors_of(2, [&](Group world) {
      DeviceMesh mesh(world, {2});
      save(dir / "c", {{"w", full({4}, v, mesh, {Shard(0)})}}, world, {.overwrite = true});
    });
  };
  const auto loaded_value = [&] {
    double value = 0;
    launch(1, [&](Group world) {
      DeviceMesh mesh(world, {1});
      StateDict state{{"w", zeros({4}, mesh, {Replicate()})}};
      load(dir / "c", state, world);
      const Tensor w = std::get<DistTensor>(state["w"]).to_local();
      value = all_equal(w, w.to(DType::F64).to_vector<double>()[0]) ? w.to(DType::F64).to_vector<double>()[0] : -1;
    });
    return value;
  };
  save_value(1.0);
  for (const char* fault : {"rank:1,point:written", "rank:0,point:written", "rank:0,point:manifest"}) {
    SCOPED_TRACE(fault);
    ::setenv("DTENSOR_CHECKPOINT_FAULT", fault, 1);
    expect_all_contain(save_value(2.0), "[checkpoint fault]");
    ::unsetenv("DTENSOR_CHECKPOINT_FAULT");
    EXPECT_EQ(loaded_value(), 1.0);
    EXPECT_FALSE(fs::exists(dir / "c.tmp"));
  }
  ::setenv("DTENSOR_CHECKPOINT_FAULT", "rank:0,point:committed", 1);
  expect_all_contain(save_value(3.0), "[checkpoint fault]");
  ::unsetenv("DTENSOR_CHECKPOINT_FAULT");
  EXPECT_EQ(loaded_value(), 3.0) << "the rename happened: the new checkpoint is complete";
}

TEST(CheckpointDirTest, KeepsTheNewestAndIgnoresLeftovers) {
  ScratchDir dir;
  CheckpointDir series(dir / "run", 2);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    for (int64_t step = 1; step <= 4; ++step) {
      series.save(step, {{"w", full({4}, static_cast<double>(step), mesh, {Shard(0)})}, {"train.step", step}}, world);
    }
  });
  EXPECT_EQ(series.steps(), (std::vector<int64_t>{3, 4}));
  fs::create_directories(series.path_of(9) + ".tmp");
  fs::create_directories(series.path_of(10));  // no manifest: a crash before the rename cannot make this, but still
  EXPECT_EQ(series.latest(), std::optional<int64_t>(4));
  EXPECT_EQ(series.path_of(4), dir / "run/step-00000004");
  EXPECT_FALSE(CheckpointDir(dir / "empty").latest().has_value());
  EXPECT_THROW_MSG(CheckpointDir(dir / "x", -1), std::invalid_argument, "keep_last");
}

// ---- resuming training -----------------------------------------------------------------------

struct TrainLayout {
  std::string mesh;  // "dp=2", "dp=2,tp=2", ...
  int fsdp = 0;      // 0: DDP over dp (when dp > 1)
};

// Steps [start, steps) of AdamW on `layout`, where start is 0 or the loaded checkpoint's
// step; saves after step `save_after` (1-based count) when save_dir is set.
dtensor::testing::TrainingRun train(const TrainLayout& layout, int64_t steps, const std::string& load_dir = "",
                                    const std::string& save_dir = "", int64_t save_after = 0) {
  dtensor::testing::TrainingRun result;
  const MeshSpec spec = parse_mesh_spec(layout.mesh);
  const models::GPTConfig config = dtensor::testing::tiny_gpt();
  const int64_t global_batch = 8;
  launch(static_cast<int>(shape_numel(spec.shape)), [&](Group world) {
    DeviceMesh mesh(world, spec.shape, spec.names);
    const bool has_dp = std::count(spec.names.begin(), spec.names.end(), "dp") > 0;
    const int64_t dp = spec.size("dp");
    const int64_t dp_rank = has_dp ? mesh.coordinate(mesh.dim_index("dp")) : 0;
    SyntheticLanguage data(config.vocab, config.block_size, 64, 3);
    DistributedSampler sampler(data.size(), global_batch, dp_rank, dp, 5);
    models::GPT model(mesh, config, 42);
    if (spec.size("tp") > 1) parallel::parallelize_module(model, mesh["tp"], models::gpt_tp_plan(config));
    std::unique_ptr<parallel::DistributedDataParallel> ddp;
    std::optional<parallel::FSDPModule> fsdp;
    parallel::GradientSync* sync = nullptr;
    if (layout.fsdp > 0) {
      for (auto& [name, m] : model.named_modules()) {
        if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh, {.stage = layout.fsdp});
      }
      fsdp = parallel::fully_shard(model, mesh, {.stage = layout.fsdp});
      sync = &*fsdp;
    } else if (has_dp) {
      ddp = std::make_unique<parallel::DistributedDataParallel>(model, parallel::DDPOptions{.dp_dim = "dp"});
      sync = ddp.get();
    }
    AdamW optimizer(model.parameters(), 1e-2);
    parallel::Trainer trainer(optimizer, {.sync = sync});
    TrainState state{.modules = {&model}, .optimizer = &optimizer, .sampler = &sampler};
    if (!load_dir.empty()) load(load_dir, state, world);
    Placements batch;
    for (const std::string& name : spec.names) batch.push_back(name == "dp" ? Shard(0) : Replicate());
    const Shape shape{global_batch, config.block_size};
    std::vector<double> losses;
    for (int64_t step = state.step; step < steps; ++step) {
      const parallel::StepReport report = trainer.step(step, [&](int64_t) {
        const TokenBatch b = data.get_batch(sampler.batch_at(step));
        return model.loss(DistTensor::from_local(b.inputs, mesh, batch, shape),
                          DistTensor::from_local(b.targets, mesh, batch, shape));
      });
      losses.push_back(report.stats.loss);
      if (!save_dir.empty() && step + 1 == save_after) {
        state.step = step + 1;
        save(save_dir, state, world);
      }
    }
    const auto params = model.state_dict();
    if (world.rank() == 0) {
      result.losses = losses;
      result.params = params;
    }
  });
  return result;
}

// The uninterrupted run against one saved after 3 steps and resumed on `to`.
void expect_resume_matches(const TrainLayout& from, const TrainLayout& to, double rtol) {
  ScratchDir dir;
  const dtensor::testing::TrainingRun whole = train(from, 6, "", dir / "c", 3);
  const dtensor::testing::TrainingRun resumed = train(to, 6, dir / "c");
  ASSERT_EQ(whole.losses.size(), 6u);
  ASSERT_EQ(resumed.losses.size(), 3u) << "the resumed run starts at step 4";
  for (size_t i = 0; i < 3; ++i) {
    if (rtol == 0) {
      EXPECT_EQ(resumed.losses[i], whole.losses[i + 3]) << "step " << i + 4;
    } else {
      EXPECT_NEAR(resumed.losses[i], whole.losses[i + 3], rtol * std::fabs(whole.losses[i + 3])) << "step " << i + 4;
    }
  }
  for (const auto& [name, t] : whole.params) {
    if (rtol == 0) {
      EXPECT_TRUE(bitwise_equal(resumed.params.at(name), t)) << name;
    } else {
      EXPECT_TRUE(allclose(resumed.params.at(name), t, rtol, 1e-6)) << name;
    }
  }
}

TEST(CheckpointResume, OnTheSameMeshTheLossesAreBitExact) {
  for (const TrainLayout& l : std::vector<TrainLayout>{
           {"dp=1"}, {"dp=2"}, {"dp=2", 1}, {"dp=2", 2}, {"dp=2", 3}, {"tp=2"}, {"dp=2,tp=2", 3}}) {
    SCOPED_TRACE(l.mesh + " fsdp " + std::to_string(l.fsdp));
    expect_resume_matches(l, l, 0);
  }
}

TEST(CheckpointResume, OnAnotherMeshTheLossesAgreeWithin1e5) {
  expect_resume_matches({"dp=2"}, {"dp=4"}, 1e-5);
  expect_resume_matches({"dp=4", 3}, {"dp=2,tp=2", 3}, 1e-5);
  expect_resume_matches({"dp=2", 1}, {"dp=1"}, 1e-5);
  expect_resume_matches({"dp=1"}, {"dp=2", 2}, 1e-5);
}

TEST(CheckpointResume, TrainStateNamesOptimizerStateByParameter) {
  ScratchDir dir;
  train({"dp=2", 3}, 2, "", dir / "c", 1);
  const Manifest m = read_manifest(dir / "c");
  EXPECT_TRUE(m.entries.count("model.blocks.0.attn.q.weight"));
  EXPECT_TRUE(m.entries.count("optim.blocks.0.attn.q.weight.exp_avg"));
  EXPECT_EQ(std::get<int64_t>(*m.entries.at("optim.blocks.0.attn.q.weight.step").value), 1);
  EXPECT_EQ(m.entries.at("optim.blocks.0.attn.q.weight.exp_avg").placements, "S(0)");
  EXPECT_EQ(std::get<int64_t>(*m.entries.at("train.step").value), 1);
  EXPECT_EQ(std::get<int64_t>(*m.entries.at("data.global_batch").value), 8);
}

TEST(CheckpointResume, AnotherGlobalBatchIsRefused) {
  ScratchDir dir;
  train({"dp=1"}, 1, "", dir / "c", 1);
  expect_all_contain(errors_of(1,
                               [&](Group world) {
                                 DeviceMesh mesh(world, {1}, {"dp"});
                                 models::GPT model(mesh, dtensor::testing::tiny_gpt(), 42);
                                 DistributedSampler sampler(64, 16, 0, 1, 5);
                                 TrainState state{.modules = {&model}, .sampler = &sampler};
                                 load(dir / "c", state, world);
                               }),
                     "the sampler's global_batch is 16, the checkpoint was saved with 8");
}

TEST(CheckpointResume, DropoutCountersAndTheLossScalerRoundTrip) {
  ScratchDir dir;
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    models::GPTConfig config = dtensor::testing::tiny_gpt();
    config.dropout = 0.1;
    models::GPT model(mesh, config, 1);
    const DistTensor ids = DistTensor::from_local(Tensor::zeros({1, 8}, DType::I64), mesh, {Replicate()});
    model.loss(ids, ids);
    model.loss(ids, ids);
    LossScaler scaler;
    scaler.load_state({1024.0, 7, 3});
    TrainState state{.modules = {&model}, .scaler = &scaler, .step = 9};
    const std::map<std::string, int64_t> counters = model.named_extra_state();
    ASSERT_FALSE(counters.empty());
    EXPECT_EQ(counters.begin()->second, 2);
    save(dir / "c", state, world);

    models::GPT fresh(mesh, config, 2);
    LossScaler scaler2;
    TrainState into{.modules = {&fresh}, .scaler = &scaler2};
    load(dir / "c", into, world);
    EXPECT_EQ(fresh.named_extra_state(), counters);
    EXPECT_EQ(scaler2.scale_value(), 1024.0);
    EXPECT_EQ(scaler2.state().clean_steps, 7);
    EXPECT_EQ(into.step, 9);
    const auto a = model.state_dict(), b = fresh.state_dict();
    for (const auto& [name, t] : a) EXPECT_TRUE(bitwise_equal(b.at(name), t)) << name;
  });
}

// Loading into a model whose FSDP (stage 1 or 2) keeps gathered parameters between
// steps: the next forward computes with the loaded values, not the stale copies.
TEST(CheckpointResume, LoadingIntoARunningFsdpModelRefreshesItsGatheredParameters) {
  ScratchDir dir;
  train({"dp=2"}, 2, "", dir / "c", 2);
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    std::vector<double> losses(2);
    launch(2, [&](Group world) {
      DeviceMesh mesh(world, {2}, {"dp"});
      const models::GPTConfig config = dtensor::testing::tiny_gpt();
      const Shape shape{8, config.block_size};
      const DistTensor ids =
          DistTensor::from_local(Tensor::zeros({4, config.block_size}, DType::I64), mesh, {Shard(0)}, shape);
      // fresh: loaded before any forward; running: after a forward gathered its parameters.
      for (int running = 0; running < 2; ++running) {
        models::GPT model(mesh, config, 7);
        parallel::FSDPModule root = parallel::fully_shard(model, mesh, {.stage = stage});
        if (running) model.loss(ids, ids);
        TrainState state{.modules = {&model}};
        load(dir / "c", state, world);
        const double loss = model.loss(ids, ids).full_tensor().item<double>();
        if (world.rank() == 0) losses[static_cast<size_t>(running)] = loss;
      }
    });
    EXPECT_EQ(losses[1], losses[0]);
  }
}

// ---- asynchronous saves ---------------------------------------------------------------------

// The state as it was when save() returned, whatever the training does to it next.
TEST(CheckpointAsync, SavesTheStateAsItWasWhenSaveReturned) {
  ScratchDir dir;
  const Tensor original = Tensor::randn({64, 16}, 4);
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    const DistTensor w = distribute(original, mesh, {Shard(0)});
    AsyncSaver saver(world);
    const AsyncSaveStats stats = saver.save(dir / "c", {{"w", w}, {"step", int64_t{5}}});
    EXPECT_EQ(stats.bytes_copied, 32 * 16 * 4);
    EXPECT_TRUE(saver.in_flight());
    Tensor(w.to_local()).fill_(-1.0);  // the training goes on
    saver.wait();
    EXPECT_FALSE(saver.in_flight());
    StateDict state{{"w", zeros({64, 16}, mesh, {Shard(1)})}, {"step", int64_t{0}}};
    load(dir / "c", state, world);
    EXPECT_TRUE(bitwise_equal(std::get<DistTensor>(state["w"]).full_tensor(), original));
    EXPECT_EQ(std::get<int64_t>(state["step"]), 5);
  });
  EXPECT_FALSE(fs::exists(dir / "c.tmp"));
  for (const auto& e : fs::directory_iterator(dir / "c")) {
    EXPECT_EQ(e.path().filename().string().find(".done"), std::string::npos) << "rank reports left behind";
  }
}

TEST(CheckpointAsync, ASeriesSavedAsynchronouslyIsPrunedAfterEachCommit) {
  ScratchDir dir;
  CheckpointDir series(dir / "run", 2);
  launch(3, [&](Group world) {
    DeviceMesh mesh(world, {3});
    AsyncSaver saver(world);
    for (int64_t step = 1; step <= 4; ++step) {
      series.save_async(saver, step, {{"w", full({5, 2}, static_cast<double>(step), mesh, {Shard(0)})}}, {});
    }
    saver.wait();
  });
  EXPECT_EQ(series.steps(), (std::vector<int64_t>{3, 4}));
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    StateDict state{{"w", zeros({5, 2}, mesh, {Replicate()})}};
    load(series.path_of(4), state, world);
    EXPECT_TRUE(all_equal(std::get<DistTensor>(state["w"]).to_local(), 4.0));
  });
}

TEST(CheckpointAsync, AFailedBackgroundWriteIsThrownOnEveryRankAndCommitsNothing) {
  ScratchDir dir;
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    save(dir / "c", {{"w", full({4}, 1.0, mesh, {Shard(0)})}}, world);
  });
  ::setenv("DTENSOR_CHECKPOINT_FAULT", "rank:1,point:written", 1);
  const std::vector<std::string> errors = errors_of(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    AsyncSaver saver(world);
    saver.save(dir / "c", {{"w", full({4}, 2.0, mesh, {Shard(0)})}}, {.overwrite = true});
    saver.wait();
  });
  ::unsetenv("DTENSOR_CHECKPOINT_FAULT");
  expect_all_contain(errors, "[checkpoint fault] rank 1");
  EXPECT_FALSE(fs::exists(dir / "c.tmp"));
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    StateDict state{{"w", zeros({4}, mesh, {Replicate()})}};
    load(dir / "c", state, world);
    EXPECT_TRUE(all_equal(std::get<DistTensor>(state["w"]).to_local(), 1.0)) << "the previous checkpoint stays";
  });
}

// A rank whose report never comes (it died): rank 0 gives up after the timeout.
TEST(CheckpointAsync, RankZeroGivesUpOnAMissingRankAfterTheTimeout) {
  ScratchDir dir;
  ::setenv("DTENSOR_CHECKPOINT_FAULT", "rank:1,point:written,kind:stall", 1);
  const std::vector<std::string> errors = errors_of(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    AsyncSaver saver(world, std::chrono::milliseconds(200));
    saver.save(dir / "c", {{"w", full({4}, 2.0, mesh, {Shard(0)})}});
    saver.wait();
  });
  ::unsetenv("DTENSOR_CHECKPOINT_FAULT");
  expect_all_contain(errors, "no file from rank(s) 1 within 200 ms");
  EXPECT_FALSE(fs::exists(dir / "c"));
}

// ---- one safetensors file ---------------------------------------------------------------------

// Exported from sharded layouts without gathering, the file holds the whole tensors;
// imported onto other layouts and world sizes, under other names.
TEST(CheckpointSafetensors, ExportWritesWholeTensorsAndImportReshardsThem) {
  ScratchDir dir;
  const Tensor a = Tensor::randn({7, 5}, 21);
  const Tensor b = Tensor::randn({6}, 22).to(DType::BF16);
  for (const Layout& from : round_trip_layouts()) {
    SCOPED_TRACE("exported from " + from.name);
    const std::string path = dir / "model.safetensors";
    launch(static_cast<int>(shape_numel(from.mesh)), [&](Group world) {
      DeviceMesh mesh(world, from.mesh);
      export_safetensors(path,
                         {{"a", distribute(a, mesh, from.placements)},
                          {"b", distribute(b, mesh, one_dim(from.placements))},
                          {"steps", int64_t{12}}},
                         world,
                         {.names = {{"a", "model.a.weight"}}, .metadata = {{"format", "pt"}}, .overwrite = true});
    });
    // The file as any reader sees it.
    const std::string bytes = ckd::read_file(path);
    const int64_t n = ckd::safetensors_header_length(reinterpret_cast<const unsigned char*>(bytes.data()),
                                                     static_cast<int64_t>(bytes.size()), path);
    const ckd::SafetensorsHeader h = ckd::parse_safetensors_header(
        std::string_view(bytes).substr(8, static_cast<size_t>(n)), static_cast<int64_t>(bytes.size()), path);
    EXPECT_EQ(h.metadata.at("steps"), "12");
    EXPECT_EQ(h.metadata.at("format"), "pt");
    ASSERT_EQ(h.tensors.size(), 2u);
    EXPECT_EQ(h.tensors[0].name, "b");
    EXPECT_EQ(h.tensors[1].name, "model.a.weight");
    EXPECT_EQ(std::memcmp(bytes.data() + h.data_offset + h.tensors[1].begin, a.data_ptr(), a.nbytes()), 0);
    EXPECT_EQ(std::memcmp(bytes.data() + h.data_offset + h.tensors[0].begin, b.data_ptr(), b.nbytes()), 0);
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    // Imported on 3 ranks, columns sharded, under dtensor's names.
    launch(3, [&](Group world) {
      DeviceMesh mesh(world, {3});
      StateDict state{{"a", zeros({7, 5}, mesh, {Shard(1)})}, {"b", zeros({6}, mesh, {Shard(0)}, DType::BF16)}};
      const LoadStats stats = import_safetensors(path, state, world, {.names = {{"a", "model.a.weight"}}});
      EXPECT_TRUE(bitwise_equal(std::get<DistTensor>(state["a"]).full_tensor(), a));
      EXPECT_TRUE(bitwise_equal(std::get<DistTensor>(state["b"]).full_tensor(), b));
      EXPECT_EQ(stats.bytes_read, stats.bytes_needed);
    });
  }
}

// The committed fixture written by Python's safetensors package, loaded sharded.
TEST(CheckpointSafetensors, ImportsAFileThePythonPackageWroteOntoShards) {
  const std::string path = std::string(DTENSOR_TEST_DATA_DIR) + "/python_written.safetensors";
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    StateDict state{{"weight", zeros({2, 3}, mesh, {Shard(1)})},
                    {"ids", zeros({4}, mesh, {Shard(0)}, DType::I64)},
                    {"half", Tensor()}};
    import_safetensors(path, state, world);
    EXPECT_TRUE(bitwise_equal(std::get<DistTensor>(state["weight"]).full_tensor(),
                              Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3})));
    EXPECT_EQ(std::get<DistTensor>(state["ids"]).full_tensor().to_vector<int64_t>(),
              (std::vector<int64_t>{3, 1, 4, 1}));
    EXPECT_EQ(std::get<Tensor>(state["half"]).to(DType::F32).to_vector<float>(), (std::vector<float>{0.5f, -2.0f}));
  });
  expect_all_contain(errors_of(1,
                               [&](Group world) {
                                 DeviceMesh mesh(world, {1});
                                 StateDict state{{"weight", zeros({3, 2}, mesh, {Replicate()})}};
                                 import_safetensors(path, state, world);
                               }),
                     "[checkpoint::import_safetensors] entry 'weight': the target is f32 [3, 2]");
  expect_all_contain(errors_of(1,
                               [&](Group world) {
                                 StateDict state{{"nothing", Tensor()}};
                                 import_safetensors(path, state, world);
                               }),
                     "python_written.safetensors\" has no entry 'nothing'");
}

// A GPT exported from one rank loads into a tensor-parallel GPT, value for value.
TEST(CheckpointSafetensors, AGptExportedFromOneRankImportsIntoTensorParallelShards) {
  ScratchDir dir;
  const models::GPTConfig config = dtensor::testing::tiny_gpt();
  std::map<std::string, Tensor> reference;
  launch(1, [&](Group world) {
    DeviceMesh mesh(world, {1});
    models::GPT model(mesh, config, 5);
    StateDict state;
    for (const auto& [name, p] : model.named_parameters()) state["transformer." + name] = p;
    export_safetensors(dir / "gpt.safetensors", state, world);
    reference = model.state_dict();
  });
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2}, {"tp"});
    models::GPT model(mesh, config, 6);  // other values
    parallel::parallelize_module(model, mesh, models::gpt_tp_plan(config));
    StateDict state;
    for (const auto& [name, p] : model.named_parameters()) state[name] = p;
    ImportOptions options;
    for (const auto& [name, _] : state) options.names[name] = "transformer." + name;
    import_safetensors(dir / "gpt.safetensors", state, world, options);
    const auto loaded = model.state_dict();
    for (const auto& [name, t] : reference) EXPECT_TRUE(bitwise_equal(loaded.at(name), t)) << name;
  });
}

}  // namespace
