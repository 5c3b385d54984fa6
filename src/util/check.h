// Argument and support checks of the library's sources (internal: the public headers
// define no macros for users' code). Every message names the op in brackets and says
// what was expected and what was got (dtensor/error.h):
//   DT_CHECK_ARG(a.dim() == 2, "matmul", "expected a 2-D tensor, got shape ", a.shape());
#pragma once

#include <stdexcept>

#include "dtensor/error.h"

// The user's mistake: std::invalid_argument("[op] message").
#define DT_CHECK_ARG(cond, op, ...)                                                                  \
  do {                                                                                               \
    if (!(cond)) throw std::invalid_argument(::dtensor::detail::concat("[", op, "] ", __VA_ARGS__)); \
  } while (0)

// Not supported (build options, devices, missing features): std::runtime_error.
#define DT_CHECK_SUPPORTED(cond, op, ...)                                                         \
  do {                                                                                            \
    if (!(cond)) throw std::runtime_error(::dtensor::detail::concat("[", op, "] ", __VA_ARGS__)); \
  } while (0)
