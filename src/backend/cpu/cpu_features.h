// What this CPU can do, read once from cpuid (internal).
//
// The vectorised kernels pick their instruction set from these flags at run time
// (never from the CPU model), and the GEMM summary names them.
#pragma once

#include <string>

namespace dtensor::backend::cpu {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string model;   // the brand string, e.g. "Intel(R) Xeon(R) Processor"
  bool avx2 = false;   // with FMA
  bool avx512 = false; // F, BW, DQ and VL, with the OS saving the state
  bool avx512_bf16 = false;
  bool amx_bf16 = false;  // AMX tiles with BF16 (the OS may still need to grant them)
};

const CpuFeatures& cpu_features();

// "avx512 avx512_bf16 amx_bf16", "avx2", or "baseline".
std::string cpu_feature_string();

// The widest vector instruction set the kernels use here: "avx512", "avx2" or
// "baseline" (SSE2). DTENSOR_CPU_ISA=avx2|baseline caps it (for tests and
// comparisons); it never raises it above what the CPU has.
const char* kernel_isa();

}  // namespace dtensor::backend::cpu
