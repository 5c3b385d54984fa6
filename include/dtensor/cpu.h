// What the CPU backend runs on and with, for logs and benchmark records.
//
//   std::printf("%s\n", dtensor::cpu::summary().c_str());
//   for (const std::string& w : dtensor::cpu::warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
//
// GEMM engines (OpenBLAS always; oneDNN and BLIS when the build found them) are
// chosen per GEMM shape by measuring them on the first calls of that shape;
// DTENSOR_GEMM_ENGINE=openblas|onednn|blis pins one. All CPU kernels of a rank, GEMM
// included, share one budget of cores (usable cores / ranks on the host, or
// DTENSOR_NUM_THREADS). See docs/cpu-kernels.md.
#pragma once

#include <string>
#include <vector>

namespace dtensor::cpu {

// One line: the CPU and the vector features the kernels use, threads per rank, the
// GEMM engines with their kernels, and how one is chosen.
std::string summary();

// Things about this setup that cost speed ("" never appears; empty when none), e.g.
// OpenBLAS running a kernel older than the CPU because it does not know the model.
std::vector<std::string> warnings();

// One line per GEMM shape measured so far (shapes within a quarter octave of it, above
// 64 in each size, share its choice and are not listed): the route chosen and each
// candidate's measured rate per core (FLOPs over the CPU seconds of all threads that
// ran it), e.g.
// "f32 NT 1024x1024x256 on 2 threads: openblas (openblas 141 GFLOP/s per core, onednn 111 ...)".
std::vector<std::string> gemm_choices();

// Cores each rank's kernels use.
int threads_per_rank();

}  // namespace dtensor::cpu
