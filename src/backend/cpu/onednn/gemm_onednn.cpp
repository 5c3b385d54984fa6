// The oneDNN engine (DTENSOR_WITH_ONEDNN).
//
// oneDNN chooses its kernels from the ISA features it finds (AVX2, AVX-512,
// AVX512-BF16, AMX), not from a CPU model table, so a new CPU gets the kernels of
// its instruction set. F32 goes through dnnl_sgemm. BF16 goes through a cached
// matmul primitive per shape (bf16 x bf16 -> f32, or -> bf16 rounded in the
// kernel's epilogue), which runs on AMX tiles or AVX512-BF16 where the CPU has them.
//
// Debian's oneDNN uses OpenMP; dtensor calls it from its own pool, one thread per
// call, so every call sets the calling thread's OpenMP thread count to 1 and
// restores it afterwards (a per-thread setting: the user's is left as it was).
#include <omp.h>

#include <dnnl.hpp>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/cpu/gemm_engine.h"

namespace dtensor::backend::cpu {
namespace {

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "unknown ISA";
  }
}

bool has_isa(dnnl_cpu_isa_t isa, dnnl_cpu_isa_t want) {
  return (static_cast<unsigned>(isa) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

// One OpenMP thread for the calling thread while in scope.
class SingleThreadedOmp {
 public:
  SingleThreadedOmp() : previous_(omp_get_max_threads()) {
    if (previous_ != 1) omp_set_num_threads(1);
  }
  ~SingleThreadedOmp() {
    if (previous_ != 1) omp_set_num_threads(previous_);
  }
  SingleThreadedOmp(const SingleThreadedOmp&) = delete;
  SingleThreadedOmp& operator=(const SingleThreadedOmp&) = delete;

 private:
  int previous_;
};

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) {
    throw std::runtime_error(std::string("[matmul] oneDNN ") + what + " failed with status " +
                             std::to_string(static_cast<int>(status)));
  }
}

struct Bf16Key {
  bool trans_a, trans_b, accumulate, bf16_out;
  int64_t m, n, k, lda, ldb, ldc;
  bool operator==(const Bf16Key&) const = default;
};

struct Bf16KeyHash {
  size_t operator()(const Bf16Key& key) const {
    size_t h = (key.trans_a ? 1u : 0u) | (key.trans_b ? 2u : 0u) | (key.accumulate ? 4u : 0u) |
               (key.bf16_out ? 8u : 0u);
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) {
      h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return h;
  }
};

class OneDnnEngine final : public GemmEngine {
 public:
  OneDnnEngine() : engine_(dnnl::engine::kind::cpu, 0), isa_(dnnl_get_effective_cpu_isa()) {}

  const char* name() const override { return "onednn"; }
  std::string describe() const override {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + ", " + isa_name(isa_) + " kernels";
  }

  void sgemm(const GemmArgs& g, const float* a, const float* b, float* c) override {
    SingleThreadedOmp one_thread;
    check(dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.m, g.n, g.k, 1.0f, a, g.lda, b, g.ldb,
                     g.beta, c, g.ldc),
          "sgemm");
  }

  bool native_bf16() const override { return has_isa(isa_, dnnl_cpu_isa_avx512_core_bf16); }

  void bf16gemm(const GemmArgs& g, const uint16_t* a, const uint16_t* b, float* c) override {
    run_bf16({g.trans_a, g.trans_b, g.beta != 0.0f, false, g.m, g.n, g.k, g.lda, g.ldb, g.ldc}, a, b, c);
  }

  bool bf16gemm_rounded(const GemmArgs& g, const uint16_t* a, const uint16_t* b, uint16_t* c) override {
    if (g.beta != 0.0f) return false;
    run_bf16({g.trans_a, g.trans_b, false, true, g.m, g.n, g.k, g.lda, g.ldb, g.ldc}, a, b, c);
    return true;
  }

 private:
  void run_bf16(const Bf16Key& key, const uint16_t* a, const uint16_t* b, void* c) {
    using dnnl::memory;
    const Bf16Primitive& p = bf16_primitive(key);
    SingleThreadedOmp one_thread;
    thread_local dnnl::stream stream(engine_);
    // Each thread brings its own scratchpad (user mode): with the library's shared
    // one, a primitive may only run on the thread that created it, and dtensor's
    // rank threads and pool workers share primitives.
    thread_local std::vector<unsigned char> scratchpad;
    if (scratchpad.size() < p.scratchpad.get_size()) scratchpad.resize(p.scratchpad.get_size());
    memory ma(p.a, engine_, const_cast<uint16_t*>(a));
    memory mb(p.b, engine_, const_cast<uint16_t*>(b));
    memory mc(p.c, engine_, c);
    memory ms(p.scratchpad, engine_, scratchpad.data());
    p.matmul.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}});
    stream.wait();
  }

  struct Bf16Primitive {
    dnnl::memory::desc a, b, c, scratchpad;
    dnnl::matmul matmul;
  };

  // Built once per shape: creating a primitive generates its kernel (tens of us).
  const Bf16Primitive& bf16_primitive(const Bf16Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = primitives_.find(key);
    if (it != primitives_.end()) return it->second;
    using dnnl::memory;
    using dt = memory::data_type;
    // op(A) [m, k]: A stored [m, k] row-major (strides lda, 1) or [k, m] (1, lda).
    const memory::desc a({key.m, key.k}, dt::bf16,
                         key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
    const memory::desc b({key.k, key.n}, dt::bf16,
                         key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
    const memory::desc c({key.m, key.n}, key.bf16_out ? dt::bf16 : dt::f32, memory::dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
    return primitives_.emplace(key, Bf16Primitive{a, b, c, pd.scratchpad_desc(), dnnl::matmul(pd)}).first->second;
  }

  dnnl::engine engine_;
  dnnl_cpu_isa_t isa_;
  std::mutex mutex_;
  std::unordered_map<Bf16Key, Bf16Primitive, Bf16KeyHash> primitives_;
};

}  // namespace

std::unique_ptr<GemmEngine> make_onednn_engine() { return std::make_unique<OneDnnEngine>(); }

}  // namespace dtensor::backend::cpu
