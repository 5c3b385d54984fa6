// A series of checkpoints under one root: <root>/step-00000006, the newest complete one,
// pruning (checkpoint.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "dtensor/checkpoint.h"
#include "util/check.h"

namespace dtensor::checkpoint {

namespace fs = std::filesystem;

namespace {

// "step-00000006" -> 6; nullopt for any other name (step-6.tmp, step-6.old, ...).
std::optional<int64_t> step_of(const std::string& name) {
  constexpr std::string_view prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t{1} << 58)) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

CheckpointDir::CheckpointDir(std::string root, int keep_last) : root_(std::move(root)), keep_last_(keep_last) {
  DT_CHECK_ARG(!root_.empty(), "CheckpointDir", "the root directory name is empty");
  DT_CHECK_ARG(keep_last >= 0, "CheckpointDir", "keep_last must be >= 0 (0 keeps every checkpoint), got ", keep_last);
}

std::string CheckpointDir::path_of(int64_t step) const {
  DT_CHECK_ARG(step >= 0, "CheckpointDir", "step must be >= 0, got ", step);
  char name[40];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return root_ + "/" + name;
}

std::string CheckpointDir::save(int64_t step, const StateDict& state, const Group& group, SaveOptions options) {
  const std::string path = path_of(step);
  if (group.rank() == 0) fs::create_directories(root_);
  options.overwrite = true;
  checkpoint::save(path, state, group, options);
  if (group.rank() == 0) prune();
  return path;
}

std::string CheckpointDir::save_async(AsyncSaver& saver, int64_t step, const StateDict& state, SaveOptions options) {
  const std::string path = path_of(step);
  fs::create_directories(root_);
  options.overwrite = true;
  saver.save(path, state, options, [series = *this] { series.prune(); });
  return path;
}

std::vector<int64_t> CheckpointDir::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root_, ec)) {
    const std::optional<int64_t> step = step_of(e.path().filename().string());
    if (step && fs::exists(e.path() / "manifest.json")) out.push_back(*step);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<int64_t> CheckpointDir::latest() const {
  const std::vector<int64_t> all = steps();
  if (all.empty()) return std::nullopt;
  return all.back();
}

void CheckpointDir::prune() const {
  if (keep_last_ == 0) return;
  const std::vector<int64_t> all = steps();
  for (size_t i = 0; i + static_cast<size_t>(keep_last_) < all.size(); ++i) {
    // Renamed first, so a reader never sees a half-deleted checkpoint as complete.
    const std::string path = path_of(all[i]);
    const std::string trash = path + ".old";
    std::error_code ec;
    fs::remove_all(trash, ec);
    fs::rename(path, trash, ec);
    if (!ec) fs::remove_all(trash, ec);
  }
}

}  // namespace dtensor::checkpoint
