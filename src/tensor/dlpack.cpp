// DLPack export (a heap context holding the Tensor handle and its int64 shape and
// strides) and import (a foreign Storage whose release calls the producer's deleter).
#include "dtensor/dlpack.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/cuda.h"
#include "util/check.h"

namespace dtensor {
namespace {

// ---- names for error messages ------------------------------------------------------

std::string dl_dtype_name(DLDataType t) {
  std::string name;
  switch (t.code) {
    case kDLInt: name = "int"; break;
    case kDLUInt: name = "uint"; break;
    case kDLFloat: name = "float"; break;
    case kDLOpaqueHandle: name = "opaque_handle"; break;
    case kDLBfloat: name = "bfloat"; break;
    case kDLComplex: name = "complex"; break;
    case kDLBool: name = "bool"; break;
    case kDLFloat8_e3m4: name = "float8_e3m4_"; break;
    case kDLFloat8_e4m3: name = "float8_e4m3_"; break;
    case kDLFloat8_e4m3b11fnuz: name = "float8_e4m3b11fnuz_"; break;
    case kDLFloat8_e4m3fn: name = "float8_e4m3fn_"; break;
    case kDLFloat8_e4m3fnuz: name = "float8_e4m3fnuz_"; break;
    case kDLFloat8_e5m2: name = "float8_e5m2_"; break;
    case kDLFloat8_e5m2fnuz: name = "float8_e5m2fnuz_"; break;
    case kDLFloat8_e8m0fnu: name = "float8_e8m0fnu_"; break;
    case kDLFloat6_e2m3fn: name = "float6_e2m3fn_"; break;
    case kDLFloat6_e3m2fn: name = "float6_e3m2fn_"; break;
    case kDLFloat4_e2m1fn: name = "float4_e2m1fn_"; break;
    default: name = "code" + std::to_string(t.code) + "_"; break;
  }
  name += std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

std::string dl_device_name(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return "kDLCPU (1)";
    case kDLCUDA: return "kDLCUDA (2)";
    case kDLCUDAHost: return "kDLCUDAHost (3)";
    case kDLOpenCL: return "kDLOpenCL (4)";
    case kDLVulkan: return "kDLVulkan (7)";
    case kDLMetal: return "kDLMetal (8)";
    case kDLVPI: return "kDLVPI (9)";
    case kDLROCM: return "kDLROCM (10)";
    case kDLROCMHost: return "kDLROCMHost (11)";
    case kDLExtDev: return "kDLExtDev (12)";
    case kDLCUDAManaged: return "kDLCUDAManaged (13)";
    case kDLOneAPI: return "kDLOneAPI (14)";
    case kDLWebGPU: return "kDLWebGPU (15)";
    case kDLHexagon: return "kDLHexagon (16)";
    case kDLMAIA: return "kDLMAIA (17)";
  }
  return "device type " + std::to_string(static_cast<int32_t>(d.device_type));
}

// ---- dtype and device mapping --------------------------------------------------------

DLDataType to_dl_dtype(DType t) {
  const auto bits = static_cast<uint8_t>(8 * dtype_size(t));
  switch (t) {
    case DType::F32:
    case DType::F64:
    case DType::F16: return {kDLFloat, bits, 1};
    case DType::BF16: return {kDLBfloat, bits, 1};
    case DType::I64:
    case DType::I32: return {kDLInt, bits, 1};
    case DType::Bool: return {kDLBool, bits, 1};  // one byte per element, as DLPack's bool
  }
  return {kDLOpaqueHandle, 0, 1};
}

DType from_dl_dtype(DLDataType t) {
  DT_CHECK_ARG(t.lanes == 1, "from_dlpack", "vector dtypes are not supported: expected lanes 1, got ", dl_dtype_name(t),
               " (lanes ", t.lanes, ")");
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::Bool}) {
    const DLDataType candidate = to_dl_dtype(d);
    if (candidate.code == t.code && candidate.bits == t.bits) return d;
  }
  throw std::invalid_argument(
      detail::concat("[from_dlpack] unsupported dtype: expected float32, float64, float16, bfloat16, int64, int32 or "
                     "bool8, got ",
                     dl_dtype_name(t)));
}

DLDevice to_dl_device(Device d) {
  if (d.is_cuda()) return {kDLCUDA, d.index};
  return {kDLCPU, 0};
}

Device from_dl_device(DLDevice d) {
  if (d.device_type == kDLCPU) return Device::cpu();
  DT_CHECK_ARG(d.device_type == kDLCUDA, "from_dlpack", "unsupported device: expected kDLCPU (1) or kDLCUDA (2), got ",
               dl_device_name(d));
  DT_CHECK_ARG(d.device_id >= 0, "from_dlpack", "expected a CUDA device id >= 0, got ", d.device_id);
  DT_CHECK_SUPPORTED(cuda_device_count() > d.device_id, "from_dlpack", "a tensor on cuda:", d.device_id, " needs ",
                     d.device_id + 1, " visible GPU(s) and a build with DTENSOR_WITH_CUDA, this process sees ",
                     cuda_device_count());
  return Device::cuda(d.device_id);
}

// ---- export --------------------------------------------------------------------------

// One allocation per export: the managed struct and what it points into.
template <class Managed>
struct ExportContext {
  Managed managed{};
  Tensor tensor;  // keeps the storage alive
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

template <class Managed>
void delete_export(Managed* self) {
  if (self) delete static_cast<ExportContext<Managed>*>(self->manager_ctx);
}

template <class Managed>
Managed* export_tensor(const Tensor& t, const char* op) {
  DT_CHECK_ARG(t.defined(), op, "expected a defined tensor, got an undefined one");
  auto ctx = std::make_unique<ExportContext<Managed>>();
  ctx->tensor = t;
  ctx->shape.assign(t.shape().begin(), t.shape().end());
  ctx->strides.assign(t.strides().begin(), t.strides().end());
  DLTensor& dl = ctx->managed.dl_tensor;
  // DLPack asks for NULL data when there are no elements; data_ptr() also throws
  // for memory FSDP released, which a consumer could not read either.
  dl.data = t.numel() == 0 ? nullptr : t.data_ptr();
  dl.device = to_dl_device(t.device());
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = to_dl_dtype(t.dtype());
  dl.shape = ctx->shape.empty() ? nullptr : ctx->shape.data();
  dl.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
  dl.byte_offset = 0;
  // The consumer may read on any stream (or the host) as soon as it has the struct.
  if (t.device().is_cuda()) cuda::current_stream(t.device().index).synchronize();
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = &delete_export<Managed>;
  return &ctx.release()->managed;
}

// ---- import --------------------------------------------------------------------------

// Wraps `dl` in a Tensor whose storage calls `release` once when the last handle goes.
Tensor import_tensor(const DLTensor& dl, std::function<void()> release) {
  const DType dtype = from_dl_dtype(dl.dtype);
  const Device device = from_dl_device(dl.device);
  DT_CHECK_ARG(dl.ndim >= 0, "from_dlpack", "expected ndim >= 0, got ", dl.ndim);
  DT_CHECK_ARG(dl.ndim == 0 || dl.shape != nullptr, "from_dlpack", "expected a shape array for ndim ", dl.ndim,
               ", got NULL");
  Shape shape(dl.shape, dl.shape + dl.ndim);
  for (int64_t s : shape) DT_CHECK_ARG(s >= 0, "from_dlpack", "expected sizes >= 0, got shape ", shape);
  // NULL strides mean row-major (DLPack < 1.2 allowed them).
  Strides strides = dl.strides ? Strides(dl.strides, dl.strides + dl.ndim) : contiguous_strides(shape);
  for (int64_t s : strides) {
    // dtensor's views never make negative strides, and its kernels and layout checks assume none.
    DT_CHECK_ARG(s >= 0, "from_dlpack", "negative strides are not supported: expected strides >= 0, got ", strides,
                 " for shape ", shape, "; make the tensor contiguous in the producer first");
  }
  const int64_t numel = shape_numel(shape);
  const auto itemsize = static_cast<int64_t>(dtype_size(dtype));
  char* base = static_cast<char*>(dl.data) + dl.byte_offset;
  size_t bytes = 0;
  if (numel > 0) {
    DT_CHECK_ARG(dl.data != nullptr, "from_dlpack", "expected data for a tensor of shape ", shape, ", got NULL");
    // The kernels load whole elements through typed pointers.
    DT_CHECK_ARG(reinterpret_cast<uintptr_t>(base) % itemsize == 0, "from_dlpack",
                 "expected data + byte_offset aligned to the ", itemsize, "-byte element size, got address ",
                 static_cast<const void*>(base));
    int64_t last = 0;  // the element farthest from the first: the storage ends after it
    for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
    bytes = static_cast<size_t>((last + 1) * itemsize);
  }
  auto storage = std::make_shared<Storage>(numel > 0 ? base : nullptr, bytes, device, std::move(release));
  return Tensor::from_storage(std::move(storage), dtype, std::move(shape), std::move(strides), 0);
}

// The producer's deleter, called once dtensor's queued GPU work on the memory has run.
template <class Managed>
std::function<void()> release_by_deleter(Managed* managed) {
  const DLDevice device = managed->dl_tensor.device;
  return [managed, device] {
    if (device.device_type == kDLCUDA) {
      try {
        cuda::synchronize(device.device_id);
      } catch (...) {
        // A failing GPU cannot be waited on; handing the memory back is still the
        // only way not to leak it, and a destructor must not throw.
      }
    }
    if (managed->deleter) managed->deleter(managed);
  };
}

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) { return export_tensor<DLManagedTensor>(t, "to_dlpack"); }

DLManagedTensorVersioned* to_dlpack_versioned(const Tensor& t) {
  DLManagedTensorVersioned* out = export_tensor<DLManagedTensorVersioned>(t, "to_dlpack_versioned");
  out->version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  out->flags = 0;
  return out;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  DT_CHECK_ARG(managed != nullptr, "from_dlpack", "expected a DLManagedTensor, got NULL");
  return import_tensor(managed->dl_tensor, release_by_deleter(managed));
}

Tensor from_dlpack(DLManagedTensorVersioned* managed) {
  DT_CHECK_ARG(managed != nullptr, "from_dlpack", "expected a DLManagedTensorVersioned, got NULL");
  // Only `version` may be read before the major version is known to match.
  DT_CHECK_ARG(managed->version.major == DLPACK_MAJOR_VERSION, "from_dlpack", "expected DLPack major version ",
               DLPACK_MAJOR_VERSION, ", got ", managed->version.major, ".", managed->version.minor,
               "; the caller still owns the tensor and must call its deleter");
  DT_CHECK_ARG((managed->flags & DLPACK_FLAG_BITMASK_READ_ONLY) == 0, "from_dlpack",
               "expected a writable tensor, got one flagged read-only (DLPACK_FLAG_BITMASK_READ_ONLY): dtensor tensors "
               "are always writable; export a copy instead");
  return import_tensor(managed->dl_tensor, release_by_deleter(managed));
}

}  // namespace dtensor
