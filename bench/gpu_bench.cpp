// The GPU figures of scripts/gpu-check.sh: elementwise kernels, reductions, copies
// and matmul on one GPU, timed with CUDA events, each next to its same-run baseline (a device-to-
// device copy of the same bytes, which is what a memory-bound kernel can reach),
// and the caching allocator's cost per allocation. Needs no Google Benchmark.
//   gpu_bench [table.md]    # prints the table, and writes it to the file too
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/cuda.h"
#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

// Median milliseconds of `reps` runs of fn on the current stream (after 2 warm-ups).
double time_ms(const std::function<void()>& fn, int reps = 10) {
  for (int i = 0; i < 2; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cuda::Event start(true), stop(true);
    start.record();
    fn();
    stop.record();
    stop.synchronize();
    ms.push_back(start.elapsed_ms(stop));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string what;
  double ms;
  double gbps;
  double baseline_gbps;
};

std::string table(const std::vector<Row>& rows) {
  std::ostringstream out;
  out << "| what | median ms | GB/s | same-run baseline GB/s | ratio |\n|---|---|---|---|---|\n";
  char line[256];
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "| %s | %.3f | %.1f | %.1f | %.2f |\n", r.what.c_str(), r.ms, r.gbps,
                  r.baseline_gbps, r.baseline_gbps > 0 ? r.gbps / r.baseline_gbps : 0.0);
    out << line;
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda_is_available()) {
    const char* text = "gpu_bench: no GPU visible, nothing measured\n";
    std::fputs(text, stdout);
    if (argc > 1) std::ofstream(argv[1]) << text;
    return 1;
  }
  std::vector<Row> rows;
  const int64_t n = int64_t{1} << 26;  // 64 Mi elements: 256 MiB in F32
  // The baseline: a device-to-device copy of one operand's bytes (read + write).
  auto copy_gbps = [&](DType t) {
    Tensor src = Tensor::zeros({n}, t, kGpu), dst = Tensor::empty({n}, t, kGpu);
    const double ms = time_ms([&] { dst.copy_(src); });
    return 2.0 * static_cast<double>(src.nbytes()) / (ms * 1e6);
  };
  for (DType t : {DType::F32, DType::BF16}) {
    const double base = copy_gbps(t);
    const std::string dt(dtype_name(t));
    Tensor a = Tensor::ones({n}, t, kGpu), b = Tensor::ones({n}, t, kGpu);
    const double bytes = static_cast<double>(a.nbytes());
    double ms = time_ms([&] { Tensor c = add(a, b); });
    rows.push_back({"add " + dt + " [64Mi]", ms, 3 * bytes / (ms * 1e6), base});
    ms = time_ms([&] { Tensor c = gelu(a); });
    rows.push_back({"gelu(erf) " + dt + " [64Mi]", ms, 2 * bytes / (ms * 1e6), base});
    Tensor m = Tensor::ones({8192, 8192}, t, kGpu), row = Tensor::ones({8192}, t, kGpu);
    ms = time_ms([&] { Tensor c = mul(m, row); });
    rows.push_back({"mul broadcast row " + dt + " [8192,8192]x[8192]", ms, 2 * bytes / (ms * 1e6), base});
    ms = time_ms([&] { Tensor c = sum(m, {1}); });
    rows.push_back({"sum over rows " + dt + " [8192,8192] -> [8192]", ms, bytes / (ms * 1e6), base});
    ms = time_ms([&] { Tensor c = sum(m, {0}); });
    rows.push_back({"sum over columns " + dt + " [8192,8192] -> [8192]", ms, bytes / (ms * 1e6), base});
    Tensor mt = m.transpose(0, 1);
    ms = time_ms([&] { Tensor c = mt.contiguous(); });
    rows.push_back({"transpose copy " + dt + " [8192,8192]", ms, 2 * bytes / (ms * 1e6), base});
    ms = time_ms([&] { Tensor c = a.to(t == DType::F32 ? DType::BF16 : DType::F32); });
    const double out_bytes = static_cast<double>(n) * (t == DType::F32 ? 2 : 4);
    rows.push_back(
        {"cast " + dt + " -> " + (t == DType::F32 ? "bf16" : "f32"), ms, (bytes + out_bytes) / (ms * 1e6), base});
  }
  // Host copies through the pinned staging buffers, against a plain cudaMemcpy's
  // rate being unknown here: the baseline column is left empty.
  Tensor host = Tensor::ones({n});
  Tensor dev = host.to(kGpu);
  auto wall_ms = [](const std::function<void()>& fn) {
    fn();
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      cuda::synchronize(0);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  double ms = wall_ms([&] { Tensor d = host.to(kGpu); });
  rows.push_back({"host -> device 256 MiB (pageable source, pinned staging)", ms, host.nbytes() / (ms * 1e6), 0});
  ms = wall_ms([&] { Tensor h = dev.to(Device::cpu()); });
  rows.push_back({"device -> host 256 MiB (pinned staging)", ms, host.nbytes() / (ms * 1e6), 0});
  // The allocator: a cached 4 MiB block against the first (driver) allocation.
  const auto t0 = std::chrono::steady_clock::now();
  const int allocs = 10000;
  for (int i = 0; i < allocs; ++i) Tensor t = Tensor::empty({1 << 20}, DType::F32, kGpu);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / allocs;
  const cuda::MemoryPoolStats pool = cuda::memory_pool_stats(0);
  std::ostringstream extra;
  extra << "\ncaching allocator: " << us << " us per 4 MiB allocate+free (" << allocs << " in a row); "
        << pool.driver_allocations << " cudaMalloc calls for " << pool.allocations << " allocations; peak reserved "
        << (pool.peak_reserved_bytes >> 20) << " MiB\n";
  // GEMM through Tensor matmul (cuBLASLt): TFLOP/s against the H100/H200 dense peaks
  // (989 BF16/F16, 495 TF32, 67 FP32 without tensor cores).
  std::ostringstream gemm;
  gemm << "\n| matmul | median ms | TFLOP/s |\n|---|---|---|\n";
  struct Gemm {
    const char* name;
    DType dtype;
    int64_t size;
    bool tf32;
  };
  for (const Gemm& g : {Gemm{"bf16 8192^3", DType::BF16, 8192, false}, Gemm{"f16 8192^3", DType::F16, 8192, false},
                        Gemm{"f32 4096^3", DType::F32, 4096, false}, Gemm{"f32 tf32 4096^3", DType::F32, 4096, true},
                        Gemm{"bf16 batched 16x1024^3", DType::BF16, 1024, false}}) {
    cuda::set_allow_tf32(g.tf32);
    const bool batched = std::string(g.name).find("batched") != std::string::npos;
    const Shape sa = batched ? Shape{16, g.size, g.size} : Shape{g.size, g.size};
    Tensor a = Tensor::ones(sa, g.dtype, kGpu), b = Tensor::ones(sa, g.dtype, kGpu);
    const double gms = time_ms([&] { Tensor c = matmul(a, b); });
    const double flops = 2.0 * std::pow(static_cast<double>(g.size), 3) * (batched ? 16 : 1);
    char line[160];
    std::snprintf(line, sizeof line, "| %s | %.3f | %.1f |\n", g.name, gms, flops / (gms * 1e9));
    gemm << line;
  }
  cuda::set_allow_tf32(false);
  const std::string text = table(rows) + extra.str() + gemm.str();
  std::fputs(text.c_str(), stdout);
  if (argc > 1) std::ofstream(argv[1]) << text;
  return 0;
}
