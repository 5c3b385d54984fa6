// libFuzzer target: the two parsers a checkpoint load trusts, on any bytes. The first
// byte chooses: even, manifest.json (parse_manifest); odd, a safetensors file (its
// length word and header). What parses must satisfy what a reader relies on and
// survive a round trip (print, parse again, the same); what does not must fail with
// std::invalid_argument.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"

namespace ckd = dtensor::checkpoint::detail;

namespace {

void check_manifest(std::string_view text) {
  ckd::ManifestData m;
  try {
    m = ckd::parse_manifest(text, "fuzz");
  } catch (const std::invalid_argument&) {
    return;
  }
  for (const auto& [name, e] : m.entries) {
    const bool tensor =
        e.kind == dtensor::checkpoint::EntryKind::DistTensor || e.kind == dtensor::checkpoint::EntryKind::Tensor;
    if (!tensor) {
      if (!e.chunks.empty()) std::abort();
      continue;
    }
    int64_t covered = 0;
    for (const ckd::ChunkRecord& c : e.chunks) {
      if (c.box.size() != e.shape.size() || c.file < 0 || c.file >= static_cast<int64_t>(m.files.size())) std::abort();
      if (c.begin + e.chunk_bytes(c) > m.files[static_cast<size_t>(c.file)].bytes) std::abort();
      covered += ckd::box_numel(c.box);
    }
    if (covered != dtensor::shape_numel(e.shape)) std::abort();
  }
  const std::string printed = ckd::manifest_to_json(m);
  if (ckd::manifest_to_json(ckd::parse_manifest(printed, "fuzz again")) != printed) std::abort();
}

void check_safetensors(std::string_view bytes) {
  const auto* first8 = reinterpret_cast<const unsigned char*>(bytes.data());
  const int64_t size = static_cast<int64_t>(bytes.size());
  ckd::SafetensorsHeader h;
  try {
    const int64_t n = ckd::safetensors_header_length(first8, size, "fuzz");
    h = ckd::parse_safetensors_header(bytes.substr(8, static_cast<size_t>(n)), size, "fuzz");
  } catch (const std::invalid_argument&) {
    return;
  }
  int64_t expected = 0;
  for (const ckd::SafetensorsTensor& t : h.tensors) {
    if (t.begin != expected || t.end < t.begin) std::abort();
    expected = t.end;
  }
  if (h.data_offset + expected != size) std::abort();
  // Written again from what was parsed, the header parses to the same tensors.
  std::vector<ckd::SafetensorsTensor> tensors = h.tensors;
  const std::string header = ckd::make_safetensors_header(tensors, h.metadata);
  const int64_t again_size = static_cast<int64_t>(header.size()) + expected;
  const ckd::SafetensorsHeader again =
      ckd::parse_safetensors_header(std::string_view(header).substr(8), again_size, "fuzz again");
  if (again.tensors.size() != h.tensors.size() || again.metadata != h.metadata) std::abort();
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    if (again.tensors[i].shape != h.tensors[i].shape || again.tensors[i].dtype != h.tensors[i].dtype) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    check_manifest(rest);
  } else {
    check_safetensors(rest);
  }
  return 0;
}
