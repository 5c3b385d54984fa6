// The named-tensor file format of state_file.h.
#include "dtensor/nn/state_file.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::nn {
namespace {

constexpr char kOp[] = "state_file";
constexpr char kMagic[8] = {'D', 'T', 'S', 'T', 'A', 'T', 'E', '\0'};
constexpr uint32_t kVersion = 1;
constexpr int kMaxDims = 64;

static_assert(std::endian::native == std::endian::little,
              "the state file stores little-endian elements as they are in memory");

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

template <class T>
void put(std::string& out, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.append(raw, sizeof(T));
}

void put_string(std::string& out, const std::string& s, const std::string& what) {
  DT_CHECK_ARG(s.size() <= UINT32_MAX, kOp, what, " of ", s.size(), " bytes is too long");
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out += s;
}

// Reads the bytes in order; every read checks what is left.
class Reader {
 public:
  Reader(std::string_view bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  template <class T>
  T get(const char* what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what).data(), sizeof(T));
    return value;
  }
  std::string get_string(const char* what) { return std::string(take(get<uint32_t>(what), what)); }
  std::string_view take(uint64_t n, const char* what) {
    DT_CHECK_ARG(n <= bytes_.size() - pos_, kOp, source_, ": truncated at byte ", pos_, " reading ", what, " (", n,
                 " bytes wanted, ", bytes_.size() - pos_, " left)");
    const std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  size_t position() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }

 private:
  std::string_view bytes_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

std::string serialize_state(const std::map<std::string, Tensor>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, metadata.size());
  for (const auto& [key, value] : metadata) {
    put_string(out, key, "metadata key");
    put_string(out, value, "metadata value of '" + key + "'");
  }
  put<uint64_t>(out, tensors.size());
  for (const auto& [name, tensor] : tensors) {
    DT_CHECK_ARG(tensor.defined(), kOp, "tensor '", name, "' is undefined");
    DT_CHECK_ARG(tensor.dim() <= kMaxDims, kOp, "tensor '", name, "' has ", tensor.dim(), " dims, at most ", kMaxDims);
    const Tensor t = tensor.to(Device::cpu()).contiguous();
    put_string(out, name, "tensor name");
    put<uint8_t>(out, static_cast<uint8_t>(t.dtype()));
    put<uint8_t>(out, static_cast<uint8_t>(t.dim()));
    for (const int64_t size : t.shape()) put<int64_t>(out, size);
    put<uint64_t>(out, t.nbytes());
    out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  put<uint64_t>(out, fnv1a(out));
  return out;
}

StateFile deserialize_state(std::string_view bytes, const std::string& source) {
  Reader in(bytes, source);
  DT_CHECK_ARG(in.left() >= sizeof(kMagic) && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0, kOp, source,
               ": not a dtensor state file (it does not start with \"DTSTATE\")");
  in.take(sizeof(kMagic), "the magic");
  const uint32_t version = in.get<uint32_t>("the version");
  DT_CHECK_ARG(version == kVersion, kOp, source, ": format version ", version, ", this build reads version ", kVersion);
  // The checksum first: a damaged file is reported as such, not by whichever field the
  // damage happened to hit.
  DT_CHECK_ARG(bytes.size() >= sizeof(kMagic) + 4 + 8 + 8 + 8, kOp, source, ": truncated (", bytes.size(), " bytes)");
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  const uint64_t computed = fnv1a(bytes.substr(0, bytes.size() - 8));
  DT_CHECK_ARG(stored == computed, kOp, source, ": checksum mismatch (the file is damaged or truncated)");

  StateFile f;
  const uint64_t entries = in.get<uint64_t>("the metadata count");
  for (uint64_t i = 0; i < entries; ++i) {
    std::string key = in.get_string("a metadata key");
    std::string value = in.get_string("a metadata value");
    DT_CHECK_ARG(f.metadata.emplace(std::move(key), std::move(value)).second, kOp, source,
                 ": metadata key repeated");
  }
  const uint64_t count = in.get<uint64_t>("the tensor count");
  for (uint64_t i = 0; i < count; ++i) {
    std::string name = in.get_string("a tensor name");
    const uint8_t code = in.get<uint8_t>("a dtype");
    DT_CHECK_ARG(code <= static_cast<uint8_t>(DType::Bool), kOp, source, ": tensor '", name, "' has dtype code ",
                 static_cast<int>(code), ", which is none of this build's");
    const DType dtype = static_cast<DType>(code);
    const int ndim = in.get<uint8_t>("a dim count");
    DT_CHECK_ARG(ndim <= kMaxDims, kOp, source, ": tensor '", name, "' has ", ndim, " dims, at most ", kMaxDims);
    Shape shape;
    uint64_t numel = 1;
    for (int d = 0; d < ndim; ++d) {
      const int64_t size = in.get<int64_t>("a size");
      DT_CHECK_ARG(size >= 0 && (size == 0 || numel <= UINT64_MAX / static_cast<uint64_t>(size)), kOp, source,
                   ": tensor '", name, "' has size ", size, " in dim ", d);
      numel *= static_cast<uint64_t>(size);
      shape.push_back(size);
    }
    const uint64_t nbytes = in.get<uint64_t>("a byte count");
    DT_CHECK_ARG(nbytes / dtype_size(dtype) == numel && nbytes % dtype_size(dtype) == 0, kOp, source, ": tensor '",
                 name, "' of shape ", shape, " and dtype ", dtype_name(dtype), " has ", nbytes, " bytes, expected ",
                 numel * dtype_size(dtype));
    const std::string_view data = in.take(nbytes, "tensor data");
    Tensor t = Tensor::empty(shape, dtype);
    if (nbytes > 0) std::memcpy(t.data_ptr(), data.data(), nbytes);
    DT_CHECK_ARG(f.tensors.emplace(name, std::move(t)).second, kOp, source, ": tensor '", name, "' appears twice");
  }
  in.take(8, "the checksum");
  DT_CHECK_ARG(in.left() == 0, kOp, source, ": ", in.left(), " bytes after the checksum");
  return f;
}

void save_state_file(const std::string& path, const std::map<std::string, Tensor>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  const std::string bytes = serialize_state(tensors, metadata);
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    DT_CHECK_ARG(out.good(), kOp, "cannot write \"", partial, "\"");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    DT_CHECK_ARG(out.good(), kOp, "writing \"", partial, "\" failed");
  }
  DT_CHECK_ARG(std::rename(partial.c_str(), path.c_str()) == 0, kOp, "cannot rename \"", partial, "\" to \"", path,
               "\"");
}

StateFile load_state_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DT_CHECK_ARG(in.good(), kOp, "cannot open \"", path, "\"");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return deserialize_state(bytes.str(), path);
}

}  // namespace dtensor::nn
