// The OpenBLAS engine (always built).
//
// OpenBLAS picks its kernel at load time from a table of CPU models; a model it does
// not know falls back to an older kernel (Debian's 0.3.21 runs `Prescott`, SSE3, on
// Intel Xeon model 207: 15.6 against 84 GFLOP/s on a 2048^3 sgemm with
// OPENBLAS_CORETYPE=Cooperlake). We never set OPENBLAS_CORETYPE ourselves (the
// library reads it before any of our code runs, and it is the user's choice);
// instead warning() says when the detected kernel is weaker than the CPU's
// features and what to set, and gemm.cpp's measurement routes shapes to whichever
// engine is faster.
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_engine.h"

namespace dtensor::backend::cpu {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The vector level of an OpenBLAS x86 kernel name: 3 AVX-512, 2 AVX2, 1 AVX, 0 SSE.
int kernel_level(const std::string& core) {
  const std::string c = lower(core);
  for (const char* k : {"skylakex", "cooperlake", "sapphirerapids"}) {
    if (c == k) return 3;
  }
  for (const char* k : {"haswell", "zen", "excavator"}) {
    if (c == k) return 2;
  }
  for (const char* k : {"sandybridge", "bulldozer", "piledriver", "steamroller"}) {
    if (c == k) return 1;
  }
  return 0;
}

// The kernel OpenBLAS 0.3.21 has for this CPU's features.
const char* best_kernel_for_cpu(int* level) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512) {
    *level = 3;
    return f.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  }
  if (f.avx2) {
    *level = 2;
    return f.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  }
  *level = 0;
  return "";
}

CBLAS_TRANSPOSE trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

// cblas_sbgemm's signature (bfloat16 is OpenBLAS's uint16_t).
using SbgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                          const uint16_t*, blasint, const uint16_t*, blasint, float, float*, blasint);

class OpenBlasEngine final : public GemmEngine {
 public:
  OpenBlasEngine() : sbgemm_(reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"))) {
    // dtensor splits GEMMs over its own pool: OpenBLAS runs in the calling thread.
    openblas_set_num_threads(1);
  }
  const char* name() const override { return "openblas"; }
  std::string describe() const override {
    // OPENBLAS_VERSION is " OpenBLAS 0.3.21 ".
    std::string s = OPENBLAS_VERSION;
    s = s.substr(s.find_first_not_of(' '));
    s = s.substr(0, s.find_last_not_of(' ') + 1);
    s += std::string(", ") + openblas_get_corename() + " kernels";
    if (std::getenv("OPENBLAS_CORETYPE")) s += " (OPENBLAS_CORETYPE)";
    return s;
  }
  void sgemm(const GemmArgs& g, const float* a, const float* b, float* c) override {
    cblas_sgemm(CblasRowMajor, trans(g.trans_a), trans(g.trans_b), g.m, g.n, g.k, 1.0f, a, g.lda, b, g.ldb,
                g.beta, c, g.ldc);
  }
  bool dgemm(const GemmArgs& g, const double* a, const double* b, double* c) override {
    cblas_dgemm(CblasRowMajor, trans(g.trans_a), trans(g.trans_b), g.m, g.n, g.k, 1.0, a, g.lda, b, g.ldb,
                g.beta, c, g.ldc);
    return true;
  }
  void bf16gemm(const GemmArgs& g, const uint16_t* a, const uint16_t* b, float* c) override {
    sbgemm_(CblasRowMajor, trans(g.trans_a), trans(g.trans_b), g.m, g.n, g.k, 1.0f, a, g.lda, b, g.ldb, g.beta, c,
            g.ldc);
  }
  // sbgemm exists only in OpenBLAS builds with BUILD_BFLOAT16 (Debian's has none), so
  // it is looked up at run time; and only the Cooperlake and Sapphire Rapids kernels
  // run it on AVX512-BF16 (the others run a generic loop slower than converting).
  bool native_bf16() const override {
    const std::string c = lower(openblas_get_corename());
    return sbgemm_ && cpu_features().avx512_bf16 && (c == "cooperlake" || c == "sapphirerapids");
  }
  std::string warning() const override {
    const std::string core = openblas_get_corename();
    int cpu_level = 0;
    const char* best = best_kernel_for_cpu(&cpu_level);
    if (kernel_level(core) >= cpu_level) return "";
    std::string w = "OpenBLAS runs its " + core + " kernels on a CPU with " + cpu_feature_string() + " (" +
                    cpu_features().model + ")";
    if (std::getenv("OPENBLAS_CORETYPE")) return w + ", as OPENBLAS_CORETYPE asks";
    return w + ": OpenBLAS does not know this CPU model; OPENBLAS_CORETYPE=" + best +
           " selects its faster kernels (dtensor routes GEMMs to the fastest engine either way)";
  }

 private:
  SbgemmFn sbgemm_;
};

}  // namespace

std::unique_ptr<GemmEngine> make_openblas_engine() { return std::make_unique<OpenBlasEngine>(); }

}  // namespace dtensor::backend::cpu
