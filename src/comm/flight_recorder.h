// The flight recorder (include/dtensor/flight_recorder.h is the public side): every
// rank keeps the last N communication calls of each of its groups, whatever the
// backend, so that a hung or failed job says which call each rank was in.
//
// One FlightRecorder per rank: per launch rank thread on `threads`, per process on
// `mpi` (and later per process on `nccl`). Every group of the rank holds it (the world
// gets it at creation, Group::split hands it to the children). A public communication
// call records an entry when it starts (comm::begin_call, after the fault-injection
// point) and gets a FlightToken that follows the call: completed when a synchronous
// call returns, handed to the async call's Work otherwise, failed when an exception
// leaves the call. Groups of one rank record nothing (they do not communicate).
//
// States: "issued" (this rank entered the call; a synchronous call stays there while
// it waits for its peers), "started" (an async call the backend has posted and not yet
// seen complete), "completed", "failed". Collectives are numbered per group in the
// order this rank made them ("seq", the same on every rank of a correct program);
// sends and receives per group, peer, tag and direction ("match": the k-th send from
// a to b with tag t is the k-th receive of b from a with tag t).
//
// A backend whose calls complete after they return (nccl: when the GPU has run them)
// takes the call's record over (defer): the token then leaves it "started", and the
// backend marks it completed or failed when it knows (complete).
//
// Costs: a mutex, a clock read and an entry copy per call (~0.1 us); nothing on a
// group of one rank; nothing at all with DTENSOR_FLIGHT_RECORDER_ENTRIES=0.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/dtype.h"

namespace dtensor::comm {

class GroupImpl;

enum class FlightState : uint8_t { Issued, Started, Completed, Failed };
const char* flight_state_name(FlightState state);  // "issued", ...

// What a public call describes of itself.
struct FlightCall {
  const char* op = "";
  DType dtype = DType::F32;
  int64_t in_count = 0, out_count = 0;  // elements of this rank's input and output
  int root = -1;                        // rooted collectives
  int peer = -1, tag = 0;               // send and recv: the peer's rank in the group
  bool async = false;
};

class FlightRecorder;

// One recorded call in flight (move-only). Sync calls let it go out of scope: it
// completes the entry, or fails it when an exception is unwinding. Async calls hand
// it to their Work with started().
class FlightToken {
 public:
  FlightToken() = default;
  FlightToken(std::shared_ptr<FlightRecorder> recorder, int group, uint64_t id);
  FlightToken(FlightToken&& other) noexcept;
  FlightToken& operator=(FlightToken&& other) noexcept;
  FlightToken(const FlightToken&) = delete;
  FlightToken& operator=(const FlightToken&) = delete;
  ~FlightToken();

  explicit operator bool() const { return recorder_ != nullptr; }
  void started();
  void completed();
  void failed();
  // The caller dropped the async Work before it completed: the entry stays "started"
  // while `buffers` (what the backend retains until the operation completes) live.
  void dropped(std::weak_ptr<void> buffers);

 private:
  void finish(FlightState state);
  std::shared_ptr<FlightRecorder> recorder_;
  int group_ = -1;
  uint64_t id_ = 0;
  int exceptions_ = 0;  // std::uncaught_exceptions() when made
};

class FlightRecorder {
 public:
  // nullptr when DTENSOR_FLIGHT_RECORDER_ENTRIES is 0. `rank` is the launch rank
  // (threads) or the MPI_COMM_WORLD rank: what the dump file is named after.
  static std::shared_ptr<FlightRecorder> make(int rank, int world_size, std::string backend);
  FlightRecorder(int rank, int world_size, std::string backend, int64_t capacity);
  ~FlightRecorder();

  int rank() const { return rank_; }
  FlightToken record(GroupImpl& group, const FlightCall& call);
  // The backend takes over entry `id` of `group` (see above); complete() ends it.
  void defer(int group, uint64_t id);
  void complete(int group, uint64_t id, FlightState state);

  // The record as JSON (the dump format, docs/communication.md "Flight recorder").
  // Safe from any thread (a watchdog's too).
  std::string to_json(std::string_view reason) const;
  // Writes `dir`/rank-<rank>.json whole or not at all (a temporary file renamed);
  // returns its path.
  std::string dump(const std::string& dir, std::string_view reason) const;

  // DTENSOR_FLIGHT_RECORDER, or "" when dumps are off.
  static std::string dump_dir();
  // Dumps on failure: when DTENSOR_FLIGHT_RECORDER is set, this recorder (or every
  // live one of the process) into it. Never throws: it runs on error paths; a dump
  // that cannot be written says so on stderr.
  void dump_on_failure(std::string_view reason) const noexcept;
  static void dump_all_on_failure(std::string_view reason) noexcept;

  // Asks the other processes of the job (whose watchdogs poll for it) to dump too:
  // the file `dir`/dump-request.
  static void request_dumps(const std::string& dir, int from_rank) noexcept;
  // Waits up to `patience` until `dir` holds a dump of every rank written since this
  // process started.
  static void wait_for_dumps(const std::string& dir, int world_size, std::chrono::milliseconds patience) noexcept;
  // Called by a watchdog every few hundred milliseconds: dumps every live recorder
  // when another process has requested it since the last time.
  static void poll_dump_request() noexcept;

 private:
  friend class FlightToken;
  struct Entry {
    uint64_t id = 0;  // 0: an empty slot
    uint64_t seq = 0;
    FlightCall call;
    bool p2p = false;
    FlightState state = FlightState::Issued;
    bool dropped = false;
    bool deferred = false;  // the backend marks it completed
    std::string context;    // the user-level call and the purpose (call_context.h)
    int64_t issued_us = 0, done_us = 0;
    std::weak_ptr<void> buffers;  // of a dropped call: expired once the backend is done
  };
  struct GroupRecord {
    std::string name, backend;
    std::vector<int> ranks;  // world ranks of the members, in group order ({} unknown)
    int rank = 0, size = 1;
    uint64_t calls = 0, p2p_calls = 0;
    std::vector<std::pair<std::tuple<int, int, bool>, uint64_t>> matches;  // (peer, tag, send) -> next
    std::vector<Entry> ring;
    uint64_t ring_next = 0;  // entries ever recorded; the slot is ring_next % capacity
  };
  Entry* find(int group, uint64_t id);
  void set_state(int group, uint64_t id, FlightState state, const std::weak_ptr<void>* dropped_buffers);

  const int rank_, world_size_;
  const std::string backend_;
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<GroupRecord> groups_;
  uint64_t next_id_ = 1;
};

}  // namespace dtensor::comm
