// File and directory operations of checkpoints (internal): whole writes and positioned
// reads that name the path in their errors, fsync of files and directories, and the
// test hook that crashes a save at a chosen point.
#pragma once

#include <cstdint>
#include <string>

namespace dtensor::checkpoint::detail {

// An open file descriptor, closed on destruction.
class File {
 public:
  // mode "r": read only; "w": created or truncated, write only; "u": an existing file,
  // written in place.
  File(const std::string& path, const char* mode);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int64_t size() const;
  void write_all(const void* data, int64_t bytes);
  void read_at(void* data, int64_t bytes, int64_t offset) const;
  void write_at(const void* data, int64_t bytes, int64_t offset);
  void resize(int64_t bytes);  // ftruncate
  void sync();                 // fsync
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Writes `bytes` to `path` and fsyncs it.
void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);
// fsync of a directory (so that the names it holds are durable).
void sync_directory(const std::string& path);
// The directory holding `path` ("." for a bare name).
std::string parent_directory(const std::string& path);

// DTENSOR_CHECKPOINT_FAULT="rank:R,point:P[,kind:throw|kill|stall][,count:N]": rank R of
// the saving group throws std::runtime_error("[checkpoint fault] ...") (kind throw, the
// default), sends itself SIGKILL (kill) or sleeps a second (stall, a slow or hung
// rank) the N-th time (default 1; counted per process) its saves reach point P:
//   written    after its data file is written and synced
//   manifest   rank 0 only: after manifest.json is written, before the rename
//   committed  rank 0 only: after the rename, before the others are told
void fault_point(const char* point, int rank);

}  // namespace dtensor::checkpoint::detail
