// checkpoint::save: every rank writes the chunks it owns into one safetensors file;
// rank 0 writes the manifest and commits the directory (checkpoint.h).
//
// Three exchanges (exchange.h), each carrying every rank's outcome:
//   1. what each rank gives: per entry its kind, dtype, shape, mesh, coordinate and
//      value. Every rank then decides the same way who writes what (resolve_given).
//   2. after writing: each rank's file size and its chunks' offsets and checksums.
//      Rank 0 writes manifest.json into <dir>.tmp and renames it to <dir>.
//   3. rank 0's commit, so that save returns (or throws) on every rank alike.
#include <chrono>

#include "checkpoint/exchange.h"
#include "checkpoint/files.h"
#include "checkpoint/save_steps.h"
#include "util/check.h"

namespace dtensor::checkpoint {

using namespace detail;

namespace {
constexpr const char* kOp = "checkpoint::save";
}  // namespace

SaveStats save(const std::string& dir, const StateDict& state, const Group& group, const SaveOptions& options) {
  DT_CHECK_ARG(group.defined(), kOp, "the group is undefined");
  DT_CHECK_ARG(!dir.empty(), kOp, "the directory name is empty");
  DT_CHECK_ARG(options.block_bytes > 0, kOp, "block_bytes must be positive, got ", options.block_bytes);
  const auto start = std::chrono::steady_clock::now();
  const int rank = group.rank();
  const std::string tmp = dir + ".tmp";
  SaveStats stats;

  // Collective per mesh: the pieces this rank may write (Partial dims reduced).
  SaveInput input = take_save_input(state, group, /*copy=*/false);

  // 1. What every rank gives; rank 0 prepares <dir>.tmp first.
  const std::vector<Outcome> given = exchange_descriptions(dir, input, group, options.overwrite);
  Outcome mine;

  // 2. Every rank resolves alike, writes its chunks, reports them.
  std::map<std::string, Resolved> resolved;
  try {
    resolved = resolve_given(given);
    mine = Outcome::ok(write_rank_file(tmp, rank, resolved, input.pieces, input.boxes, options.block_bytes, stats));
    input.pieces.clear();
    fault_point("written", rank);
  } catch (...) {
    mine = Outcome::current_failure();
  }
  const std::vector<Outcome> written = exchange(group, mine);

  // 3. Rank 0 writes the manifest and commits; everyone learns how that went.
  Outcome committed = Outcome::ok("");
  if (rank == 0) {
    try {
      throw_first_failure(written, rank);
      std::vector<std::string> payloads;
      for (const Outcome& o : written) payloads.push_back(o.text);
      finish_save(dir, resolved, payloads, group.size(), options);
    } catch (...) {
      committed = Outcome::current_failure();
      remove_temporary(dir);
    }
  }
  const std::vector<Outcome> outcome = exchange(group, committed);
  throw_first_failure(written, rank);
  throw_first_failure(outcome, rank);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace dtensor::checkpoint
