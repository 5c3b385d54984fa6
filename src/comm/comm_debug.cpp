// CommDebugMode: a per-rank (thread-local) stack of live counters.
#include "dtensor/comm_debug.h"
#include "dtensor/trace.h"

#include <sstream>

namespace dtensor {
namespace {
thread_local CommDebugMode* active_mode = nullptr;
}

CommDebugMode::CommDebugMode() : previous_(active_mode) { active_mode = this; }

// Modes end in reverse order of creation (they are scoped objects).
CommDebugMode::~CommDebugMode() { active_mode = previous_; }

void CommDebugMode::record(std::string_view kind, const Group& group, int64_t bytes) {
  // Every collective issued also marks the timeline (one relaxed load when off).
  if (Tracer::enabled()) Tracer::instant(std::string(kind), "comm");
  if (!active_mode) return;
  const std::string group_name = group.defined() ? group.name() : "";
  for (CommDebugMode* mode = active_mode; mode; mode = mode->previous_) {
    Entry& e = mode->entries_[{std::string(kind), group_name}];
    ++e.calls;
    e.bytes += bytes;
  }
}

int64_t CommDebugMode::count(std::string_view kind) const {
  int64_t total = 0;
  for (const auto& [key, e] : entries_) {
    if (key.first == kind) total += e.calls;
  }
  return total;
}

int64_t CommDebugMode::count(std::string_view kind, const Group& group) const {
  auto it = entries_.find({std::string(kind), group.name()});
  return it == entries_.end() ? 0 : it->second.calls;
}

int64_t CommDebugMode::total_count() const {
  int64_t total = 0;
  for (const auto& [key, e] : entries_) total += e.calls;
  return total;
}

int64_t CommDebugMode::bytes(std::string_view kind) const {
  int64_t total = 0;
  for (const auto& [key, e] : entries_) {
    if (key.first == kind) total += e.bytes;
  }
  return total;
}

int64_t CommDebugMode::total_bytes() const {
  int64_t total = 0;
  for (const auto& [key, e] : entries_) total += e.bytes;
  return total;
}

std::map<std::string, int64_t> CommDebugMode::counts() const {
  std::map<std::string, int64_t> result;
  for (const auto& [key, e] : entries_) result[key.first] += e.calls;
  return result;
}

std::string CommDebugMode::to_string() const {
  std::ostringstream os;
  for (const auto& [key, e] : entries_) {
    os << key.first << " " << key.second << ": " << e.calls << " calls, " << e.bytes << " bytes\n";
  }
  return os.str();
}

void CommDebugMode::reset() { entries_.clear(); }

}  // namespace dtensor
