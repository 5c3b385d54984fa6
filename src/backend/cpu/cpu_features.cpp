// CPU feature detection (see cpu_features.h).
#include "backend/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace dtensor::backend::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.a, r.b, r.c, r.d);
  return r;
}

unsigned long long xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs v = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  if (cpuid(0x80000000u, 0).a >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    std::string_view b(brand);
    while (!b.empty() && b.front() == ' ') b.remove_prefix(1);
    while (!b.empty() && (b.back() == ' ' || b.back() == '\0')) b.remove_suffix(1);
    f.model = std::string(b);
  }
  const unsigned max_leaf = v.a;
  const Regs l1 = cpuid(1, 0);
  const bool osxsave = (l1.c >> 27) & 1;
  const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM and YMM state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;     // XTILECFG, XTILEDATA
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    const bool fma = (l1.c >> 12) & 1;
    f.avx2 = os_avx && fma && ((l7.b >> 5) & 1);
    const bool avx512f = (l7.b >> 16) & 1, avx512dq = (l7.b >> 17) & 1;
    const bool avx512bw = (l7.b >> 30) & 1, avx512vl = (l7.b >> 31) & 1;
    f.avx512 = f.avx2 && os_avx512 && avx512f && avx512dq && avx512bw && avx512vl;
    if (l7.a >= 1) f.avx512_bf16 = f.avx512 && ((cpuid(7, 1).a >> 5) & 1);
    f.amx_bf16 = os_amx && ((l7.d >> 22) & 1) && ((l7.d >> 24) & 1);
  }
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string cpu_feature_string() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx512, "avx512");
  add(!f.avx512 && f.avx2, "avx2");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_bf16, "amx_bf16");
  return s.empty() ? "baseline" : s;
}

const char* kernel_isa() {
  static const char* const isa = [] {
    const CpuFeatures& f = cpu_features();
    const char* cap = std::getenv("DTENSOR_CPU_ISA");
    const std::string_view want = cap ? cap : "";
    if (f.avx512 && (want.empty() || want == "avx512")) return "avx512";
    if (f.avx2 && want != "baseline") return "avx2";
    return "baseline";
  }();
  return isa;
}

}  // namespace dtensor::backend::cpu
