// Checkpoint file operations (files.h).
#include "checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include "util/check.h"

namespace dtensor::checkpoint::detail {

namespace {

constexpr const char* kOp = "checkpoint";

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(::dtensor::detail::concat("[", kOp, "] ", what, " \"", path, "\": ", std::strerror(errno)));
}

}  // namespace

File::File(const std::string& path, const char* mode) : path_(path) {
  const std::string_view m(mode);
  const int flags = m == "w" ? O_WRONLY | O_CREAT | O_TRUNC : m == "u" ? O_WRONLY : O_RDONLY;
  fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(m == "w" ? "cannot create" : "cannot open", path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("cannot stat", path_);
  return static_cast<int64_t>(st.st_size);
}

void File::write_all(const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write", path_);
    p += n;
    bytes -= n;
  }
}

void File::read_at(void* data, int64_t bytes, int64_t offset) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read", path_);
    DT_CHECK_ARG(n > 0, kOp, "\"", path_, "\" ends at byte ", offset, ", ", bytes,
                 " more were expected (the file is truncated)");
    p += n;
    bytes -= n;
    offset += n;
  }
}

void File::write_at(const void* data, int64_t bytes, int64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write", path_);
    p += n;
    bytes -= n;
    offset += n;
  }
}

void File::resize(int64_t bytes) {
  if (::ftruncate(fd_, bytes) != 0) fail("cannot resize", path_);
}

void File::sync() {
  if (::fsync(fd_) != 0) fail("cannot fsync", path_);
}

void write_file(const std::string& path, const std::string& bytes) {
  File f(path, "w");
  f.write_all(bytes.data(), static_cast<int64_t>(bytes.size()));
  f.sync();
}

std::string read_file(const std::string& path) {
  const File f(path, "r");
  std::string bytes(static_cast<size_t>(f.size()), '\0');
  f.read_at(bytes.data(), static_cast<int64_t>(bytes.size()), 0);
  return bytes;
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("cannot fsync directory", path);
}

std::string parent_directory(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

void fault_point(const char* point, int rank) {
  // Counts per spec: a new value of the variable (tests change it) starts afresh.
  static std::mutex mutex;
  static std::string counted_spec;
  static std::map<std::pair<int, std::string>, int64_t> reached;
  const char* spec = std::getenv("DTENSOR_CHECKPOINT_FAULT");
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (counted_spec != (spec ? spec : "")) {
      counted_spec = spec ? spec : "";
      reached.clear();
    }
  }
  if (!spec || !*spec) return;
  // "rank:R,point:P[,kind:K][,count:N]"
  int want_rank = -1;
  int64_t want_count = 1;
  std::string want_point, kind = "throw";
  std::string_view rest(spec);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view field = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t colon = field.find(':');
    DT_CHECK_ARG(colon != std::string_view::npos, "checkpoint fault",
                 "DTENSOR_CHECKPOINT_FAULT: expected rank:R,point:P[,kind:throw|kill], got \"", spec, "\"");
    const std::string key(field.substr(0, colon)), value(field.substr(colon + 1));
    if (key == "rank") {
      want_rank = std::atoi(value.c_str());
    } else if (key == "point") {
      want_point = value;
    } else if (key == "kind") {
      kind = value;
    } else if (key == "count") {
      want_count = std::atoll(value.c_str());
    }
  }
  if (want_rank != rank || want_point != point) return;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (++reached[{rank, want_point}] != want_count) return;
  }
  if (kind == "kill") ::raise(SIGKILL);
  if (kind == "stall") {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return;
  }
  throw std::runtime_error(::dtensor::detail::concat("[checkpoint fault] rank ", rank, " injected at \"", point, "\""));
}

}  // namespace dtensor::checkpoint::detail
