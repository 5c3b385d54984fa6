// The parallel-equivalence harness every training suite uses: a layout trains as one
// rank does when N steps give the same losses and the same parameters (and, where a
// run records them, gradients), at one tolerance policy. Also the tiny GPT those
// suites train, written once.
//
//   const testing::TrainingRun one = train_on(1);
//   testing::expect_equivalent(train_on(4), one, "DP=2 x TP=2");
//
// A suite's train function runs its layout (launch, a mesh, the model, the parallel
// modules, a Trainer) and returns a TrainingRun through testing::train_on_ranks, which
// merges what the ranks report: the losses (every rank that reports them must agree)
// and each parameter by name (a name reported by several ranks, a replicated or tied
// parameter, must agree too).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"

namespace dtensor::testing {

// vocab 16, block 8, `layers` blocks, `heads` heads of dim 16. No biases: the key
// projection's bias has an exactly zero gradient (softmax is shift-invariant), so its
// rounding noise, normalised by AdamW, would decide its value differently on every
// layout.
inline models::GPTConfig tiny_gpt(int64_t layers = 2, int64_t heads = 2) {
  models::GPTConfig c;
  c.vocab = 16;
  c.block_size = 8;
  c.layers = layers;
  c.heads = heads;
  c.dim = 16;
  c.bias = false;
  return c;
}

// What N steps of training leave: the step losses and the full parameters by name
// (and optionally gradients by name).
struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
  std::map<std::string, Tensor> grads;
};
// params or grads (the two are checked alike).
using TensorsOfRun = std::map<std::string, Tensor> TrainingRun::*;

// The policy: a layout on the same device is a different order of the same F32
// sums, so losses agree to 1e-5 relative and parameters to 1e-5 relative + 1e-5
// absolute (AdamW turns a gradient's rounding into a step of lr x ~1e-3 for
// near-zero moments). Across devices (GPU kernels against the CPU's) 1e-4 relative.
struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-5;
};
inline constexpr Tolerance kSameDevice{};
inline constexpr Tolerance kAcrossDevices{1e-4, 1e-5};

// Runs `rank` on `world` threads-backend ranks and merges their reports (see the
// header comment). A rank reports nothing by returning an empty run.
inline TrainingRun train_on_ranks(int world, const std::function<TrainingRun(Group)>& rank,
                                  Tolerance tol = kSameDevice) {
  TrainingRun merged;
  std::mutex mu;
  std::vector<std::string> disagreements;
  launch(world, [&](Group g) {
    TrainingRun mine = rank(g);
    const std::lock_guard<std::mutex> lock(mu);
    if (!mine.losses.empty()) {
      if (merged.losses.empty()) {
        merged.losses = mine.losses;
      } else {
        for (size_t i = 0; i < mine.losses.size() && i < merged.losses.size(); ++i) {
          if (std::fabs(mine.losses[i] - merged.losses[i]) > tol.rtol * std::fabs(merged.losses[i])) {
            disagreements.push_back("rank " + std::to_string(g.rank()) + "'s loss of step " + std::to_string(i));
          }
        }
      }
    }
    for (TensorsOfRun field : {&TrainingRun::params, &TrainingRun::grads}) {
      for (auto& [name, t] : mine.*field) {
        const auto [it, fresh] = (merged.*field).emplace(name, t);
        if (!fresh && !allclose(it->second, t, tol.rtol, tol.atol)) {
          disagreements.push_back("rank " + std::to_string(g.rank()) + "'s copy of " + name);
        }
      }
    }
  });
  for (const std::string& d : disagreements) ADD_FAILURE() << "ranks disagree: " << d;
  return merged;
}

// `got` trained as `want` did: the same number of steps, every loss, every parameter
// (and gradient) `want` has, within `tol`.
inline void expect_equivalent(const TrainingRun& got, const TrainingRun& want, const std::string& what,
                              Tolerance tol = kSameDevice) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], tol.rtol * std::fabs(want.losses[i])) << what << " step " << i;
  }
  for (TensorsOfRun field : {&TrainingRun::params, &TrainingRun::grads}) {
    const char* kind = field == &TrainingRun::params ? "parameter" : "gradient";
    EXPECT_EQ((got.*field).size(), (want.*field).size()) << what << ": the number of " << kind << "s";
    for (const auto& [name, t] : want.*field) {
      const auto it = (got.*field).find(name);
      if (it == (got.*field).end()) {
        ADD_FAILURE() << what << ": no " << kind << " " << name;
        continue;
      }
      EXPECT_TRUE(allclose(it->second, t, tol.rtol, tol.atol))
          << what << " " << kind << " " << name << ": " << compare(it->second, t, tol.rtol, tol.atol).to_string();
    }
  }
}

}  // namespace dtensor::testing
