// The shared state behind a Tensor handle (internal: the library's sources read it;
// the public header only declares it).
#pragma once

#include <cstdint>
#include <memory>

#include "dtensor/tensor.h"

namespace dtensor {

struct Tensor::Impl {
  std::shared_ptr<Storage> storage;
  DType dtype = DType::F32;
  Shape shape;
  Strides strides;
  int64_t offset = 0;
};

}  // namespace dtensor
