// The element combiners of the collectives' reductions (internal), shared by the
// host reduction (reduce.cpp) and the threads backend's CUDA kernel
// (threads/cuda/device_collectives.cu), so the CPU tests of every ReduceOp check
// the very functions the GPU runs. A is the accumulation type (F32 for BF16/F16).
#pragma once

#include "backend/scalar_ops.h"  // DT_HOST_DEVICE

namespace dtensor::comm::reduce_ops {

struct Sum {
  template <class A>
  DT_HOST_DEVICE A operator()(A a, A b) const {
    return a + b;
  }
};
struct Prod {
  template <class A>
  DT_HOST_DEVICE A operator()(A a, A b) const {
    return a * b;
  }
};
// A NaN source is kept only when it comes first (the host reduction's semantics).
struct Max {
  template <class A>
  DT_HOST_DEVICE A operator()(A a, A b) const {
    return b > a ? b : a;
  }
};
struct Min {
  template <class A>
  DT_HOST_DEVICE A operator()(A a, A b) const {
    return b < a ? b : a;
  }
};
// Bool: Sum and Max are "any", Product and Min "all".
struct Or {
  DT_HOST_DEVICE bool operator()(bool a, bool b) const { return a || b; }
};
struct And {
  DT_HOST_DEVICE bool operator()(bool a, bool b) const { return a && b; }
};

}  // namespace dtensor::comm::reduce_ops
