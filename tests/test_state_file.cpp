// The named-tensor file (nn/state_file.h): round trips of every dtype and shape with
// metadata, a model's state_dict through a file, and the errors of damaged files.
#include "dtensor/nn/state_file.h"

#include <cstdio>
#include <cstring>
#include <fstream>

#include "dtensor/models/gpt.h"
#include "test_helpers.h"

using namespace dtensor;
using namespace dtensor::nn;

namespace {

std::map<std::string, Tensor> every_dtype() {
  std::map<std::string, Tensor> t;
  t["a.f32"] = Tensor::randn({3, 4}, 1);
  t["b.f64"] = Tensor::randn({2, 1, 3}, 2, DType::F64);
  t["c.bf16"] = Tensor::randn({5}, 3, DType::BF16);
  t["d.f16"] = Tensor::randn({2, 2}, 4, DType::F16);
  t["e.i64"] = Tensor::from_vector(std::vector<int64_t>{-1, 0, 1LL << 40}, {3});
  t["f.i32"] = Tensor::from_vector(std::vector<int32_t>{7, -7}, {2, 1});
  t["g.bool"] = Tensor::from_vector(std::vector<bool>{true, false, true}, {3});
  t["h.scalar"] = Tensor::scalar(2.5f);
  t["i.empty"] = Tensor::zeros({0, 3});
  t["j.view"] = Tensor::randn({4, 6}, 5).transpose(0, 1);  // not contiguous
  return t;
}

void expect_same(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    EXPECT_EQ(g.dtype(), t.dtype()) << name;
    EXPECT_EQ(g.shape(), t.shape()) << name;
    EXPECT_EQ(dtensor::testing::reference_values(g), dtensor::testing::reference_values(t)) << name;
  }
}

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

}  // namespace

TEST(StateFile, EveryDtypeAndShapeRoundTripsWithMetadata) {
  const std::map<std::string, Tensor> tensors = every_dtype();
  const std::map<std::string, std::string> metadata{{"layers", "4"}, {"bytes", std::string("a\0b", 3)}, {"empty", ""}};
  const std::string path = temp_path("every_dtype.dtstate");
  save_state_file(path, tensors, metadata);
  const StateFile f = load_state_file(path);
  expect_same(f.tensors, tensors);
  EXPECT_EQ(f.metadata, metadata);
  // The bytes are the format's, independent of the path taken.
  EXPECT_EQ(serialize_state(f.tensors, f.metadata), serialize_state(tensors, metadata));
  const StateFile none = deserialize_state(serialize_state({}));
  EXPECT_TRUE(none.tensors.empty() && none.metadata.empty());
}

TEST(StateFile, AModelLoadsWhatAnotherSaved) {
  launch(1, [](Group g) {
    DeviceMesh mesh(g, {1});
    models::GPTConfig c;
    c.vocab = 16;
    c.block_size = 8;
    c.layers = 2;
    c.dim = 16;
    c.heads = 2;
    models::GPT trained(mesh, c, 1), fresh(mesh, c, 2);
    const std::string path = temp_path("gpt.dtstate");
    save_state_file(path, trained.state_dict());
    fresh.load_state_dict(load_state_file(path).tensors);
    const DistTensor ids = distribute(Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4}), mesh, {Replicate()});
    EXPECT_TRUE(allclose(fresh(ids).full_tensor(), trained(ids).full_tensor(), 0, 0));
  });
}

TEST(StateFile, DamagedFilesAreRejectedNamingWhatIsWrong) {
  const std::string good = serialize_state(every_dtype(), {{"k", "v"}});
  EXPECT_THROW_MSG(deserialize_state("GARBAGE!" + good.substr(8), "x.bin"), std::invalid_argument,
                   "x.bin: not a dtensor state file");
  std::string version = good;
  version[8] = 2;
  EXPECT_THROW_MSG(deserialize_state(version, "v.bin"), std::invalid_argument, "v.bin: format version 2, this build reads version 1");
  // Any flipped byte, or any cut, is caught by the checksum.
  for (size_t at : {size_t{20}, good.size() / 2, good.size() - 9}) {
    std::string flipped = good;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x10);
    EXPECT_THROW_MSG(deserialize_state(flipped, "f.bin"), std::invalid_argument, "f.bin: checksum mismatch");
  }
  for (size_t length : {size_t{12}, size_t{40}, good.size() - 1}) {
    EXPECT_THROW(deserialize_state(good.substr(0, length), "t.bin"), std::invalid_argument) << length;
  }
  EXPECT_THROW_MSG(deserialize_state(good + "x", "long.bin"), std::invalid_argument, "long.bin: checksum mismatch");
  EXPECT_THROW_MSG(load_state_file(temp_path("no/such/file")), std::invalid_argument, "cannot open");
  EXPECT_THROW_MSG(save_state_file(temp_path("no/such/dir/f"), {}), std::invalid_argument, "cannot write");
  EXPECT_THROW_MSG(serialize_state({{"u", Tensor()}}), std::invalid_argument, "tensor 'u' is undefined");
}

TEST(StateFile, ConsistentChecksumButInconsistentFieldsAreRejected) {
  // A writer bug (or a hand-made file) with a valid checksum: a byte count that does
  // not match the shape. Re-checksum after editing.
  std::string bytes = serialize_state({{"w", Tensor::zeros({2, 2})}});
  // magic 8, version 4, metadata count 8, tensor count 8, name length 4 + 1, dtype 1,
  // ndim 1, sizes 16, then the byte count.
  const size_t count_at = 8 + 4 + 8 + 8 + 4 + 1 + 1 + 1 + 16;
  const uint64_t wrong = 12;
  std::memcpy(bytes.data() + count_at, &wrong, 8);
  bytes.resize(bytes.size() - 8);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  bytes.append(reinterpret_cast<const char*>(&h), 8);
  EXPECT_THROW_MSG(deserialize_state(bytes, "w.bin"), std::invalid_argument,
                   "tensor 'w' of shape [2, 2] and dtype f32 has 12 bytes, expected 16");
}
