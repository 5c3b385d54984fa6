// The public description of the CPU backend (dtensor/cpu.h).
#include "dtensor/cpu.h"

#include <cstdlib>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_kernels.h"

namespace dtensor::cpu {

std::string summary() {
  using namespace backend::cpu;
  const CpuFeatures& f = cpu_features();
  std::string s = "CPU " + (f.model.empty() ? f.vendor : f.model) + " (" + cpu_feature_string() + "; kernels " +
                  vec().isa + "), " + std::to_string(rank_threads()) + " thread" +
                  (rank_threads() == 1 ? "" : "s") + " per rank; GEMM: ";
  const auto& engines = gemm_engines();
  for (size_t i = 0; i < engines.size(); ++i) s += (i ? ", " : "") + engines[i]->describe();
  const char* pinned = std::getenv("DTENSOR_GEMM_ENGINE");
  if (pinned && *pinned && std::string(pinned) != "auto") {
    s += std::string("; DTENSOR_GEMM_ENGINE=") + pinned;
  } else if (engines.size() > 1) {
    s += "; chosen per shape by measurement";
  }
  return s;
}

std::vector<std::string> warnings() {
  std::vector<std::string> out;
  for (const auto& engine : backend::cpu::gemm_engines()) {
    std::string w = engine->warning();
    if (!w.empty()) out.push_back(std::move(w));
  }
  return out;
}

std::vector<std::string> gemm_choices() { return backend::cpu::gemm_choices(); }

int threads_per_rank() { return backend::cpu::rank_threads(); }

}  // namespace dtensor::cpu
