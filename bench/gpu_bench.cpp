// The GPU figures of scripts/gpu-check.sh: elementwise kernels, reductions, copies
// and matmul on one GPU, timed with CUDA events, each next to its same-run baseline (a device-to-
// device copy of the same bytes, which is what a memory-bound kernel can reach),
// and the caching allocator's cost per allocation; then issue 14's figures: BF16
// matmul 8192^3 through DistTensor against a raw cuBLASLt call, fused attention
// forward+backward, a GPT training step of about 350M parameters (tokens/s and
// MFU), and the threads backend's all-reduce bus bandwidth with 2 and 4 ranks on
// the GPU against the device-to-device copy. Needs no Google Benchmark.
//   gpu_bench [table.md [figures.json]]   # prints the tables, and writes them to the files too
// figures.json holds the headline numbers under the keys torch_gpu_peer.py uses,
// so that gpu-check.sh can put the two side by side.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend/cudnn_attention.h"
#include "dtensor/cuda.h"
#include "dtensor/dtensor.h"
#include "dtensor/models/gpt.h"
#include "dtensor/optim.h"
#include "dtensor/parallel/trainer.h"

using namespace dtensor;

namespace {

const Device kGpu = Device::cuda(0);

// `gpu_bench --smoke` runs issue 14's sections with tiny sizes on the CPU (wall-clock
// timing), so that CTest checks their code where there is no GPU; the figures mean
// nothing then.
struct Mode {
  bool smoke = false;
  Device device = kGpu;
};
Mode g_mode;

// Waits for the GPU's queued work (nothing to wait for on the CPU).
void sync() {
  if (g_mode.device.is_cuda()) cuda::synchronize(g_mode.device.index);
}

// Median milliseconds of `reps` runs of fn on the current stream (after 2 warm-ups).
double time_ms(const std::function<void()>& fn, int reps = 10) {
  for (int i = 0; i < 2; ++i) fn();
  if (!g_mode.device.is_cuda()) {
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
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

// ---- issue 14's figures ------------------------------------------------------------------

// One named figure of figures.json.
struct Figure {
  std::string key;
  double value;
};

void check_lt(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("gpu_bench: ") + call + " failed: " + cublasLtGetStatusString(status));
  }
}

// Row-major C[n, n] = A B in BF16 (F32 accumulation) by one raw cublasLtMatmul with
// the heuristic's first algorithm and a 32 MiB workspace: no dispatch, no allocation.
// Column-major cuBLASLt computes C^T = B^T A^T, so B goes first.
double raw_cublaslt_bf16_ms(const Tensor& a, const Tensor& b, Tensor& c) {
  const uint64_t n = static_cast<uint64_t>(a.size(0));
  cublasLtHandle_t handle = nullptr;
  check_lt(cublasLtCreate(&handle), "cublasLtCreate");
  cublasLtMatmulDesc_t op = nullptr;
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  cublasLtMatrixLayout_t layout = nullptr;  // square: one layout for all three
  check_lt(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, n, n, static_cast<int64_t>(n)),
           "cublasLtMatrixLayoutCreate");
  size_t workspace_bytes = size_t{32} << 20;
  Tensor workspace = Tensor::empty({static_cast<int64_t>(workspace_bytes / 4)}, DType::F32, kGpu);
  cublasLtMatmulPreference_t preference = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  check_lt(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof workspace_bytes),
           "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check_lt(
      cublasLtMatmulAlgoGetHeuristic(handle, op, layout, layout, layout, layout, preference, 1, &heuristic, &found),
      "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) throw std::runtime_error("gpu_bench: cuBLASLt has no algorithm for BF16 " + std::to_string(n) + "^3");
  const float alpha = 1, beta = 0;
  auto* stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle());
  const double ms = time_ms([&] {
    check_lt(cublasLtMatmul(handle, op, &alpha, b.data_ptr(), layout, a.data_ptr(), layout, &beta, c.data_ptr(), layout,
                            c.data_ptr(), layout, &heuristic.algo, workspace.data_ptr(), workspace_bytes, stream),
             "cublasLtMatmul");
  });
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(handle);
  return ms;
}

// BF16 8192^3: a raw cuBLASLt call, Tensor matmul and DistTensor matmul on one rank.
std::string matmul_figures(std::vector<Figure>& figures) {
  const int64_t n = 8192;
  const double flops = 2.0 * std::pow(static_cast<double>(n), 3);
  Tensor a = Tensor::randn({n, n}, 1, DType::BF16, kGpu), b = Tensor::randn({n, n}, 2, DType::BF16, kGpu);
  Tensor c = Tensor::empty({n, n}, DType::BF16, kGpu);
  const double raw = raw_cublaslt_bf16_ms(a, b, c);
  const double tensor = time_ms([&] { Tensor out = matmul(a, b); });
  double dist = 0;
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    const DistTensor da = DistTensor::from_local(a, mesh, {Replicate()});
    const DistTensor db = DistTensor::from_local(b, mesh, {Replicate()});
    dist = time_ms([&] { DistTensor out = matmul(da, db); });
  });
  figures.push_back({"matmul_bf16_8192_ms", dist});
  const double best = std::min({raw, tensor, dist});
  std::ostringstream out;
  out << "\n| BF16 matmul 8192^3 | median ms | TFLOP/s | of the best here |\n|---|---|---|---|\n";
  char line[200];
  for (const auto& [what, ms] : {std::pair<const char*, double>{"raw cublasLtMatmul (heuristic #1)", raw},
                                 {"Tensor matmul", tensor},
                                 {"DistTensor matmul, 1 rank", dist}}) {
    std::snprintf(line, sizeof line, "| %s | %.3f | %.1f | %.2f |\n", what, ms, flops / (ms * 1e9), best / ms);
    out << line;
  }
  return out.str();
}

// Causal fused attention forward + backward through DistTensor autograd, B 8, H 16,
// T 2048, D 128, BF16. FLOPs as torch_gpu_peer.py counts them: forward
// 2 * 2 * B*H*T*T*D * 0.5 (causal), backward 2.5x the forward. On a GPU twice: the
// default engine (cuDNN's fused attention where it takes the call) and the own
// kernels (DTENSOR_ATTENTION=own), alternating.
std::string attention_figures(std::vector<Figure>& figures) {
  namespace cudnn = backend::cudnn;
  const int64_t batch = g_mode.smoke ? 1 : 8, heads = g_mode.smoke ? 2 : 16, seq = g_mode.smoke ? 64 : 2048,
                head_dim = g_mode.smoke ? 16 : 128;
  const double forward_flops = 2.0 * 2.0 * batch * heads * static_cast<double>(seq) * seq * head_dim * 0.5;
  const double flops = forward_flops * 3.5;
  struct Row {
    const char* name;
    cudnn::AttentionEngine engine;
    double forward_ms = 0, ms = 0;
    int64_t cudnn_runs = 0;
  };
  std::vector<Row> rows = {{"default", cudnn::AttentionEngine::Auto}};
  if (g_mode.device.is_cuda()) rows.push_back({"own kernels", cudnn::AttentionEngine::Own});
  const cudnn::AttentionEngine before = cudnn::attention_engine();
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    const Shape shape{batch, heads, seq, head_dim};
    auto leaf = [&](uint64_t seed) {
      DistTensor t =
          DistTensor::from_local(Tensor::randn(shape, seed, DType::BF16, g_mode.device), mesh, {Replicate()});
      t.set_requires_grad(true);
      return t;
    };
    DistTensor q = leaf(1), k = leaf(2), v = leaf(3);
    const DistTensor grad =
        DistTensor::from_local(Tensor::randn(shape, 4, DType::BF16, g_mode.device), mesh, {Replicate()});
    for (Row& row : rows) {
      cudnn::set_attention_engine(row.engine);
      const int64_t runs = cudnn::runs();
      row.forward_ms = time_ms([&] {
        NoGradGuard no_grad;
        DistTensor out = scaled_dot_product_attention(q, k, v, true);
      });
      row.ms = time_ms([&] {
        q.zero_grad();
        k.zero_grad();
        v.zero_grad();
        scaled_dot_product_attention(q, k, v, true).backward(grad);
      });
      row.cudnn_runs = cudnn::runs() - runs;
    }
  });
  cudnn::set_attention_engine(before);
  figures.push_back({"attention_fwd_bwd_ms", rows.front().ms});
  if (rows.size() > 1) figures.push_back({"attention_own_fwd_bwd_ms", rows.back().ms});
  std::ostringstream out;
  char line[400];
  std::snprintf(line, sizeof line,
                "\n| causal attention B%lld H%lld T%lld D%lld BF16 | forward ms | TFLOP/s | forward + backward ms "
                "(autograd) | TFLOP/s |\n|---|---|---|---|---|\n",
                static_cast<long long>(batch), static_cast<long long>(heads), static_cast<long long>(seq),
                static_cast<long long>(head_dim));
  out << line;
  for (const Row& row : rows) {
    const std::string name =
        row.engine == cudnn::AttentionEngine::Auto
            ? std::string(row.cudnn_runs > 0 ? "cuDNN fused attention" : "own kernels") + " (the default here)"
            : row.name;
    std::snprintf(line, sizeof line, "| %s | %.3f | %.1f | %.3f | %.1f |\n", name.c_str(), row.forward_ms,
                  forward_flops / (row.forward_ms * 1e9), row.ms, flops / (row.ms * 1e9));
    out << line;
  }
  return out.str();
}

// A GPT training step on one GPU: about 350M parameters (vocab 32768, d 1024, 24
// layers, 16 heads), sequence 1024, batch 8, BF16 compute with F32 master weights,
// AdamW. MFU against 989 TFLOP/s dense BF16 with 6N + 12 L T D FLOPs per token (N
// without the position embedding; PaLM's appendix B), as torch_gpu_peer.py counts.
std::string gpt_figures(std::vector<Figure>& figures) {
  models::GPTConfig config;
  config.vocab = g_mode.smoke ? 256 : 32768;
  config.block_size = g_mode.smoke ? 32 : 1024;
  config.layers = g_mode.smoke ? 2 : 24;
  config.heads = g_mode.smoke ? 2 : 16;
  config.dim = g_mode.smoke ? 64 : 1024;
  const int64_t batch = g_mode.smoke ? 2 : 8, warmup = 2, steps = 5;
  std::vector<double> ms;
  int64_t params = 0, peak_mib = 0;
  launch(1, [&](Group g) {
    DeviceMesh mesh(g, {1});
    models::GPT model(mesh, config, 42);
    model.to(g_mode.device);
    params = model.num_parameters();
    AdamW optimizer(model.parameters(), AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
    parallel::Trainer trainer(optimizer, {.compute_dtype = DType::BF16});
    const Shape shape{batch, config.block_size};
    auto ids = [&](uint64_t seed) {
      Tensor u = Tensor::rand(shape, seed, DType::F64, g_mode.device);
      return DistTensor::from_local(mul(u, static_cast<double>(config.vocab)).to(DType::I64), mesh, {Replicate()});
    };
    const DistTensor inputs = ids(1), targets = ids(2);
    for (int64_t step = 0; step < warmup + steps; ++step) {
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      trainer.step(step, [&](int64_t) { return model.loss(inputs, targets); });
      sync();
      if (step >= warmup) {
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    peak_mib = memory_stats(g_mode.device).peak_bytes >> 20;  // this rank's tensors
  });
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  const double tokens = static_cast<double>(batch * config.block_size);
  const double n = static_cast<double>(params - config.block_size * config.dim);
  const double flops = (6 * n + 12.0 * config.layers * config.block_size * config.dim) * tokens;
  const double mfu = flops / (median * 1e-3) / 989e12;
  figures.push_back({"gpt_step_ms", median});
  figures.push_back({"gpt_tokens_per_s", tokens / (median * 1e-3)});
  figures.push_back({"gpt_mfu", mfu});
  char text[600];
  std::snprintf(text, sizeof text,
                "\n| GPT step, %.1fM parameters, B %lld T %lld, BF16, AdamW | median ms (of %lld) | tokens/s | MFU |\n"
                "|---|---|---|---|\n| dtensor, one rank | %.1f | %.0f | %.1f%% |\n"
                "peak %s tensor memory of the step's rank: %lld MiB\n",
                static_cast<double>(params) / 1e6, static_cast<long long>(batch),
                static_cast<long long>(config.block_size), static_cast<long long>(steps), median,
                tokens / (median * 1e-3), 100 * mfu, g_mode.device.is_cuda() ? "GPU" : "CPU",
                static_cast<long long>(peak_mib));
  return text;
}

// The threads backend's all-reduce of 64 MiB F32 per rank with 2 and 4 ranks on the
// GPU: bus bandwidth (nccl-tests' definition, algbw * 2(n-1)/n) next to the
// device-to-device copy's bytes moved per second, which bounds it.
std::string all_reduce_figures(double copy_gbps, std::vector<Figure>& figures) {
  const int64_t numel = g_mode.smoke ? int64_t{1} << 12 : int64_t{1} << 24;
  const double bytes = static_cast<double>(numel) * 4;
  std::ostringstream out;
  out << "\n| threads all-reduce, " << (numel * 4 >> 10)
      << " KiB F32 per rank | median ms | algbw GB/s | busbw GB/s | copy GB/s |\n"
         "|---|---|---|---|---|\n";
  for (int ranks : {2, 4}) {
    std::vector<double> ms;
    launch(ranks, [&](Group g) {
      Tensor t = Tensor::ones({numel}, DType::F32, g_mode.device);
      for (int i = 0; i < 7; ++i) {
        barrier(g);
        sync();
        const auto t0 = std::chrono::steady_clock::now();
        all_reduce_(g, t);
        sync();
        barrier(g);
        const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (g.rank() == 0 && i >= 2) ms.push_back(elapsed);
      }
    });
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double algbw = bytes / (median * 1e6);
    const double busbw = algbw * 2.0 * (ranks - 1) / ranks;
    figures.push_back({"all_reduce_busbw_" + std::to_string(ranks) + "_gbps", busbw});
    char line[200];
    std::snprintf(line, sizeof line, "| %d ranks | %.3f | %.1f | %.1f | %.1f |\n", ranks, median, algbw, busbw,
                  copy_gbps);
    out << line;
  }
  return out.str();
}

std::string json(const std::vector<Figure>& figures) {
  std::ostringstream out;
  out << "{";
  for (size_t i = 0; i < figures.size(); ++i) {
    out << (i ? ", " : "") << '"' << figures[i].key << "\": " << figures[i].value;
  }
  out << "}\n";
  return out.str();
}

// Runs one section; a failure (out of memory, a missing kernel) is reported in its
// place and the others still run.
std::string section(const char* name, const std::function<std::string()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return std::string("\n") + name + " FAILED: " + e.what() + "\n";
  }
}

// The smoke run: issue 14's sections, tiny, on the CPU; fails if any section does.
int smoke() {
  g_mode = {true, Device::cpu()};
  std::vector<Figure> figures;
  bool failed = false;
  for (const auto& [name, fn] : std::vector<std::pair<const char*, std::function<std::string()>>>{
           {"attention", [&] { return attention_figures(figures); }},
           {"all-reduce", [&] { return all_reduce_figures(0, figures); }},
           {"GPT step", [&] { return gpt_figures(figures); }}}) {
    const std::string part = section(name, fn);
    failed |= part.find(" FAILED: ") != std::string::npos;
    std::fputs(part.c_str(), stdout);
  }
  std::fputs(json(figures).c_str(), stdout);
  return failed || figures.size() != 6 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--smoke") return smoke();
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
  std::string text = table(rows) + extra.str() + gemm.str();
  std::fputs(text.c_str(), stdout);
  std::vector<Figure> figures;
  const double f32_copy_gbps = copy_gbps(DType::F32);
  for (const auto& [name, fn] : std::vector<std::pair<const char*, std::function<std::string()>>>{
           {"matmul", [&] { return matmul_figures(figures); }},
           {"attention", [&] { return attention_figures(figures); }},
           {"all-reduce", [&] { return all_reduce_figures(f32_copy_gbps, figures); }},
           {"GPT step", [&] { return gpt_figures(figures); }}}) {
    const std::string part = section(name, fn);
    std::fputs(part.c_str(), stdout);
    std::fflush(stdout);
    text += part;
    // Written after every section: a section that outlives the check's timeout
    // leaves the figures before it.
    if (argc > 1) std::ofstream(argv[1]) << text;
    if (argc > 2) std::ofstream(argv[2]) << json(figures);
  }
  return 0;
}
