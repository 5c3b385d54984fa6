// The flight recorder: entries, tokens, the JSON dump and the dumps on failure.
#include "comm/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/call_context.h"
#include "comm/comm_backend.h"
#include "dtensor/flight_recorder.h"
#include "util/check.h"

namespace dtensor::comm {

namespace {

using json = nlohmann::json;
using SystemClock = std::chrono::system_clock;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(SystemClock::now().time_since_epoch()).count();
}

constexpr int64_t kDefaultEntries = 2000;

// DTENSOR_FLIGHT_RECORDER_ENTRIES, read once per process.
int64_t capacity_from_env() {
  static const int64_t capacity = [] {
    const char* text = std::getenv("DTENSOR_FLIGHT_RECORDER_ENTRIES");
    if (!text || !*text) return kDefaultEntries;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    DT_CHECK_ARG(end != text && *end == '\0' && value >= 0 && value <= (int64_t{1} << 24),
                 "DTENSOR_FLIGHT_RECORDER_ENTRIES", "expected a number of entries from 0 to 16777216, got '", text,
                 "'");
    return static_cast<int64_t>(value);
  }();
  return capacity;
}

// Every live recorder of the process, for dumps that are not made from a rank's own
// call (launch's end, the MPI watchdog).
std::mutex registry_mutex;
std::vector<const FlightRecorder*>& registry() {
  static auto* list = new std::vector<const FlightRecorder*>;  // used during static destruction too
  return *list;
}

std::string context_of_current_call() {
  const CallContext& c = CallContext::current();
  if (c.user_call.empty()) return {};
  std::string text(c.user_call);
  if (!c.purpose.empty()) text.append(": ").append(c.purpose);
  return text;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SystemClock::now().time_since_epoch()).count();
}
// Files older than this process are a previous job's.
const int64_t process_start_ns = now_ns();
// The time of the newest dump request this process has honoured.
std::atomic<int64_t> honoured_request_ns{process_start_ns};

int64_t file_time_ns(const std::filesystem::path& path) {
  std::error_code error;
  const auto t = std::filesystem::last_write_time(path, error);
  if (error) return -1;
  const auto system = std::chrono::file_clock::to_sys(t);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(system.time_since_epoch()).count();
}

}  // namespace

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::Issued: return "issued";
    case FlightState::Started: return "started";
    case FlightState::Completed: return "completed";
    case FlightState::Failed: return "failed";
  }
  return "?";
}

// ---- FlightToken -----------------------------------------------------------------------

FlightToken::FlightToken(std::shared_ptr<FlightRecorder> recorder, int group, uint64_t id)
    : recorder_(std::move(recorder)), group_(group), id_(id), exceptions_(std::uncaught_exceptions()) {
  CallContext::current().flight = {recorder_.get(), group_, id_};
}

FlightToken::FlightToken(FlightToken&& other) noexcept
    : recorder_(std::move(other.recorder_)), group_(other.group_), id_(other.id_), exceptions_(other.exceptions_) {}

FlightToken& FlightToken::operator=(FlightToken&& other) noexcept {
  if (this != &other) {
    if (recorder_) finish(FlightState::Completed);
    recorder_ = std::move(other.recorder_);
    group_ = other.group_;
    id_ = other.id_;
    exceptions_ = other.exceptions_;
  }
  return *this;
}

FlightToken::~FlightToken() {
  if (recorder_) finish(std::uncaught_exceptions() > exceptions_ ? FlightState::Failed : FlightState::Completed);
}

void FlightToken::started() {
  if (!recorder_) return;
  recorder_->set_state(group_, id_, FlightState::Started, nullptr);
  if (CallContext::current().flight.id == id_) CallContext::current().flight = {};
}

void FlightToken::completed() { finish(FlightState::Completed); }
void FlightToken::failed() { finish(FlightState::Failed); }

void FlightToken::dropped(std::weak_ptr<void> buffers) {
  if (!recorder_) return;
  recorder_->set_state(group_, id_, FlightState::Started, &buffers);
  recorder_.reset();
}

void FlightToken::finish(FlightState state) {
  if (!recorder_) return;
  if (CallContext::current().flight.id == id_) CallContext::current().flight = {};
  const std::shared_ptr<FlightRecorder> recorder = std::move(recorder_);
  recorder->set_state(group_, id_, state, nullptr);
  if (state == FlightState::Failed) recorder->dump_on_failure("a communication call failed");
}

// ---- FlightRecorder --------------------------------------------------------------------

std::shared_ptr<FlightRecorder> FlightRecorder::make(int rank, int world_size, std::string backend) {
  const int64_t capacity = capacity_from_env();
  if (capacity == 0) return nullptr;
  return std::make_shared<FlightRecorder>(rank, world_size, std::move(backend), capacity);
}

FlightRecorder::FlightRecorder(int rank, int world_size, std::string backend, int64_t capacity)
    : rank_(rank), world_size_(world_size), backend_(std::move(backend)), capacity_(static_cast<size_t>(capacity)) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().push_back(this);
}

FlightRecorder::~FlightRecorder() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::erase(registry(), this);
}

FlightToken FlightRecorder::record(GroupImpl& group, const FlightCall& call) {
  const bool p2p = call.peer >= 0;
  Entry entry;
  entry.call = call;
  entry.p2p = p2p;
  entry.context = context_of_current_call();
  entry.issued_us = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  if (group.flight_group_ < 0) {
    group.flight_group_ = static_cast<int>(groups_.size());
    GroupRecord& g = groups_.emplace_back();
    g.backend = group.backend();
    g.ranks = group.world_ranks();
    g.rank = group.rank();
    g.size = group.size();
  }
  GroupRecord& g = groups_[group.flight_group_];
  g.name = group.name();  // a mesh names its groups after creation
  if (p2p) {
    const std::tuple<int, int, bool> key{call.peer, call.tag, std::string_view(call.op) == "send"};
    auto it = std::find_if(g.matches.begin(), g.matches.end(), [&](const auto& m) { return m.first == key; });
    if (it == g.matches.end()) it = g.matches.insert(g.matches.end(), {key, 0});
    entry.seq = it->second++;
    ++g.p2p_calls;
  } else {
    entry.seq = g.calls++;
  }
  entry.id = next_id_++;
  // The ring grows by doubling while it is full and below capacity, then wraps.
  if (g.ring_next == g.ring.size() && g.ring.size() < capacity_) {
    g.ring.resize(std::min(capacity_, std::max<size_t>(16, g.ring.size() * 2)));
  }
  g.ring[g.ring_next++ % g.ring.size()] = std::move(entry);
  return FlightToken(group.flight_recorder_, group.flight_group_, next_id_ - 1);
}

FlightRecorder::Entry* FlightRecorder::find(int group, uint64_t id) {
  GroupRecord& g = groups_[group];
  // Usually the newest entries; an id older than the ring holds was overwritten.
  for (size_t k = 0; k < g.ring.size() && k < g.ring_next; ++k) {
    Entry& e = g.ring[(g.ring_next - 1 - k) % g.ring.size()];
    if (e.id == id) return &e;
    if (e.id < id) return nullptr;
  }
  return nullptr;
}

void FlightRecorder::set_state(int group, uint64_t id, FlightState state, const std::weak_ptr<void>* dropped_buffers) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = find(group, id);
  if (!e) return;
  // A deferred call is completed by its backend, not by the public call returning.
  if (e->deferred && state == FlightState::Completed) return;
  e->state = state;
  if (state == FlightState::Completed || state == FlightState::Failed) e->done_us = now_us();
  if (dropped_buffers) {
    e->dropped = true;
    e->buffers = *dropped_buffers;
  }
}

void FlightRecorder::defer(int group, uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(group, id)) {
    e->deferred = true;
    if (e->state == FlightState::Issued) e->state = FlightState::Started;
  }
}

void FlightRecorder::complete(int group, uint64_t id, FlightState state) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(group, id)) {
    e->state = state;
    e->done_us = now_us();
  }
}

std::string FlightRecorder::to_json(std::string_view reason) const {
  json groups = json::array();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const GroupRecord& g : groups_) {
    json entries = json::array();
    const uint64_t held = std::min<uint64_t>(g.ring_next, g.ring.size());
    for (uint64_t k = g.ring_next - held; k < g.ring_next; ++k) {
      const Entry& e = g.ring[k % g.ring.size()];
      // A dropped call is done once the backend let go of its buffers.
      const bool released = e.dropped && e.state == FlightState::Started && e.buffers.expired();
      const FlightState state = released ? FlightState::Completed : e.state;
      json j = {{"seq", e.seq},          {"op", e.call.op},         {"dtype", dtype_name(e.call.dtype)},
                {"in", e.call.in_count}, {"out", e.call.out_count}, {"state", flight_state_name(state)},
                {"async", e.call.async}, {"issued_us", e.issued_us}};
      if (e.call.root >= 0) j["root"] = e.call.root;
      if (e.p2p) {
        j["peer"] = e.call.peer;
        j["tag"] = e.call.tag;
      }
      if (e.dropped) j["dropped"] = true;
      if (e.done_us) j["done_us"] = e.done_us;
      if (!e.context.empty()) j["context"] = e.context;
      entries.push_back(std::move(j));
    }
    groups.push_back({{"name", g.name},
                      {"backend", g.backend},
                      {"ranks", g.ranks},
                      {"rank", g.rank},
                      {"size", g.size},
                      {"calls", g.calls},
                      {"p2p_calls", g.p2p_calls},
                      {"entries", std::move(entries)}});
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const json record = {{"format", "dtensor-flight-record"},
                       {"version", 1},
                       {"rank", rank_},
                       {"world_size", world_size_},
                       {"backend", backend_},
                       {"host", host},
                       {"pid", static_cast<int64_t>(getpid())},
                       {"capacity", capacity_},
                       {"dumped_us", now_us()},
                       {"reason", std::string(reason)},
                       {"groups", std::move(groups)}};
  return record.dump(1);
}

std::string FlightRecorder::dump(const std::string& dir, std::string_view reason) const {
  namespace fs = std::filesystem;
  const std::string text = to_json(reason);
  std::error_code error;
  fs::create_directories(dir, error);
  const fs::path path = fs::path(dir) / ("rank-" + std::to_string(rank_) + ".json");
  // Unique per writer: two threads of one rank may dump at once (a failure and launch's end).
  const fs::path temporary =
      fs::path(dir) / (".rank-" + std::to_string(rank_) + "." + std::to_string(getpid()) + "." +
                       std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) + ".tmp");
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    DT_CHECK_SUPPORTED(out.good(), "flight_recorder", "cannot write ", temporary.string());
  }
  fs::rename(temporary, path, error);
  if (error) {
    fs::remove(temporary, error);
    throw std::runtime_error(detail::concat("[flight_recorder] cannot write ", path.string()));
  }
  return path.string();
}

std::string FlightRecorder::dump_dir() {
  const char* dir = std::getenv("DTENSOR_FLIGHT_RECORDER");
  return dir && *dir ? dir : "";
}

void FlightRecorder::dump_on_failure(std::string_view reason) const noexcept {
  const std::string dir = dump_dir();
  if (dir.empty()) return;
  try {
    dump(dir, reason);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[dtensor] flight recorder of rank %d: %s\n", rank_, e.what());
  }
}

void FlightRecorder::dump_all_on_failure(std::string_view reason) noexcept {
  if (dump_dir().empty()) return;
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const FlightRecorder* recorder : registry()) recorder->dump_on_failure(reason);
}

void FlightRecorder::request_dumps(const std::string& dir, int from_rank) noexcept {
  try {
    std::filesystem::create_directories(dir);
    std::ofstream(std::filesystem::path(dir) / "dump-request", std::ios::trunc) << "rank " << from_rank << "\n";
  } catch (const std::exception&) {
    // The other processes then dump only when they fail themselves.
  }
}

void FlightRecorder::wait_for_dumps(const std::string& dir, int world_size,
                                    std::chrono::milliseconds patience) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (std::chrono::steady_clock::now() < deadline) {
    int fresh = 0;
    for (int r = 0; r < world_size; ++r) {
      fresh += file_time_ns(std::filesystem::path(dir) / ("rank-" + std::to_string(r) + ".json")) >= process_start_ns;
    }
    if (fresh == world_size) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void FlightRecorder::poll_dump_request() noexcept {
  const std::string dir = dump_dir();
  if (dir.empty()) return;
  const int64_t requested = file_time_ns(std::filesystem::path(dir) / "dump-request");
  if (requested < 0) return;
  int64_t honoured = honoured_request_ns.load();
  if (requested <= honoured || !honoured_request_ns.compare_exchange_strong(honoured, requested)) return;
  dump_all_on_failure("another rank asked for a dump (it failed or timed out)");
}

}  // namespace dtensor::comm

namespace dtensor {

std::string flight_record_json(const Group& group) {
  DT_CHECK_ARG(group.defined(), "flight_record_json", "expected a defined group, got an undefined one");
  const auto& recorder = group.impl()->flight_recorder();
  return recorder ? recorder->to_json("on demand") : std::string();
}

std::string dump_flight_record(const Group& group, const std::string& dir) {
  const char* kOp = "dump_flight_record";
  DT_CHECK_ARG(group.defined(), kOp, "expected a defined group, got an undefined one");
  const std::string target = dir.empty() ? comm::FlightRecorder::dump_dir() : dir;
  DT_CHECK_ARG(!target.empty(), kOp, "expected a directory, got none (pass one or set DTENSOR_FLIGHT_RECORDER)");
  const auto& recorder = group.impl()->flight_recorder();
  DT_CHECK_SUPPORTED(recorder != nullptr, kOp, "group '", group.name(),
                     "' has no flight recorder (DTENSOR_FLIGHT_RECORDER_ENTRIES=0, or a group made alone)");
  return recorder->dump(target, "on demand");
}

}  // namespace dtensor
