// Row-major mesh index <-> coordinate (internal; shared by mesh and DistTensor code
// that walks every rank of a mesh without communicating).
#pragma once

#include <cstdint>
#include <vector>

#include "dtensor/error.h"

namespace dtensor::mesh_index {

// The coordinate of row-major index `index` in a mesh of `shape`.
// Example: index 5 of shape [2, 3] -> [1, 2].
inline std::vector<int64_t> coordinate_of(int64_t index, const Shape& shape) {
  std::vector<int64_t> coordinate(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    coordinate[d] = index % shape[d];
    index /= shape[d];
  }
  return coordinate;
}

// Row-major index of `coordinate` restricted to `dims` (in that order) of `shape`.
// Example: coordinate [1, 2] of shape [2, 3] over dims {1, 0} -> 2*2 + 1 = 5.
inline int64_t index_over(const std::vector<int64_t>& coordinate, const Shape& shape,
                          const std::vector<int>& dims) {
  int64_t index = 0;
  for (int d : dims) index = index * shape[d] + coordinate[d];
  return index;
}

}  // namespace dtensor::mesh_index
