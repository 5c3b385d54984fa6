// The process-wide event store behind Tracer, and its Chrome trace JSON writer.
#include "dtensor/trace.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dtensor/error.h"
#include "dtensor/group.h"
#include "util/check.h"

namespace dtensor {

namespace trace_detail {
std::atomic<bool> enabled{false};
}  // namespace trace_detail

namespace {

using Clock = std::chrono::steady_clock;

struct Store {
  std::mutex mutex;
  std::vector<TraceEvent> events;
  Clock::time_point origin = Clock::now();
  std::string path;
};

Store& store() {
  static Store* s = new Store();  // never destroyed: spans may end during static teardown
  return *s;
}

// Per thread (= per rank under launch): step filter and rank.
struct ThreadState {
  int64_t first = 0;
  int64_t count = -1;  // < 0: unbounded
  int64_t step = -1;   // -1: before the first begin_step
  bool recording = true;
  int rank = -1;       // -1: not resolved yet
};
thread_local ThreadState thread_state;

void update_recording(ThreadState& t) {
  t.recording = t.step < 0 || (t.step >= t.first && (t.count < 0 || t.step < t.first + t.count));
}

int resolve_rank() {
  const Group threads_world = init("threads");  // this rank's world inside launch
  if (threads_world.size() > 1) return threads_world.rank();
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

double micros_since_origin(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t - store().origin).count();
}

void push(TraceEvent event) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.events.push_back(std::move(event));
}

TraceEvent make_event(const std::string& name, const std::string& category, char phase,
                      Clock::time_point at) {
  TraceEvent e;
  e.name = name;
  e.category = category;
  e.phase = phase;
  e.ts_us = micros_since_origin(at);
  e.pid = e.tid = Tracer::rank();
  return e;
}

// A JSON string literal (nlohmann's escaping); bytes that are not UTF-8 become
// U+FFFD, so the file stays valid JSON whatever a span is named.
void append_json_string(std::ostringstream& os, const std::string& s) {
  os << nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string with_rank(const std::string& path) {
  std::string out = path;
  const std::string token = "{rank}";
  for (size_t at = out.find(token); at != std::string::npos; at = out.find(token)) {
    out.replace(at, token.size(), std::to_string(Tracer::rank()));
  }
  return out;
}

}  // namespace

bool trace_detail::thread_recording() { return thread_state.recording; }

void Tracer::start(const std::string& path) {
  Store& s = store();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.clear();
    s.origin = Clock::now();
    s.path = path;
  }
  trace_detail::enabled.store(true, std::memory_order_relaxed);
}

std::string Tracer::stop() {
  trace_detail::enabled.store(false, std::memory_order_relaxed);
  std::string path;
  {
    std::lock_guard<std::mutex> lock(store().mutex);
    path = store().path;
  }
  if (path.empty()) return "";
  write(path);
  return with_rank(path);
}

void Tracer::record_steps(int64_t first, int64_t count) {
  DT_CHECK_ARG(first >= 0, "trace", "expected the first recorded step >= 0, got ", first);
  thread_state.first = first;
  thread_state.count = count;
  update_recording(thread_state);
}

void Tracer::record_all_steps() { record_steps(0, -1); }

void Tracer::begin_step(int64_t step) {
  thread_state.step = step;
  update_recording(thread_state);
}

void Tracer::set_rank(int rank) {
  DT_CHECK_ARG(rank >= 0, "trace", "expected rank >= 0, got ", rank);
  thread_state.rank = rank;
}

int Tracer::rank() {
  if (thread_state.rank < 0) thread_state.rank = resolve_rank();
  return thread_state.rank;
}

void Tracer::instant(const std::string& name, const std::string& category) {
  if (!enabled() || !thread_state.recording) return;
  push(make_event(name, category, 'i', Clock::now()));
}

void Tracer::counter(const std::string& name, double value) {
  if (!enabled() || !thread_state.recording) return;
  TraceEvent e = make_event(name, "counter", 'C', Clock::now());
  e.value = value;
  push(std::move(e));
}

void Tracer::add_span(const char* name, const char* category, Clock::time_point begin,
                      Clock::time_point end) {
  TraceEvent e = make_event(name, category, 'X', begin);
  e.dur_us = std::chrono::duration<double, std::micro>(end - begin).count();
  push(std::move(e));
}

std::vector<TraceEvent> Tracer::events() {
  std::lock_guard<std::mutex> lock(store().mutex);
  return store().events;
}

std::string Tracer::to_json() {
  const std::vector<TraceEvent> all = events();
  std::ostringstream os;
  os.precision(15);
  os << "{\"traceEvents\":[";
  std::set<int> pids;
  bool first = true;
  for (const TraceEvent& e : all) {
    os << (first ? "\n" : ",\n") << "{\"name\":";
    first = false;
    append_json_string(os, e.name);
    os << ",\"cat\":";
    append_json_string(os, e.category);
    os << ",\"ph\":\"" << e.phase << "\",\"ts\":" << e.ts_us;
    if (e.phase == 'X') os << ",\"dur\":" << e.dur_us;
    if (e.phase == 'i') os << ",\"s\":\"t\"";
    os << ",\"pid\":" << e.pid << ",\"tid\":" << e.tid;
    if (e.phase == 'C') {
      os << ",\"args\":{";
      append_json_string(os, e.name);
      os << ":" << e.value << "}";
    }
    os << "}";
    pids.insert(e.pid);
  }
  // Track names, so Perfetto shows "rank 0", "rank 1" rather than bare numbers.
  for (int pid : pids) {
    os << (first ? "\n" : ",\n") << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid
       << ",\"tid\":" << pid << ",\"args\":{\"name\":\"rank " << pid << "\"}}";
    first = false;
  }
  os << "\n],\"displayTimeUnit\":\"ms\"}\n";
  return os.str();
}

void Tracer::write(const std::string& path) {
  const std::string target = with_rank(path);
  std::ofstream out(target);
  DT_CHECK_ARG(out.good(), "trace", "cannot write trace file \"", target, "\"");
  out << to_json();
  out.close();
  DT_CHECK_ARG(!out.fail(), "trace", "error writing trace file \"", target, "\"");
}

}  // namespace dtensor
