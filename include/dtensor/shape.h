// Shapes and strides of tensors: dims as int64 lists, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

std::string shape_to_string(const Shape& s);  // "[4, 8]"
int64_t shape_numel(const Shape& shape);      // 1 for []
Strides contiguous_strides(const Shape& shape);
// Normalises a possibly negative dim into [0, ndim); throws naming `op` if out of range.
int normalize_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace dtensor
