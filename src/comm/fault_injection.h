// Fault injection, a test hook: DTENSOR_FAULT="rank:k,call:n,kind:K" makes rank k
// (the launch rank on threads, the MPI_COMM_WORLD rank on mpi) fail at its n-th
// communication call (1-based; every public collective, point-to-point call and
// split counts, on any group, sync or async). Kinds:
//   throw  the call throws std::runtime_error("[fault] ...")
//   stall  the call blocks like a hung rank (threads: until the launch fails or
//          every other rank returned, then throws; mpi: until the job is aborted)
//   exit   threads: the rank ends as if its function had returned; mpi: the process
//          exits with status 0 (std::exit: atexit handlers run, MPI is finalised)
//   kill   mpi only: the process sends itself SIGKILL
// Off unless set: one thread-local and one global load per call.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "dtensor/group.h"

namespace dtensor::comm {

struct FaultSpec {
  enum class Kind : uint8_t { Throw, Stall, Exit, Kill };
  int rank = 0;
  int64_t call = 1;
  Kind kind = Kind::Throw;
};

// "rank:1,call:3,kind:throw" (fields in any order, all three required);
// std::invalid_argument naming what is wrong otherwise.
FaultSpec parse_fault_spec(std::string_view text);
// DTENSOR_FAULT, read on every call (tests change it between launches); nullopt if unset.
std::optional<FaultSpec> fault_spec_from_env();

// Arms `spec` for the calls this thread makes as launch rank `rank` (threads) for
// the scope's lifetime. Kind kill is rejected: it would kill every rank's process.
class LaunchRankFaults {
 public:
  LaunchRankFaults(const std::optional<FaultSpec>& spec, int rank);
  ~LaunchRankFaults();
  LaunchRankFaults(const LaunchRankFaults&) = delete;
  LaunchRankFaults& operator=(const LaunchRankFaults&) = delete;
};
// Arms `spec` for every call of this process as MPI world rank `rank`.
void arm_process_faults(const std::optional<FaultSpec>& spec, int rank);

// The injection point; every user-level communication call passes it first.
void fault_point(const char* op, const Group& group);

// What kind:exit throws on a launch rank; launch ends the rank as if it returned.
struct RankExit {};

}  // namespace dtensor::comm
