// AsyncSaver: the copy and the first exchange on the calling thread, the writing and
// rank 0's commit on a background thread (checkpoint.h).
//
// The background threads report through files in <dir>.tmp, written by rename so they
// appear whole: rank-00003.done holds rank 3's chunk records, rank-00003.failed its
// error. Rank 0's thread waits for one of the two from every rank, then writes the
// manifest and renames the directory (finish_save), or removes <dir>.tmp. The outcome
// of each rank's thread is agreed by the next save() or wait() in one exchange.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "checkpoint/exchange.h"
#include "checkpoint/files.h"
#include "checkpoint/save_steps.h"
#include "util/check.h"

namespace dtensor::checkpoint {

using namespace detail;
namespace fs = std::filesystem;

namespace {

constexpr const char* kOp = "checkpoint::AsyncSaver";

std::string report_name(const std::string& tmp, int rank, const char* suffix) {
  char name[48];
  std::snprintf(name, sizeof(name), "/rank-%05d.%s", rank, suffix);
  return tmp + name;
}

// Written whole: a reader sees the file complete or not at all.
void write_report(const std::string& path, const std::string& text) {
  write_file(path + ".part", text);
  fs::rename(path + ".part", path);
}

// Rank 0: every rank's chunk records, in rank order, once each has reported (the
// reports are removed); throws the first failure reported, or when some rank has not
// reported within `timeout`.
std::vector<std::string> collect_reports(const std::string& tmp, int ranks, std::chrono::milliseconds timeout) {
  std::vector<std::string> records(static_cast<size_t>(ranks));
  std::vector<bool> done(static_cast<size_t>(ranks), false);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int waiting = ranks; waiting > 0;) {
    for (int r = 0; r < ranks; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      const std::string failed = report_name(tmp, r, "failed");
      if (fs::exists(failed)) {
        const std::string message = read_file(failed);
        throw std::runtime_error(r == 0 ? message : "rank " + std::to_string(r) + ": " + message);
      }
      const std::string ok = report_name(tmp, r, "done");
      if (fs::exists(ok)) {
        records[static_cast<size_t>(r)] = read_file(ok);
        fs::remove(ok);
        done[static_cast<size_t>(r)] = true;
        --waiting;
      }
    }
    if (waiting == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < ranks; ++r) {
        if (!done[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw std::runtime_error(::dtensor::detail::concat("[", kOp, "] no file from rank(s) ", missing, " within ",
                                                         timeout.count(), " ms: the checkpoint is not committed"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return records;
}

}  // namespace

struct AsyncSaver::Impl {
  Group group;
  std::chrono::milliseconds timeout;
  std::thread thread;
  Outcome outcome = Outcome::ok("");  // of the last background save, read after join
  bool waited = true;                 // its outcome was agreed

  void join() {
    if (thread.joinable()) thread.join();
  }

  // The background part of a save.
  void run(std::string dir, std::map<std::string, Resolved> resolved, SaveInput input, SaveOptions options,
           std::function<void()> on_committed) {
    const int rank = group.rank();
    const std::string tmp = dir + ".tmp";
    try {
      SaveStats stats;
      std::string records;
      try {
        records = write_rank_file(tmp, rank, resolved, input.pieces, input.boxes, options.block_bytes, stats);
        input.pieces.clear();
        fault_point("written", rank);
      } catch (...) {
        const Outcome failed = Outcome::current_failure();
        write_report(report_name(tmp, rank, "failed"), failed.text);
        throw;
      }
      write_report(report_name(tmp, rank, "done"), records);
      if (rank == 0) {
        try {
          finish_save(dir, resolved, collect_reports(tmp, group.size(), timeout), group.size(), options);
        } catch (...) {
          remove_temporary(dir);
          throw;
        }
        if (on_committed) on_committed();
      }
      outcome = Outcome::ok("");
    } catch (...) {
      outcome = Outcome::current_failure();
    }
  }
};

AsyncSaver::AsyncSaver(Group group, std::optional<std::chrono::milliseconds> timeout)
    : impl_(std::make_unique<Impl>()) {
  DT_CHECK_ARG(group.defined(), kOp, "the group is undefined");
  impl_->timeout = timeout ? *timeout : group.timeout();
  impl_->group = std::move(group);
}

AsyncSaver::~AsyncSaver() {
  impl_->join();
  if (!impl_->waited && impl_->outcome.failed()) {
    std::fprintf(stderr, "[%s] a checkpoint save failed and nobody waited for it: %s\n", kOp,
                 impl_->outcome.text.c_str());
  }
}

bool AsyncSaver::in_flight() const { return !impl_->waited; }

void AsyncSaver::wait() {
  if (impl_->waited) return;
  impl_->join();
  impl_->waited = true;
  throw_first_failure(exchange(impl_->group, impl_->outcome), impl_->group.rank());
}

AsyncSaveStats AsyncSaver::save(const std::string& dir, const StateDict& state, const SaveOptions& options,
                                std::function<void()> on_committed) {
  DT_CHECK_ARG(!dir.empty(), kOp, "the directory name is empty");
  DT_CHECK_ARG(options.block_bytes > 0, kOp, "block_bytes must be positive, got ", options.block_bytes);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  AsyncSaveStats stats;
  wait();
  stats.waited_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const Group& group = impl_->group;
  const int rank = group.rank();

  SaveInput input = take_save_input(state, group, /*copy=*/true);
  for (const auto& [name, t] : input.pieces) stats.bytes_copied += static_cast<int64_t>(t.nbytes());
  const std::vector<Outcome> given = exchange_descriptions(dir, input, group, options.overwrite);
  // Every rank resolves alike (a disagreement throws on every rank, before any thread).
  std::map<std::string, Resolved> resolved;
  try {
    resolved = resolve_given(given);
  } catch (...) {
    if (rank == 0) remove_temporary(dir);
    throw;
  }
  impl_->waited = false;
  impl_->thread = std::thread([impl = impl_.get(), dir, resolved = std::move(resolved), input = std::move(input),
                               options, on_committed = std::move(on_committed)]() mutable {
    impl->run(std::move(dir), std::move(resolved), std::move(input), options, std::move(on_committed));
  });
  stats.stall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace dtensor::checkpoint
