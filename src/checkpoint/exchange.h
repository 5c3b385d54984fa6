// How the ranks of a save or a load agree (internal): each rank's outcome travels with
// its payload in one all-gather, so that a rank that failed locally (a bad entry, a
// file it could not write or read) never leaves the others waiting in a later
// collective, and every rank throws the same error when any failed.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "dtensor/group.h"

namespace dtensor::checkpoint::detail {

// One rank's contribution: its failure (empty when it succeeded) and a payload.
struct Outcome {
  char kind = 'O';   // 'O' ok, 'A' std::invalid_argument, 'R' any other failure
  std::string text;  // the payload when ok, the message otherwise

  static Outcome ok(std::string payload) { return {'O', std::move(payload)}; }
  // The outcome of the exception being handled (call inside a catch block).
  static Outcome current_failure();
  bool failed() const { return kind != 'O'; }
};

// Every rank's outcome, in rank order (collective over `group`).
std::vector<Outcome> exchange(const Group& group, const Outcome& mine);

// Throws the first failure among `outcomes` (the caller's own message as it is, another
// rank's prefixed with "rank r: "), as std::invalid_argument when it was one.
void throw_first_failure(const std::vector<Outcome>& outcomes, int my_rank);

}  // namespace dtensor::checkpoint::detail
