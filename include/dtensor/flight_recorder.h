// The flight recorder: what each rank's communication was doing when a job hung or
// failed (PyTorch's NCCL flight recorder, for every backend).
//
// Every rank keeps the last DTENSOR_FLIGHT_RECORDER_ENTRIES (default 2000; 0 turns it
// off) communication calls of each of its groups: the op, the group's call number
// ("seq"), dtype, element counts, root or peer and tag, the library call it was part
// of ("redistribute S(0)->R"), when it was issued and completed, and its state:
//   issued     this rank entered the call (a synchronous call waits here for its peers)
//   started    an async call the backend has posted and not yet completed
//   completed  / failed
// With DTENSOR_FLIGHT_RECORDER=DIR set, the records are written to DIR/rank-<k>.json
// (k: the launch rank, or the MPI_COMM_WORLD rank) when a call fails or times out,
// when `launch` ends with a failed rank (every rank's record), and when the MPI
// watchdog aborts a job (every process's: the others dump on its request before the
// abort ends them). `dump_flight_record` writes one on demand. Files are written
// whole or not at all.
//
// `analyze_flight_records(DIR)` (the dtensor-flight tool) reads the dumps of all ranks
// and names the first call on which they disagree (op, dtype, sizes or root), the rank
// that never arrived at a call its peers wait in (and where it was instead), the send
// or receive no peer matched, and the ranks that left no record.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/group.h"

namespace dtensor {

// The record of the rank `group` belongs to (all of that rank's groups), as the JSON
// the dumps hold. std::invalid_argument for an undefined group; "" when recording is
// off (DTENSOR_FLIGHT_RECORDER_ENTRIES=0) or the group is one made without a recorder.
std::string flight_record_json(const Group& group);
// Writes that record to `dir`/rank-<k>.json (`dir` empty: DTENSOR_FLIGHT_RECORDER,
// which must then be set) and returns the file's path.
std::string dump_flight_record(const Group& group, const std::string& dir = "");

// What the dumps in a directory say (docs/communication.md, "Flight recorder").
struct FlightFinding {
  enum class Kind : uint8_t {
    Mismatch,      // ranks made different calls at the same seq of a group
    NeverArrived,  // some ranks wait in a call a member of the group never made
    Unmatched,     // a send or receive waiting for a peer that never posted its match
    Failed,        // a call failed on some rank (a timeout, a failed peer)
    NoRecord       // a rank of the job left no dump
  };
  Kind kind = Kind::Mismatch;
  std::string group;       // "" for NoRecord
  int64_t seq = -1;        // the call number in the group (or the message number)
  std::vector<int> ranks;  // the ranks it names (the one never arrived, the mismatching ones)
  int64_t issued_us = 0;   // when the call was first issued (for ordering)
  std::string message;     // one paragraph for a person
};
struct FlightAnalysis {
  int world_size = 0;
  std::vector<int> ranks_read;          // ranks whose dumps were read
  std::vector<FlightFinding> findings;  // the first per group, then the rest; earliest first
  // Ranks that stopped communicating while peers waited for them: named by a finding
  // and not themselves waiting in any call (their last call completed), or without a
  // record. Those waiting only for a suspect are not listed.
  std::vector<int> suspects;
  bool consistent() const { return findings.empty(); }
  std::string report() const;  // what dtensor-flight prints
};
// Reads every rank-<k>.json in `dir`. std::invalid_argument naming the file for a
// file that is not a flight record; std::runtime_error when `dir` holds none.
FlightAnalysis analyze_flight_records(const std::string& dir);

}  // namespace dtensor
