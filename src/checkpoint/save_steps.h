// The steps of a save (internal), shared by checkpoint::save, which runs them with
// collectives between them, and AsyncSaver, which runs the writing and the commit on a
// background thread:
//   take_save_input   this rank's pieces on the host and what it gives (calling thread)
//   resolve_given     from every rank's description: each entry and who writes it
//   prepare_directory rank 0: check <dir>, make an empty <dir>.tmp
//   write_rank_file   this rank's safetensors file; its chunk records (JSON)
//   finish_save       rank 0: manifest.json from every rank's records, then the rename
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/exchange.h"
#include "checkpoint/manifest.h"
#include "dtensor/checkpoint.h"

namespace dtensor::checkpoint::detail {

// What this rank brings to a save, taken from the state on the calling thread.
struct SaveInput {
  Outcome described;                     // exchange 1's payload, or this rank's failure
  std::map<std::string, Tensor> pieces;  // contiguous host tensors this rank may write
  std::map<std::string, Box> boxes;      // their blocks of the global tensors
};
// Collective over each DistTensor's mesh (Partial dims are reduced), so every rank
// calls it; a bad entry is reported in `described`, not thrown. With `copy` the pieces
// never alias the state's tensors (an asynchronous save writes them while training
// changes the originals).
SaveInput take_save_input(const StateDict& state, const Group& group, bool copy);

// An entry every rank agrees on, and the ranks that write a chunk of it.
struct Resolved {
  EntryRecord record;
  std::set<int> writers;
};
// The same on every rank (a pure function of the gathered descriptions); throws
// std::invalid_argument when ranks disagree about an entry.
std::map<std::string, Resolved> resolve_given(const std::vector<Outcome>& given);

void prepare_directory(const std::string& dir, bool overwrite);
// Exchange 1 (collective): every rank's description, rank 0 having prepared <dir>.tmp
// first; throws the first failure on every rank.
std::vector<Outcome> exchange_descriptions(const std::string& dir, const SaveInput& input, const Group& group,
                                           bool overwrite);
// "<dir>.tmp" removed, errors ignored (after a failed save).
void remove_temporary(const std::string& dir);

std::string rank_file_name(int rank);  // "rank-00003.safetensors"
// Writes <tmp>/rank_file_name(rank) (fsynced) with the chunks this rank writes;
// returns their records as JSON ({"bytes": n, "chunks": [...]}).
std::string write_rank_file(const std::string& tmp, int rank, const std::map<std::string, Resolved>& resolved,
                            const std::map<std::string, Tensor>& pieces, const std::map<std::string, Box>& boxes,
                            int64_t block_bytes, SaveStats& stats);

// Rank 0: manifest.json from every rank's records (in rank order), fsynced, then
// <dir>.tmp renamed to <dir>. On failure <dir>.tmp is removed and the error rethrown.
void finish_save(const std::string& dir, const std::map<std::string, Resolved>& resolved,
                 const std::vector<std::string>& written, int64_t world_size, const SaveOptions& options);

}  // namespace dtensor::checkpoint::detail
