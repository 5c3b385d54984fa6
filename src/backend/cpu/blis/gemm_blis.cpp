// The BLIS engine (DTENSOR_WITH_BLIS).
//
// BLIS picks a kernel per CPU family at run time (Debian builds its x86_64
// configuration: Zen, Haswell, Skylake-X, ...). Its typed API takes a row and a
// column stride per operand, so any transposed view goes in as it is. Each call runs
// on the calling thread (a runtime object asking for one thread), as dtensor's pool
// splits the work.
//
// The library is opened with dlopen(RTLD_LOCAL) rather than linked: BLIS also
// exports the CBLAS and BLAS symbols (cblas_sgemm, sgemm_, ...), and linked into the
// same process it could take OpenBLAS's place behind the OpenBLAS engine's calls.
// Kept local, its symbols are reachable only through the pointers below. A machine
// without the library simply has no BLIS engine.
#include <blis.h>
#include <dlfcn.h>

#include <string>

#include "backend/cpu/gemm_engine.h"

#ifndef DTENSOR_BLIS_LIBRARY_PATH
#define DTENSOR_BLIS_LIBRARY_PATH "libblis.so.4"
#endif

namespace dtensor::backend::cpu {
namespace {

using SgemmEx = void (*)(trans_t, trans_t, dim_t, dim_t, dim_t, float*, float*, inc_t, inc_t, float*, inc_t, inc_t,
                         float*, float*, inc_t, inc_t, cntx_t*, rntm_t*);
using DgemmEx = void (*)(trans_t, trans_t, dim_t, dim_t, dim_t, double*, double*, inc_t, inc_t, double*, inc_t,
                         inc_t, double*, double*, inc_t, inc_t, cntx_t*, rntm_t*);

struct BlisLibrary {
  void* handle = nullptr;
  SgemmEx sgemm = nullptr;
  DgemmEx dgemm = nullptr;
  void (*init)() = nullptr;
  arch_t (*arch_query_id)() = nullptr;
  char* (*arch_string)(arch_t) = nullptr;
  char* (*version)() = nullptr;

  bool open() {
    for (const char* path : {DTENSOR_BLIS_LIBRARY_PATH, "libblis.so.4"}) {
      handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
    }
    if (!handle) return false;
    sgemm = reinterpret_cast<SgemmEx>(dlsym(handle, "bli_sgemm_ex"));
    dgemm = reinterpret_cast<DgemmEx>(dlsym(handle, "bli_dgemm_ex"));
    init = reinterpret_cast<void (*)()>(dlsym(handle, "bli_init"));
    arch_query_id = reinterpret_cast<arch_t (*)()>(dlsym(handle, "bli_arch_query_id"));
    arch_string = reinterpret_cast<char* (*)(arch_t)>(dlsym(handle, "bli_arch_string"));
    version = reinterpret_cast<char* (*)()>(dlsym(handle, "bli_info_get_version_str"));
    return sgemm && dgemm && init && arch_query_id && arch_string && version;
  }
};

// Row and column strides of op(X) for a row-major X with leading dim ld.
struct Strides2 {
  inc_t rows, cols;
};
Strides2 strides_of(bool transposed, int64_t ld) { return transposed ? Strides2{1, ld} : Strides2{ld, 1}; }

class BlisEngine final : public GemmEngine {
 public:
  explicit BlisEngine(const BlisLibrary& lib) : lib_(lib) { lib_.init(); }
  const char* name() const override { return "blis"; }
  std::string describe() const override {
    return std::string("BLIS ") + lib_.version() + ", " + lib_.arch_string(lib_.arch_query_id()) + " kernels";
  }
  void sgemm(const GemmArgs& g, const float* a, const float* b, float* c) override { run(lib_.sgemm, g, a, b, c); }
  bool dgemm(const GemmArgs& g, const double* a, const double* b, double* c) override {
    run(lib_.dgemm, g, a, b, c);
    return true;
  }

 private:
  // One call of bli_?gemm_ex on the calling thread. The strides already describe
  // op(A) and op(B), so both go in untransposed.
  template <class Fn, class T>
  static void run(Fn gemm, const GemmArgs& g, const T* a, const T* b, T* c) {
    T one = 1, beta = static_cast<T>(g.beta);
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    const Strides2 sa = strides_of(g.trans_a, g.lda), sb = strides_of(g.trans_b, g.ldb);
    gemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g.m, g.n, g.k, &one, const_cast<T*>(a), sa.rows, sa.cols,
         const_cast<T*>(b), sb.rows, sb.cols, &beta, c, g.ldc, 1, nullptr, &rntm);
  }

  BlisLibrary lib_;
};

}  // namespace

std::unique_ptr<GemmEngine> make_blis_engine() {
  BlisLibrary lib;
  if (!lib.open()) return nullptr;
  return std::make_unique<BlisEngine>(lib);
}

}  // namespace dtensor::backend::cpu
