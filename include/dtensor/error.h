// Error helpers: every user-facing error names the op in brackets and says what
// was expected and what was got, e.g. "[matmul] inner dims differ: a is [4, 8], b is [6, 3]".
// (The library's sources check with the DT_CHECK_* macros of src/util/check.h.)
#pragma once

#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dtensor/shape.h"

namespace dtensor {

namespace detail {
template <class T>
void append(std::ostringstream& os, const T& v) {
  if constexpr (std::is_same_v<T, Shape>) {
    os << shape_to_string(v);
  } else {
    os << v;
  }
}
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (append(os, args), ...);
  return os.str();
}
}  // namespace detail

}  // namespace dtensor
