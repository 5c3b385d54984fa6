// Communication counters of this rank, like PyTorch's CommDebugMode.
//
//   CommDebugMode comm;
//   y = all_reduce(tp, x);
//   EXPECT_EQ(comm.count("all_reduce"), 1);
//
// While a CommDebugMode lives, every collective and point-to-point call issued by
// this rank (this thread under `launch`, this process under MPI) is counted by kind
// ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
// "gather", "scatter", "barrier", "send", "recv", "split"), by group name and by
// bytes. Calls are counted when issued, sync or async, including those on groups of
// size 1 (which do no communication). Internal size exchanges (e.g. all_gather
// without sizes) are not counted. Bytes are this rank's input bytes (for broadcast
// and recv: the tensor's bytes). Modes nest: every live mode on the rank counts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "dtensor/group.h"

namespace dtensor {

class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  int64_t count(std::string_view kind) const;
  int64_t count(std::string_view kind, const Group& group) const;
  int64_t total_count() const;
  int64_t bytes(std::string_view kind) const;
  int64_t total_bytes() const;
  // kind -> calls.
  std::map<std::string, int64_t> counts() const;
  // One line per (kind, group): "all_reduce world: 2 calls, 64 bytes".
  std::string to_string() const;
  void reset();

  // Called by the collectives (not by users).
  static void record(std::string_view kind, const Group& group, int64_t bytes);

 private:
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  std::map<std::pair<std::string, std::string>, Entry> entries_;  // (kind, group name)
  CommDebugMode* previous_ = nullptr;
};

}  // namespace dtensor
