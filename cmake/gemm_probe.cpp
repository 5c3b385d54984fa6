// Configure-time probe (cmake/DtensorGemmSummary.cmake): prints, as key=value
// lines, the kernels the GEMM engines of this build pick on this machine.
#include <cblas.h>

#include <cstdio>
#include <cstring>

#ifdef PROBE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef PROBE_BLIS
// blis.h would clash with cblas.h here; these three are all the probe needs.
extern "C" {
int bli_arch_query_id(void);
char* bli_arch_string(int id);
char* bli_info_get_version_str(void);
}
#endif

int main() {
  std::printf("openblas=%s\n", openblas_get_corename());
  std::printf("avx512=%d\navx2=%d\n", __builtin_cpu_supports("avx512f") ? 1 : 0,
              __builtin_cpu_supports("avx2") ? 1 : 0);
#ifdef PROBE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "older ISA";
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl_cpu_isa_avx2: isa = "avx2"; break;
    default: break;
  }
  std::printf("onednn=%d.%d.%d, %s kernels\n", v->major, v->minor, v->patch, isa);
#endif
#ifdef PROBE_BLIS
  std::printf("blis=%s, %s\n", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()));
#endif
  return 0;
}
