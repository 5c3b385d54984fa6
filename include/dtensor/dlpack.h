// Zero-copy exchange of local tensors with other frameworks through DLPack
// (PyTorch, JAX, CuPy, NumPy, TVM, ...): the memory is shared, never copied.
//
//   DLManagedTensorVersioned* out = to_dlpack_versioned(t);  // hand `out` to a consumer
//   Tensor x = from_dlpack(producer_tensor);                 // x owns producer_tensor now
//   DistTensor d = DistTensor::from_local(from_dlpack(shard), mesh, {Shard(0)});
//
// Export: the result shares t's storage and keeps it alive until the consumer
// calls its deleter (exactly once). `data` points at the first element and
// `byte_offset` is 0 (as PyTorch exports); strides count elements and are always
// given; an empty tensor has data NULL. Versioned exports are DLPack 1.1 with no
// flags (writable, not a copy). A CUDA tensor is exported once the work queued on
// the calling thread's current stream of its GPU has run, since the C API carries
// no stream; the consumer must finish its own work on the memory before the deleter.
//
// Import: the Tensor takes ownership and calls managed->deleter(managed) once,
// when the last Tensor sharing that memory goes away (views and copies of the
// handle included). Memory imported from a GPU is released after the GPU's queued
// work has run, since dtensor's kernels run asynchronously. The producer must have
// finished writing the memory (the C API has no stream to wait on). Accepted:
// CPU (kDLCPU) and CUDA (kDLCUDA) memory, the dtypes float32/64, float16,
// bfloat16, int64, int32 and bool (8 bits) with lanes 1, non-negative strides
// (NULL strides mean row-major), element-aligned data. Anything else throws
// std::invalid_argument ("[from_dlpack] ..."), a CUDA tensor in a build or on a
// machine without CUDA std::runtime_error. On a throw nothing was taken: the
// caller still owns `managed` and must call its deleter.
//
// Imported memory is not charged to memory_stats (dtensor did not allocate it).
#pragma once

#include "dtensor/dlpack_abi.h"
#include "dtensor/tensor.h"

namespace dtensor {

// The legacy (pre-1.0) struct, still the one most C++ consumers take.
DLManagedTensor* to_dlpack(const Tensor& t);
// The DLPack >= 1.0 struct (version 1.1, flags 0).
DLManagedTensorVersioned* to_dlpack_versioned(const Tensor& t);

Tensor from_dlpack(DLManagedTensor* managed);
// Also refuses a different major version (the layout after `version` may differ)
// and read-only tensors (DLPACK_FLAG_BITMASK_READ_ONLY): every dtensor Tensor is
// writable, and in-place ops would write into memory the producer shares as constant.
Tensor from_dlpack(DLManagedTensorVersioned* managed);

}  // namespace dtensor
