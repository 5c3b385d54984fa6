// The GEMM engines dtensor can call on the CPU, behind one interface (internal).
//
// An engine multiplies row-major matrices on the calling thread only: gemm.cpp
// splits every call over the rank's pool (parallel.h), so a library's own threads
// never run. Engines: OpenBLAS (always; its kernel is chosen by OpenBLAS's CPU
// model table or OPENBLAS_CORETYPE), oneDNN (DTENSOR_WITH_ONEDNN; dispatches on ISA
// features, with AVX512-BF16/AMX paths for BF16) and BLIS (DTENSOR_WITH_BLIS;
// dispatches on the CPU family). Which engine runs a shape is measured, not guessed:
// see gemm.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtensor::backend::cpu {

// op(A) [m, k] times op(B) [k, n] into C [m, n] (row-major, leading dims lda, ldb,
// ldc). trans_a: A is stored [k, m]; trans_b: B is stored [n, k]. beta is 0 (C is
// overwritten) or 1 (C is accumulated into).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float beta = 0.0f;
};

class GemmEngine {
 public:
  virtual ~GemmEngine() = default;
  // Short name: "openblas", "onednn", "blis" (what DTENSOR_GEMM_ENGINE takes).
  virtual const char* name() const = 0;
  // Version and kernel in use, e.g. "OpenBLAS 0.3.21, SkylakeX kernels".
  virtual std::string describe() const = 0;
  // F32 inputs and output.
  virtual void sgemm(const GemmArgs& g, const float* a, const float* b, float* c) = 0;
  // F64; engines without it return false and are not asked again.
  virtual bool dgemm(const GemmArgs& g, const double* a, const double* b, double* c) { return false; }
  // BF16 inputs (raw bits), F32 output, F32 accumulation. Only called when
  // native_bf16() is true.
  virtual void bf16gemm(const GemmArgs& g, const uint16_t* a, const uint16_t* b, float* c) {}
  // The same with a BF16 output rounded by the engine (beta 0 only); false when the
  // engine cannot, and the caller rounds an F32 result itself.
  virtual bool bf16gemm_rounded(const GemmArgs& g, const uint16_t* a, const uint16_t* b, uint16_t* c) {
    return false;
  }
  // True when the engine has a BF16 GEMM that runs on this CPU's BF16 instructions
  // (AVX512-BF16 or AMX), not an emulation slower than converting to F32.
  virtual bool native_bf16() const { return false; }
  // A warning about this engine on this CPU ("" when none): OpenBLAS names a
  // detected kernel weaker than the CPU's features and what to set.
  virtual std::string warning() const { return ""; }
};

// The engines compiled into this build, OpenBLAS first.
const std::vector<std::unique_ptr<GemmEngine>>& gemm_engines();

// Factories of the optional engines; the stubs return null.
std::unique_ptr<GemmEngine> make_openblas_engine();
std::unique_ptr<GemmEngine> make_onednn_engine();
std::unique_ptr<GemmEngine> make_blis_engine();

}  // namespace dtensor::backend::cpu
