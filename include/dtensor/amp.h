// Mixed precision: dynamic loss scaling for F16 (BF16 rarely needs it).
//
//   nn::ComputeDtype compute(DType::F16);     // layers compute in F16 (nn/layers.h)
//   LossScaler scaler;
//   scaler.scale(loss).backward();
//   ddp.wait_for_gradients();
//   if (scaler.unscale_and_check(params)) optimizer.step();   // else skipped
//   scaler.update();
//
// Parameters stay F32 (the master weights); only activations and the weights' cast
// copies are 16-bit. Whether any gradient overflowed is agreed by every rank of the
// mesh with one all-reduce, so all ranks skip the same steps.
#pragma once

#include <vector>

#include "dtensor/dist_tensor.h"

namespace dtensor {

struct LossScalerOptions {
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // finite steps in a row before the scale grows
  double min_scale = 1.0;
};

// What a checkpoint keeps of a LossScaler.
struct LossScalerState {
  double scale = 0;
  int64_t clean_steps = 0;  // finite steps since the last growth or backoff
  int64_t skipped_steps = 0;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {}) : options_(options), scale_(options.initial_scale) {}

  DistTensor scale(const DistTensor& loss) const;
  // Divides every gradient by the scale and returns true when all are finite on
  // every rank (one all-reduce over the parameters' mesh, or over `group` when given:
  // a pipeline's stages hold their parameters on different meshes).
  bool unscale_and_check(const std::vector<DistTensor>& params, const Group* group = nullptr);
  // Backs off after an overflow, grows after growth_interval clean steps.
  void update();

  double scale_value() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }
  LossScalerState state() const { return {scale_, clean_steps_, skipped_}; }
  // Throws std::invalid_argument for a scale that is not finite and positive or
  // negative counts.
  void load_state(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  double scale_;
  bool found_inf_ = false;
  int64_t clean_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace dtensor
