// Shared helpers for the tests: a reference layout walker, exception matchers, a
// scratch directory and a scoped environment variable.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"

namespace dtensor::testing {

// Element of `t` at a multi-index, read through shape/strides/offset directly
// (an independent reference for the layout code), converted to double.
inline double at(const Tensor& t, const std::vector<int64_t>& index) {
  int64_t linear = t.offset();
  for (size_t d = 0; d < index.size(); ++d) linear += index[d] * t.strides()[d];
  Tensor base = Tensor::from_storage(t.storage(), t.dtype(), {linear + 1}, {1}, 0);
  return base.slice(0, linear, linear + 1).to(DType::F64).to_vector<double>()[0];
}

// Calls fn(index) for every multi-index of `shape` in row-major order.
inline void for_each_index(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& fn) {
  if (shape_numel(shape) == 0) return;
  std::vector<int64_t> index(shape.size(), 0);
  while (true) {
    fn(index);
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Values of `t` in row-major order, read with `at` (independent of to_vector/copy).
inline std::vector<double> reference_values(const Tensor& t) {
  std::vector<double> values;
  for_each_index(t.shape(), [&](const std::vector<int64_t>& i) { values.push_back(at(t, i)); });
  return values;
}

// A fresh, empty directory per object under the system's temporary folder, removed
// with everything in it afterwards.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "dtensor_test") {
    namespace fs = std::filesystem;
    static std::atomic<int> counter{0};
    path_ = (fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sets (or, with nullptr, unsets) an environment variable for the scope and restores
// what it was. The tests of one binary run one at a time.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace dtensor::testing

// Expects `stmt` to throw `type` with a message containing `fragment`.
#define EXPECT_THROW_MSG(stmt, type, fragment)                                           \
  do {                                                                                   \
    try {                                                                                \
      stmt;                                                                              \
      ADD_FAILURE() << "expected " #type " from: " #stmt;                                \
    } catch (const type& e) {                                                            \
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)                 \
          << "message was: " << e.what();                                                \
    }                                                                                    \
  } while (0)

// Skips a GPU test where no GPU is visible, with a message; fails instead when
// DTENSOR_REQUIRE_GPU is set (scripts/gpu-check.sh sets it on the GPU machine, where
// a skip would hide a broken driver or build).
#define REQUIRE_GPU()                                                                                       \
  do {                                                                                                      \
    if (!::dtensor::cuda_is_available()) {                                                                  \
      if (std::getenv("DTENSOR_REQUIRE_GPU")) FAIL() << "DTENSOR_REQUIRE_GPU is set but no GPU is visible"; \
      GTEST_SKIP() << "no GPU here: run scripts/gpu-check.sh on a GPU machine";                             \
    }                                                                                                       \
  } while (0)
