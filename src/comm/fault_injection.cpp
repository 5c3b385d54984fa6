// DTENSOR_FAULT: parsing, arming per launch rank or per process, the injection point.
#include "comm/fault_injection.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>

#include "comm/comm_backend.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm {
namespace {

struct FaultState {
  FaultSpec spec;
  int rank = 0;
  bool launch_rank = false;  // threads (kind exit ends the rank) or a process (mpi)
  std::atomic<int64_t> calls{0};
};

thread_local FaultState* thread_faults = nullptr;
std::atomic<FaultState*> process_faults{nullptr};

const char* kind_name(FaultSpec::Kind kind) {
  switch (kind) {
    case FaultSpec::Kind::Throw: return "throw";
    case FaultSpec::Kind::Stall: return "stall";
    case FaultSpec::Kind::Exit: return "exit";
    case FaultSpec::Kind::Kill: return "kill";
  }
  return "?";
}

[[noreturn]] void bad_spec(std::string_view text, const std::string& why) {
  throw std::invalid_argument(detail::concat(
      "[DTENSOR_FAULT] ", why, " in '", text, "'; expected rank:K,call:N,kind:throw|stall|exit|kill"));
}

int64_t parse_integer(std::string_view text, std::string_view value, const char* field, int64_t min) {
  const std::string s(value);
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < min) {
    bad_spec(text, detail::concat(field, " must be an integer >= ", min, ", got '", s, "'"));
  }
  return v;
}

}  // namespace

FaultSpec parse_fault_spec(std::string_view text) {
  FaultSpec spec;
  bool has_rank = false, has_call = false, has_kind = false;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view field = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos) bad_spec(text, detail::concat("field '", std::string(field), "' has no ':'"));
    const std::string_view key = field.substr(0, colon), value = field.substr(colon + 1);
    if (key == "rank") {
      spec.rank = static_cast<int>(parse_integer(text, value, "rank", 0));
      has_rank = true;
    } else if (key == "call") {
      spec.call = parse_integer(text, value, "call", 1);
      has_call = true;
    } else if (key == "kind") {
      if (value == "throw") spec.kind = FaultSpec::Kind::Throw;
      else if (value == "stall") spec.kind = FaultSpec::Kind::Stall;
      else if (value == "exit") spec.kind = FaultSpec::Kind::Exit;
      else if (value == "kill") spec.kind = FaultSpec::Kind::Kill;
      else bad_spec(text, detail::concat("unknown kind '", std::string(value), "'"));
      has_kind = true;
    } else {
      bad_spec(text, detail::concat("unknown field '", std::string(key), "'"));
    }
  }
  if (!has_rank || !has_call || !has_kind) bad_spec(text, "rank, call and kind are all required");
  return spec;
}

std::optional<FaultSpec> fault_spec_from_env() {
  const char* env = std::getenv("DTENSOR_FAULT");
  if (!env || !*env) return std::nullopt;
  return parse_fault_spec(env);
}

LaunchRankFaults::LaunchRankFaults(const std::optional<FaultSpec>& spec, int rank) {
  if (!spec || spec->rank != rank) return;
  DT_CHECK_ARG(spec->kind != FaultSpec::Kind::Kill, "DTENSOR_FAULT",
               "kind kill needs one process per rank (mpi); launch ranks share one process");
  auto* state = new FaultState;
  state->spec = *spec;
  state->rank = rank;
  state->launch_rank = true;
  thread_faults = state;
}

LaunchRankFaults::~LaunchRankFaults() {
  delete thread_faults;
  thread_faults = nullptr;
}

void arm_process_faults(const std::optional<FaultSpec>& spec, int rank) {
  if (!spec || spec->rank != rank) return;
  auto* state = new FaultState;  // lives as long as the process: calls may come from any thread
  state->spec = *spec;
  state->rank = rank;
  delete process_faults.exchange(state);
}

void fault_point(const char* op, const Group& group) {
  FaultState* state = thread_faults;
  if (!state) state = process_faults.load(std::memory_order_acquire);
  if (!state || state->calls.fetch_add(1, std::memory_order_relaxed) + 1 != state->spec.call) return;
  const FaultSpec& spec = state->spec;
  switch (spec.kind) {
    case FaultSpec::Kind::Throw:
      throw std::runtime_error(detail::concat("[fault] ", op, ": injected failure of rank ", state->rank,
                                              " at its call ", spec.call, " (DTENSOR_FAULT kind ",
                                              kind_name(spec.kind), ")"));
    case FaultSpec::Kind::Stall:
      group.impl()->injected_stall();
      throw std::runtime_error(detail::concat("[fault] ", op, ": rank ", state->rank, " was released from its stall"));
    case FaultSpec::Kind::Exit:
      if (state->launch_rank) throw RankExit{};
      std::exit(0);
    case FaultSpec::Kind::Kill:
      std::raise(SIGKILL);
      break;
  }
}

}  // namespace dtensor::comm
