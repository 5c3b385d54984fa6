// The whole public API of dtensor.
#pragma once

#include "dtensor/allocator.h"
#include "dtensor/autograd.h"
#include "dtensor/comm_debug.h"
#include "dtensor/cost_model.h"
#include "dtensor/device.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dist_tensor.h"
#include "dtensor/dtype.h"
#include "dtensor/error.h"
#include "dtensor/group.h"
#include "dtensor/ops.h"
#include "dtensor/placement.h"
#include "dtensor/random.h"
#include "dtensor/redistribute.h"
#include "dtensor/tensor.h"
#include "dtensor/tensor_ops.h"
