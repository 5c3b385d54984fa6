// Distributed checkpoints: the state of a training run saved by every rank in
// parallel, each writing only the shards it owns, and loaded onto any mesh,
// placements and world size, each rank reading only the byte ranges it needs.
//
//   checkpoint::StateDict state{{"model.w", w}, {"step", int64_t{6}}};
//   checkpoint::save("ckpt/step-00000006", state, world);        // collective over world
//   ...                                                           // later, any mesh:
//   checkpoint::StateDict into{{"model.w", w2}, {"step", int64_t{0}}};
//   checkpoint::load("ckpt/step-00000006", into, world);          // w2's pieces filled, step 6
//
// A checkpoint is a directory:
//   manifest.json             every entry: its kind, dtype, global shape, the mesh and
//                             placements it was saved with, and for each chunk its box
//                             (offsets and sizes), file, byte offset and XXH64 checksums
//                             of its 1 MiB blocks; numbers and strings are stored here
//   rank-00000.safetensors    the chunks rank 0 wrote: a valid safetensors file (any
//   rank-00003.safetensors    safetensors reader opens it; tensor names are the entries')
//
// Saving: a DistTensor entry is written as its distinct blocks, each once, by the
// holder whose coordinate is 0 on every mesh dim that does not shard it; nothing is
// gathered. Partial dims are reduced first (one all-reduce of that entry; save is
// collective anyway). A plain Tensor entry is one whole tensor, written by the lowest
// rank that gives it. Ranks may give different entries (pipeline stages give their own
// layers); an entry given by several ranks must agree on its kind, dtype and shape (and
// numbers and strings on their values); a DistTensor given on two meshes (a tied weight
// on the first and the last pipeline stage) is written from the mesh with the lowest
// rank. Everything is written into "<dir>.tmp", every file and the directory are
// fsynced, and only then is it renamed to <dir>: a crash at any point leaves any earlier
// checkpoint as it was and never a directory that looks complete and is not.
//
// Loading: each target says where its values go. A DistTensor target is filled in place
// (its local tensor is overwritten; any mesh, any placements, any device); a Tensor
// target receives the whole tensor; numbers and strings are replaced by the saved
// values. A rank opens only the files holding chunks that intersect what it needs and
// reads only those byte ranges (widened to whole checksum blocks, whose checksums are
// verified). Everything is read and verified before anything is written (unless
// LoadOptions::staged is off), and the ranks agree on the outcome: a missing entry,
// another shape or dtype, a truncated or corrupted file fails on every rank with the
// entry and the file named, and no target is changed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor {
class Optimizer;
class LossScaler;
class DistributedSampler;
namespace nn {
class Module;
}
}  // namespace dtensor

namespace dtensor::checkpoint {

// One entry of a state: a distributed tensor, a whole tensor, a number or a string.
using Value = std::variant<DistTensor, Tensor, int64_t, double, std::string>;
using StateDict = std::map<std::string, Value>;

struct SaveOptions {
  // Replace a checkpoint already at `dir` (otherwise that is an error).
  bool overwrite = false;
  // Bytes per checksum block (a reader verifies whole blocks).
  int64_t block_bytes = int64_t{1} << 20;
};

// What this rank did.
struct SaveStats {
  int64_t bytes_written = 0;  // this rank's data file
  int64_t chunks_written = 0;
  double seconds = 0;
};

// Writes `state` to `dir` (see the header comment). Collective over `group`: every rank
// of it calls save with the same dir; each DistTensor's mesh must be over `group`.
SaveStats save(const std::string& dir, const StateDict& state, const Group& group, const SaveOptions& options = {});

struct LoadOptions {
  // Targets the checkpoint lacks keep their values (otherwise an error naming them).
  bool allow_missing = false;
  // Verify the checksum of every block read (reads whole blocks).
  bool verify = true;
  // Read everything into host buffers and write the targets only when every rank read
  // and verified all it needs (a failure changes nothing). false: read straight into
  // targets that are contiguous host tensors (no second copy, no extra memory, as
  // PyTorch DCP loads); the ranks still agree on the outcome, but after a failure those
  // targets may hold part of the checkpoint.
  bool staged = true;
};

// What this rank read.
struct LoadStats {
  int64_t bytes_needed = 0;             // the bytes of the saved chunks that intersect this rank's targets
  int64_t bytes_read = 0;               // what was read from data files (needed, widened to checksum blocks)
  std::vector<std::string> files_read;  // data files opened (names within the checkpoint)
  std::vector<std::string> missing;     // targets the checkpoint lacks (allow_missing)
  double seconds = 0;
};

// Fills `state`'s targets from `dir` (see the header comment). Collective over `group`.
LoadStats load(const std::string& dir, StateDict& state, const Group& group, const LoadOptions& options = {});

// ---- asynchronous saves --------------------------------------------------------------

// What AsyncSaver::save cost the calling thread.
struct AsyncSaveStats {
  double stall_seconds = 0;   // the whole call: the wait below, the copy, one exchange
  double waited_seconds = 0;  // waiting for the previous save to finish
  int64_t bytes_copied = 0;   // this rank's pieces copied to host memory
};

// Saves that return once this rank's pieces are copied to host memory; a background
// thread writes its file, and rank 0's thread commits the checkpoint (manifest, rename)
// once every rank's file is durable. The ranks report to rank 0 through small files in
// <dir>.tmp, so the background threads never communicate and never meet the training's
// collectives (any backend, any shared filesystem). A save first waits for the one in
// flight. Whether a save succeeded is agreed at the next save() or wait(), which throw
// its error on every rank.
//
//   checkpoint::AsyncSaver saver(world);
//   saver.save(series.path_of(step), checkpoint::train_state_dict(state));  // stalls for the copy
//   ...                                                                      // training goes on
//   saver.wait();                                                            // before exiting
class AsyncSaver {
 public:
  // Collective over `group` in save() and wait() only. Rank 0 gives up on ranks whose
  // files do not arrive within `timeout` (default: the group's).
  explicit AsyncSaver(Group group, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Waits for the thread (not collective); a failure nobody waited for is printed.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Collective over the group (and over the DistTensors' meshes, for Partial entries).
  // `on_committed` runs on rank 0's thread after the rename (CheckpointDir prunes there).
  AsyncSaveStats save(const std::string& dir, const StateDict& state, const SaveOptions& options = {},
                      std::function<void()> on_committed = {});
  // Waits for the save in flight and agrees on its outcome (collective); throws its error.
  void wait();
  bool in_flight() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- what a checkpoint holds (reads manifest.json; no communication) ----------------

enum class EntryKind : uint8_t { DistTensor, Tensor, Int, Float, String };

struct EntryInfo {
  EntryKind kind = EntryKind::Tensor;
  DType dtype = DType::F32;    // tensors
  Shape shape;                 // tensors: the global shape
  std::string mesh;            // DistTensor: the mesh it was saved from ("dp=2,tp=2")
  std::string placements;      // DistTensor: its placements when saved ("S(0),R")
  int64_t chunks = 0;          // tensors: stored chunks
  std::optional<Value> value;  // numbers and strings
};

struct Manifest {
  int64_t world_size = 0;  // of the saving group
  std::map<std::string, EntryInfo> entries;
};

// Throws std::invalid_argument naming the file when dir holds no readable checkpoint.
Manifest read_manifest(const std::string& dir);

// ---- one safetensors file: consolidation and import --------------------------------------

// Names in the file for dtensor's names (unlisted names are kept): a model's parameters
// under PyTorch or Hugging Face names.
using NameMap = std::map<std::string, std::string>;

struct ExportOptions {
  NameMap names;                                // entry name -> name in the file
  std::map<std::string, std::string> metadata;  // the file's __metadata__ (with the numbers and strings of the state)
  bool overwrite = false;
};

// Writes the whole tensors of `state` as one safetensors file at `path` (row-major, in
// name order), without gathering: rank 0 writes the header and sizes the file, every rank
// writes the bytes of the blocks it owns at their places (a replicated block once), and
// the file appears at `path` by rename once complete. Numbers and strings go into the
// metadata as text. Collective over `group`; the file must be on storage every rank sees.
void export_safetensors(const std::string& path, const StateDict& state, const Group& group,
                        const ExportOptions& options = {});

struct ImportOptions {
  NameMap names;  // target name -> name in the file (unlisted names are looked up as they are)
  bool allow_missing = false;
  bool staged = true;  // as LoadOptions::staged
};

// Fills `state`'s tensor targets (any mesh, any placements) from a safetensors file
// written by anyone (PyTorch's safetensors.torch.save_file, Hugging Face, export_safetensors):
// each rank reads only the byte ranges of its blocks. Numbers and strings are not read
// (a safetensors file has no such entries). Collective over `group`.
LoadStats import_safetensors(const std::string& path, StateDict& state, const Group& group,
                             const ImportOptions& options = {});

// ---- a series of checkpoints ---------------------------------------------------------

// The checkpoints of one run under a root directory, one per saved step:
// <root>/step-00000006. The newest complete one is the one to resume from.
class CheckpointDir {
 public:
  // keep_last > 0: after each save only the newest keep_last checkpoints stay.
  explicit CheckpointDir(std::string root, int keep_last = 0);

  const std::string& root() const { return root_; }
  std::string path_of(int64_t step) const;  // <root>/step-00000006
  // Saves `state` as `step` (collective over `group`; replaces that step if it exists),
  // then prunes (rank 0 of group). Returns the checkpoint's path.
  std::string save(int64_t step, const StateDict& state, const Group& group, SaveOptions options = {});
  // Steps with a complete checkpoint (a manifest.json), ascending. Leftovers of a save
  // that crashed (step-*.tmp) are not checkpoints.
  std::vector<int64_t> steps() const;
  std::optional<int64_t> latest() const;
  // The same through `saver`: returns once the state is copied; the pruning follows the
  // commit on rank 0's background thread.
  std::string save_async(AsyncSaver& saver, int64_t step, const StateDict& state, SaveOptions options = {});

 private:
  void prune() const;
  std::string root_;
  int keep_last_;
};

// ---- the state of a training run -------------------------------------------------------

// What a run needs to resume exactly where it stopped, gathered into one StateDict:
//   model.<param name>                     parameters as they are laid out (shards stay shards)
//   model.<module path>.<name>             Module::extra_state (Dropout's mask counter)
//   optim.<param name>.<state>             optimizer state, keyed by parameter name
//   optim.<param name>.step                its update count
//   optim.lr                               the optimizer's learning rate
//   scaler.scale / .clean_steps / .skipped_steps    the loss scaler
//   train.step                             completed optimizer steps (the LR schedule and
//                                          the sampler resume from it)
//   data.global_batch / data.seed / data.dataset_size   the sampler, checked on load
//   <extra's names>                        the caller's own entries
// `modules` are the model, or this rank's pipeline stages (parameter names must be
// unique across them except for tied copies, which are saved once and loaded into
// each). Optimizer parameters are named through `modules`; one that no module holds is
// an error. After loading, every module is told (nn::Module::notify_state_loaded) so
// that wrappers such as FSDP refresh what they derived from the parameters.
struct TrainState {
  std::vector<nn::Module*> modules;
  Optimizer* optimizer = nullptr;
  LossScaler* scaler = nullptr;
  const DistributedSampler* sampler = nullptr;
  int64_t step = 0;
  StateDict extra;
};

StateDict train_state_dict(const TrainState& state);
// Saves train_state_dict(state) (collective over `group`).
SaveStats save(const std::string& dir, const TrainState& state, const Group& group, const SaveOptions& options = {});
// Loads into `state`: parameters in place, optimizer state created in the parameters'
// layouts, scaler, step and extra entries replaced. The sampler's global batch, seed
// and dataset size must equal the saved ones (the order of the data would differ).
LoadStats load(const std::string& dir, TrainState& state, const Group& group, const LoadOptions& options = {});

}  // namespace dtensor::checkpoint
