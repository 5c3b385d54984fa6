// The DLPack 1.1 ABI: the C structs and enums that frameworks exchange tensors
// through (https://dmlc.github.io/dlpack/latest/c_api.html), declared here so that
// dtensor does not need the official header.
//
// These are the official declarations, names and values, under the official
// include guard: whichever of this file and <dlpack/dlpack.h> comes first defines
// them and the other is skipped, so a program may include both, in any order:
//
//   #include <dlpack/dlpack.h>   // optional, e.g. from PyTorch or a package
//   #include <dtensor/dlpack.h>
//
// Include the official header first to see names added after 1.1 (kDLTrn, the
// exchange API of 1.3). An official header older than 1.0 (Debian's
// libdlpack-dev is 0.6) has no versioned struct and no kDLBool; it is refused
// with an #error rather than compiled against a different ABI.
//
// The only macros defined are DLPack's own (DLPACK_DLPACK_H_, DLPACK_*_VERSION,
// DLPACK_EXTERN_C, DLPACK_DLL, DLPACK_FLAG_BITMASK_*), as the official header
// defines them.
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#ifdef __cplusplus
#define DLPACK_EXTERN_C extern "C"
#else
#define DLPACK_EXTERN_C
#endif

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1

#ifdef _WIN32
#ifdef DLPACK_EXPORTS
#define DLPACK_DLL __declspec(dllexport)
#else
#define DLPACK_DLL __declspec(dllimport)
#endif
#else
#define DLPACK_DLL
#endif

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// A change of major version changes the layout of DLManagedTensorVersioned; a
// change of minor version only adds enum values.
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // pinned host memory from cudaMallocHost
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,  // unified memory from cudaMallocManaged
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;  // 0 for CPU, pinned and managed memory
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,  // stored in 8 bits
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U,
} DLDataTypeCode;

// float32 is {kDLFloat, 32, 1}; lanes > 1 is a vector type (float4: lanes 4).
typedef struct {
  uint8_t code;  // a DLDataTypeCode, kept in 8 bits
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

// A tensor that owns nothing. Element (i0, i1, ...) is at
// (char*)data + byte_offset + (i0 * strides[0] + ...) * bits / 8; strides count
// elements. NULL strides meant row-major before DLPack 1.2, which forbids them.
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

// The pre-1.0 exchange struct: the consumer calls deleter(self) when done, which
// frees manager_ctx and self. deleter may be NULL.
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

// The exchange struct of DLPack >= 1.0: version first, so that a consumer can
// check the major version (and call deleter) without knowing the rest of the layout.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;  // DLPACK_FLAG_BITMASK_*
  DLTensor dl_tensor;
};

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // DLPACK_DLPACK_H_

// Outside the guard: also checks an official header included before this one.
#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION != 1
#error "dtensor/dlpack_abi.h: the DLPack header included first is not DLPack 1.x; dtensor needs the 1.x ABI"
#endif
