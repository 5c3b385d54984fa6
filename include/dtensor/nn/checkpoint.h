// Activation checkpointing: run a module without keeping its intermediate
// activations, and recompute them during backward.
#pragma once

#include "dtensor/nn/module.h"

namespace dtensor::nn {

// module(x) whose internals are not saved for backward: only x is kept. In
// backward the module runs again (with the same dropout masks) and its gradient
// flows to x and to the module's parameters. Peak memory drops by the block's
// activations at the cost of one more forward.
DistTensor checkpoint(Module& module, const DistTensor& x);

}  // namespace dtensor::nn
