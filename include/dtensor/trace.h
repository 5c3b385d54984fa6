// A per-rank timeline tracer that writes Chrome trace JSON (opens in Perfetto or
// chrome://tracing).
//
//   Tracer::start("trace.json");             // enable (and remember where to write)
//   for (int64_t step = 0; step < steps; ++step) {
//     Tracer::begin_step(step);              // per rank; see record_steps
//     { TraceSpan span("forward", "compute"); ... }
//     Tracer::counter("loss", loss);
//   }
//   Tracer::stop();                          // writes trace.json, disables
//
// Events carry the rank of the calling thread as pid and tid, so with the threads
// backend one file holds every rank as its own track. Under mpirun each process holds
// only its rank's events: give start() a path containing "{rank}" and every process
// writes its own file ("trace.{rank}.json" -> "trace.1.json").
//
// Events of all threads go to one process-wide store: with launch(), call start()
// before launch and stop() after it (or from one rank between barriers).
//
// The rank of a thread is the one set by Tracer::set_rank, else the rank of its
// launch() world, else OMPI_COMM_WORLD_RANK / PMI_RANK from the environment, else 0.
//
// Cost: while disabled a TraceSpan is one relaxed atomic load and a branch. While
// enabled each event takes a mutex once (at its end): fine for ops and collectives,
// not for per-element work.
//
// Communication hook (for the comm layer; not wired here because src/comm belongs to
// its own change): the collective entry points in src/comm/collectives.cpp,
// rooted_collectives.cpp and point_to_point.cpp record each call in CommDebugMode;
// a `TraceSpan span(kind, "comm")` beside that record (covering the blocking call, or
// the issue for async forms, plus Tracer::instant(kind + " wait", "comm") in
// Work::wait) puts every collective on the timeline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {

namespace trace_detail {
extern std::atomic<bool> enabled;
// Whether the calling thread's current step is recorded (see record_steps).
bool thread_recording();
}  // namespace trace_detail

struct TraceEvent {
  std::string name;
  std::string category;
  char phase = 'X';    // 'X' complete span, 'i' instant, 'C' counter
  double ts_us = 0;    // since Tracer::start
  double dur_us = 0;   // spans only
  int pid = 0;         // the rank
  int tid = 0;         // the rank (one track per rank)
  double value = 0;    // counters only
};

class Tracer {
 public:
  // Clears earlier events, sets time zero and enables recording. `path` (optional)
  // is where stop() writes; "{rank}" in it is replaced by the writer's rank.
  static void start(const std::string& path = "");
  // Disables recording and, when start() had a path, writes it. Returns the path
  // written ("" when none).
  static std::string stop();
  static bool enabled() { return trace_detail::enabled.load(std::memory_order_relaxed); }

  // Records only steps in [first, first + count) (count < 0: all steps from first).
  // Before the first begin_step of a thread everything is recorded. Per thread, so
  // each rank marks its own steps.
  static void record_steps(int64_t first, int64_t count);
  static void record_all_steps();
  static void begin_step(int64_t step);

  // The rank attached to the calling thread's events (see the header comment).
  static void set_rank(int rank);
  static int rank();

  static void instant(const std::string& name, const std::string& category = "");
  static void counter(const std::string& name, double value);

  // A copy of every event recorded since start (all ranks of this process).
  static std::vector<TraceEvent> events();
  // Chrome trace JSON of events(): {"traceEvents":[...], "displayTimeUnit":"ms"} with
  // a process_name "rank N" per pid. "{rank}" in path is replaced by this rank.
  // Throws std::invalid_argument naming the path when it cannot be written.
  static void write(const std::string& path);
  static std::string to_json();

  // Adds a finished span (TraceSpan calls this).
  static void add_span(const char* name, const char* category,
                       std::chrono::steady_clock::time_point begin,
                       std::chrono::steady_clock::time_point end);
};

// Records a complete ("X") event from construction to destruction on this rank.
// A `const char*` name and the category must outlive the span (string literals).
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category = "") {
    if (!trace_detail::enabled.load(std::memory_order_relaxed)) return;
    if (!trace_detail::thread_recording()) return;
    name_ = name;
    category_ = category;
    begin_ = std::chrono::steady_clock::now();
  }
  // For names built at run time (copied only while recording).
  TraceSpan(const std::string& name, const char* category = "") : TraceSpan("", category) {
    if (name_ != nullptr) {
      owned_name_ = name;
      name_ = owned_name_.c_str();
    }
  }
  ~TraceSpan() {
    if (name_ != nullptr) Tracer::add_span(name_, category_, begin_, std::chrono::steady_clock::now());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_ = nullptr;
  const char* category_ = nullptr;
  std::chrono::steady_clock::time_point begin_;
  std::string owned_name_;
};

}  // namespace dtensor
