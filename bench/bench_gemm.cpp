// GEMM engines on the shapes of a GPT training step, measured in one run.
//
//   ./build/bench/bench_gemm [--rounds 3] [--seconds 0.25]
//
// Rows: the forward, input-gradient and weight-gradient GEMMs of train_gpt's model
// (dim 256, MLP 1024, 1024 tokens per step, vocab 256) and the batched attention
// products, F32 (and the dtensor route in BF16). Columns, each a separate process of
// this program so that every library runs with its own threading as a user would:
//   openblas        cblas_sgemm with OpenBLAS's threads, kernel as OpenBLAS detects it
//   openblas <core> the same with OPENBLAS_CORETYPE set to the kernel of this CPU's
//                   features (only when it differs from the detected one)
//   onednn          dnnl_sgemm with oneDNN's OpenMP threads
//   dtensor:<e>     dtensor's matmul pinned to engine e (DTENSOR_GEMM_ENGINE), split
//                   over dtensor's pool; BLIS is measured only this way
//   dtensor         dtensor's matmul as shipped (the route measured per shape)
// The processes alternate A B C ... A B C for --rounds rounds; each figure is the
// median over rounds of the best GFLOP/s within a round (--seconds of repeats). The
// last column is dtensor over the best other column (target >= 0.90). Below the
// table: the roofline of the step, the time its GEMMs take at the best engine per
// shape, from which the step's achieved FLOP/s is judged (bench/RESULTS.md).
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <cblas.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_engine.h"
#include "dtensor/dtensor.h"

#if BENCH_HAVE_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.h>
#endif

using namespace dtensor;

namespace {

struct Shape3 {
  const char* name;
  int64_t batch, m, n, k;
  bool ta, tb;
  int per_step;  // how many times train_gpt's step (4 layers) runs it
  double flop_share = 1.0;  // causal attention does half of the full product
};

// The step of train_gpt --dim 256 --layers 4 --heads 4 --seq-len 128 --batch 8
// --vocab 256 (tied head): per layer q, k, v, out (256 -> 256), MLP up (256 -> 1024)
// and down (1024 -> 256), each forward (NT), input gradient (NN) and weight gradient
// (TN); the head adds one of each 256 -> 256 shape; attention's products, causal.
const std::vector<Shape3>& shapes() {
  static const std::vector<Shape3> list = {
      {"fwd q/k/v/out/head", 1, 1024, 256, 256, false, true, 17},
      {"fwd mlp up", 1, 1024, 1024, 256, false, true, 4},
      {"fwd mlp down", 1, 1024, 256, 1024, false, true, 4},
      {"dx q/k/v/out/head", 1, 1024, 256, 256, false, false, 17},
      {"dx mlp up", 1, 1024, 256, 1024, false, false, 4},
      {"dx mlp down", 1, 1024, 1024, 256, false, false, 4},
      {"dw q/k/v/out/head", 1, 256, 256, 1024, true, false, 17},
      {"dw mlp up", 1, 1024, 256, 1024, true, false, 4},
      {"dw mlp down", 1, 256, 1024, 1024, true, false, 4},
      {"attn q k^T (32 heads)", 32, 128, 128, 64, false, true, 4 * 2, 0.5},  // forward and dP in backward
      {"attn p v (32 heads)", 32, 128, 64, 128, false, false, 4 * 2, 0.5},   // forward and dQ
      {"attn p^T dO (32 heads)", 32, 128, 64, 128, true, false, 4 * 2, 0.5}, // dV and dK
  };
  return list;
}

double flops(const Shape3& s) { return 2.0 * s.batch * s.m * s.n * s.k; }

// Best GFLOP/s of fn over `seconds` of repeats (after one warm-up call).
template <class Fn>
double best_gflops(const Shape3& s, double seconds, Fn&& fn) {
  fn();
  double best = 1e30, spent = 0;
  int reps = 0;
  while (spent < seconds || reps < 3) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, t);
    spent += t;
    ++reps;
  }
  return flops(s) / best / 1e9;
}

// Operands laid out as the shape says: A [m, k] or stored [k, m]; B [k, n] or [n, k].
struct Operands {
  Tensor a, b;
};
Operands operands(const Shape3& s, DType dtype) {
  const Shape as = s.ta ? Shape{s.batch, s.k, s.m} : Shape{s.batch, s.m, s.k};
  const Shape bs = s.tb ? Shape{s.batch, s.n, s.k} : Shape{s.batch, s.k, s.n};
  Tensor a = Tensor::randn(as, 1).to(dtype), b = Tensor::randn(bs, 2).to(dtype);
  if (s.ta) a = a.transpose(1, 2);
  if (s.tb) b = b.transpose(1, 2);
  return {a, b};
}

// One column, measured in this process: prints "shape-index gflops" lines.
void measure_column(const std::string& column, double seconds) {
  const int cores = dtensor::cpu::threads_per_rank();
  for (size_t i = 0; i < shapes().size(); ++i) {
    const Shape3& s = shapes()[i];
    double g = 0;
    if (column == "openblas") {
      openblas_set_num_threads(cores);
      const Operands o = operands(s, DType::F32);
      Tensor c = Tensor::empty({s.batch, s.m, s.n});
      const float* pa = o.a.data<float>();
      const float* pb = o.b.data<float>();
      g = best_gflops(s, seconds, [&] {
        for (int64_t e = 0; e < s.batch; ++e) {
          cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n,
                      s.k, 1.0f, pa + e * s.m * s.k, s.ta ? s.m : s.k, pb + e * s.k * s.n, s.tb ? s.k : s.n, 0.0f,
                      c.data<float>() + e * s.m * s.n, s.n);
        }
      });
#if BENCH_HAVE_ONEDNN
    } else if (column == "onednn") {
      omp_set_num_threads(cores);
      const Operands o = operands(s, DType::F32);
      Tensor c = Tensor::empty({s.batch, s.m, s.n});
      const float* pa = o.a.data<float>();
      const float* pb = o.b.data<float>();
      g = best_gflops(s, seconds, [&] {
        for (int64_t e = 0; e < s.batch; ++e) {
          dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f, pa + e * s.m * s.k, s.ta ? s.m : s.k,
                     pb + e * s.k * s.n, s.tb ? s.k : s.n, 0.0f, c.data<float>() + e * s.m * s.n, s.n);
        }
      });
#endif
    } else {
      const DType dtype = column == "dtensor-bf16" ? DType::BF16 : DType::F32;
      const Operands o = operands(s, dtype);
      g = best_gflops(s, seconds, [&] { matmul(o.a, o.b); });
    }
    std::printf("%zu %.3f\n", i, g);
  }
}

struct Column {
  std::string name;   // the table's header
  std::string mode;   // measure_column's argument
  std::vector<std::pair<std::string, std::string>> env;
};

// Runs this program as a child measuring one column; returns GFLOP/s per shape.
std::vector<double> run_child(const char* self, const Column& col, double seconds) {
  int pipe_fd[2];
  if (pipe(pipe_fd) != 0) std::exit(1);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fd[1], 1);
    close(pipe_fd[0]);
    for (const auto& [k, v] : col.env) setenv(k.c_str(), v.c_str(), 1);
    const std::string secs = std::to_string(seconds);
    execl(self, self, "--column", col.mode.c_str(), "--seconds", secs.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipe_fd[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fd[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(pipe_fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::vector<double> g(shapes().size(), 0.0);
  size_t index = 0;
  double value = 0;
  for (const char* p = out.c_str(); std::sscanf(p, "%zu %lf", &index, &value) == 2;) {
    if (index < g.size()) g[index] = value;
    p = std::strchr(p, '\n');
    if (!p) break;
    ++p;
  }
  return g;
}

// OpenBLAS's kernel for this CPU's features (what OPENBLAS_CORETYPE should say).
std::string best_openblas_core() {
  const auto& f = backend::cpu::cpu_features();
  if (f.avx512) return f.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (f.avx2) return f.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  return "";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  double seconds = 0.25;
  std::string column;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    if (flag == "--column") column = argv[i + 1];
  }
  if (!column.empty()) {
    measure_column(column, seconds);
    return 0;
  }
  std::vector<Column> columns{{"openblas", "openblas", {}}};
  const std::string detected = openblas_get_corename();
  const std::string best = best_openblas_core();
  const char* user_core = std::getenv("OPENBLAS_CORETYPE");
  if (!best.empty() && !user_core && best != detected) {
    columns.push_back({"openblas " + best, "openblas", {{"OPENBLAS_CORETYPE", best}}});
  }
#if BENCH_HAVE_ONEDNN
  columns.push_back({"onednn", "onednn", {}});
#endif
  for (const auto& engine : backend::cpu::gemm_engines()) {
    columns.push_back({std::string("dtensor:") + engine->name(), "dtensor", {{"DTENSOR_GEMM_ENGINE", engine->name()}}});
  }
  columns.push_back({"dtensor", "dtensor", {}});
  columns.push_back({"dtensor bf16", "dtensor-bf16", {}});

  std::vector<std::vector<std::vector<double>>> samples(columns.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t c = 0; c < columns.size(); ++c) samples[c].push_back(run_child(argv[0], columns[c], seconds));
  }
  std::printf("%s\n", dtensor::cpu::summary().c_str());
  for (const std::string& w : dtensor::cpu::warnings()) std::printf("warning: %s\n", w.c_str());
  std::printf("GFLOP/s, median over %d alternating rounds of the best of %.2f s each\n\n", rounds, seconds);
  std::printf("| shape (batch x m x n x k, transposes) |");
  for (const Column& col : columns) std::printf(" %s |", col.name.c_str());
  std::printf(" dtensor / best F32 engine |\n|---|");
  for (size_t c = 0; c <= columns.size(); ++c) std::printf("---:|");
  std::printf("\n");
  double roofline_s = 0, dtensor_s = 0, step_flops = 0;
  for (size_t i = 0; i < shapes().size(); ++i) {
    const Shape3& s = shapes()[i];
    std::printf("| %s: %lldx%lldx%lldx%lld %c%c |", s.name, static_cast<long long>(s.batch),
                static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
                s.ta ? 'T' : 'N', s.tb ? 'T' : 'N');
    double best_engine = 0, ours = 0;
    for (size_t c = 0; c < columns.size(); ++c) {
      std::vector<double> v;
      for (const auto& round : samples[c]) v.push_back(round[i]);
      const double m = median(v);
      std::printf(" %.1f |", m);
      if (columns[c].name == "dtensor") ours = m;
      else if (columns[c].mode != "dtensor-bf16") best_engine = std::max(best_engine, m);
    }
    std::printf(" %.2f |\n", best_engine > 0 ? ours / best_engine : 0.0);
    const double f = flops(s) * s.flop_share * s.per_step;
    step_flops += f;
    roofline_s += f / (best_engine * 1e9);
    dtensor_s += f / (ours * 1e9);
  }
  std::printf(
      "\nStep GEMMs (train_gpt model, causal attention counted at half): %.2f GFLOP; at the best engine per shape "
      "%.1f ms (%.1f GFLOP/s, the roofline); at dtensor's routes %.1f ms.\n",
      step_flops / 1e9, roofline_s * 1e3, step_flops / roofline_s / 1e9, dtensor_s * 1e3);
  return 0;
}
