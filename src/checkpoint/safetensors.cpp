// safetensors headers: writing and strict parsing (safetensors.h).
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/check.h"

namespace dtensor::checkpoint::detail {

namespace {

constexpr int64_t kMaxHeaderBytes = 100'000'000;  // the format's limit
constexpr const char* kOp = "checkpoint";

constexpr std::pair<DType, std::string_view> kDtypes[] = {
    {DType::F32, "F32"}, {DType::F64, "F64"}, {DType::BF16, "BF16"}, {DType::F16, "F16"},
    {DType::I64, "I64"}, {DType::I32, "I32"}, {DType::Bool, "BOOL"},
};

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  for (const auto& [d, name] : kDtypes) {
    if (d == dtype) return name;
  }
  return "F32";
}

DType parse_safetensors_dtype(std::string_view name, const std::string& where) {
  for (const auto& [d, n] : kDtypes) {
    if (n == name) return d;
  }
  throw std::invalid_argument(
      ::dtensor::detail::concat("[", kOp, "] ", where, ": dtype \"", std::string(name),
                                "\" is not one dtensor has (F32, F64, BF16, F16, I64, I32, BOOL)"));
}

std::string make_safetensors_header(std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (SafetensorsTensor& t : tensors) {
    t.begin = offset;
    t.end = offset + shape_numel(t.shape) * static_cast<int64_t>(dtype_size(t.dtype));
    offset = t.end;
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes + json;
}

int64_t safetensors_header_length(const unsigned char* first8, int64_t file_bytes, const std::string& source) {
  DT_CHECK_ARG(file_bytes >= 8, kOp, source, ": ", file_bytes, " bytes, too short for a safetensors file (at least 8)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | first8[i];
  DT_CHECK_ARG(n <= static_cast<uint64_t>(kMaxHeaderBytes) && static_cast<int64_t>(n) <= file_bytes - 8, kOp, source,
               ": header length ", n, " does not fit the file's ", file_bytes, " bytes (or exceeds the 100 MB limit)");
  return static_cast<int64_t>(n);
}

SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t file_bytes, const std::string& source) {
  SafetensorsHeader out;
  out.data_offset = 8 + static_cast<int64_t>(json.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(
        ::dtensor::detail::concat("[", kOp, "] ", source, ": the safetensors header is not JSON (", e.what(), ")"));
  }
  DT_CHECK_ARG(header.is_object(), kOp, source, ": the safetensors header is not a JSON object");
  for (const auto& [name, value] : header.items()) {
    const std::string where = source + ", tensor \"" + name + "\"";
    if (name == "__metadata__") {
      DT_CHECK_ARG(value.is_object(), kOp, source, ": __metadata__ is not an object");
      for (const auto& [key, v] : value.items()) {
        DT_CHECK_ARG(v.is_string(), kOp, source, ": __metadata__ \"", key, "\" is not a string");
        out.metadata[key] = v.get<std::string>();
      }
      continue;
    }
    DT_CHECK_ARG(value.is_object() && value.contains("dtype") && value["dtype"].is_string() &&
                     value.contains("shape") && value["shape"].is_array() && value.contains("data_offsets") &&
                     value["data_offsets"].is_array() && value["data_offsets"].size() == 2,
                 kOp, where, ": expected {\"dtype\": string, \"shape\": [..], \"data_offsets\": [begin, end]}");
    SafetensorsTensor t;
    t.name = name;
    t.dtype = parse_safetensors_dtype(value["dtype"].get<std::string>(), where);
    int64_t numel = 1;
    for (const auto& s : value["shape"]) {
      DT_CHECK_ARG(s.is_number_unsigned() && s.get<uint64_t>() < (1ULL << 48), kOp, where,
                   ": shape entries must be non-negative integers");
      t.shape.push_back(s.get<int64_t>());
      // Checked before multiplying: no overflow for any input.
      constexpr int64_t kMaxElements = int64_t{1} << 56;
      DT_CHECK_ARG(t.shape.back() == 0 || numel <= kMaxElements / t.shape.back(), kOp, where, ": shape ", t.shape,
                   " is too large");
      numel *= t.shape.back();
    }
    for (const auto& o : value["data_offsets"]) {
      DT_CHECK_ARG(o.is_number_unsigned() && o.get<uint64_t>() < (1ULL << 60), kOp, where,
                   ": data_offsets must be non-negative integers");
    }
    t.begin = value["data_offsets"][0].get<int64_t>();
    t.end = value["data_offsets"][1].get<int64_t>();
    DT_CHECK_ARG(t.end - t.begin == numel * static_cast<int64_t>(dtype_size(t.dtype)), kOp, where, ": data_offsets [",
                 t.begin, ", ", t.end, "] hold ", t.end - t.begin, " bytes, shape ", t.shape, " of ",
                 dtype_name(t.dtype), " needs ", numel * static_cast<int64_t>(dtype_size(t.dtype)));
    out.tensors.push_back(std::move(t));
  }
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.begin < b.begin; });
  int64_t expected = 0;
  for (const SafetensorsTensor& t : out.tensors) {
    DT_CHECK_ARG(t.begin == expected, kOp, source, ": tensor \"", t.name, "\" starts at data byte ", t.begin,
                 ", expected ", expected, " (offsets must be contiguous from 0, without holes or overlaps)");
    expected = t.end;
  }
  DT_CHECK_ARG(out.data_offset + expected == file_bytes, kOp, source, ": the tensors end at byte ",
               out.data_offset + expected, ", the file has ", file_bytes, " (truncated or trailing bytes)");
  return out;
}

}  // namespace dtensor::checkpoint::detail
