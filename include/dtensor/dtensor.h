// The whole public API of dtensor.
#pragma once

#include "dtensor/allocator.h"
#include "dtensor/device.h"
#include "dtensor/dtype.h"
#include "dtensor/error.h"
#include "dtensor/random.h"
#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"
#if __has_include("dtensor/group.h")
#include "dtensor/group.h"
#endif
