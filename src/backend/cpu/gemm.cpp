// Matrix multiply on the CPU: operand layouts, the split over the rank's cores, and
// the choice of GEMM engine by measurement.
//
// Layouts: strided operands go to the engine without copies whenever one of their
// two matrix dims has unit stride (row-major as is, or transposed); only other
// layouts are copied.
//
// Threads: a call is cut into tasks for the rank's pool (parallel.h): whole batch
// entries when there are enough of them, else row blocks of the output (column
// blocks when it is wider than tall); each task calls the engine single-threaded.
//
// Engine choice: no table of CPU models decides which library is fast here. The
// first call of each GEMM signature (dtype, transposes, batch, m, n, k, threads; the
// sizes above 64 rounded up to four steps per octave, so that shapes which differ a
// little, such as a mixture of experts' rows per expert, which change every step,
// share one measurement instead of each paying for its own) runs every candidate
// route on the call's own operands into a scratch output (one warm-up run each, then
// interleaved rounds, 4 to 16 of them so that each route is timed for about 10 ms;
// the cost of a run is its CPU time over all threads, which other processes on the
// machine do not inflate) and pins the signature to the cheapest; a route must beat
// the default (OpenBLAS) by 5% to replace it. The real output is always written by
// the chosen route, so the measured call's result is the one later calls of its
// shape give, and all ranks of a process share the table. Which route a set of
// nearby shapes gets can depend on which of them came first, as it can on the timing
// noise: DTENSOR_GEMM_ENGINE pins one for the same bits across processes. A training
// step repeats a dozen shapes, so tuning is a one-time cost of a few dozen GEMMs.
// Routes: F32 and F64 every engine that has the dtype; BF16 the engines with a native
// BF16 GEMM on this CPU (AVX512-BF16 or AMX) and conversion to F32; F16 conversion to
// F32. GEMMs under 2^18 multiply-adds are not tuned (the default route: their time is
// overhead).
// DTENSOR_GEMM_ENGINE=openblas|onednn|blis pins one engine (reproducible numerics
// for comparisons; a dtype it lacks falls back to OpenBLAS).
//
// Bias epilogue (matmul_bias, a Linear's y = x W^T + b): each task adds the bias to
// its output tile right after the engine wrote it, while the tile is in cache, and
// a BF16 tile gets the bias in F32 before its one rounding (PyTorch's addmm rounds
// once too). F32 and F64 results are bit-identical to a GEMM followed by an add.
// GELU epilogue (matmul_bias_gelu, the MLP's first Linear and its GELU): each task
// writes its tile (with the bias) to `pre` and then the tile's GELU to the output,
// with the vector kernel the unary op uses (a BF16 tile is rounded into pre first and
// the GELU read from there), so the pair is bit-identical to matmul_bias followed by
// gelu, with one dispatch and one output allocation fewer. F32 and BF16 native
// routes; F64 and the routes through F32 run the two ops.
#include <algorithm>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_kernels.h"
#include "util/check.h"

namespace dtensor::backend::cpu {

const std::vector<std::unique_ptr<GemmEngine>>& gemm_engines() {
  static const auto* engines = [] {
    auto* list = new std::vector<std::unique_ptr<GemmEngine>>;
    for (auto make : {make_openblas_engine, make_onednn_engine, make_blis_engine}) {
      if (auto engine = make()) list->push_back(std::move(engine));
    }
    return list;
  }();
  return *engines;
}

namespace {

// How one [rows, cols] operand is handed to a row-major GEMM.
struct Operand {
  bool trans = false;
  int64_t ld = 1;
};

// Row-major as is (unit column stride) or transposed (unit row stride). A size-1
// dim's stride is meaningless, so it never disqualifies a layout.
std::optional<Operand> gemm_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (col_stride == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) return Operand{false, ld};
  }
  if (row_stride == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) return Operand{true, ld};
  }
  return std::nullopt;
}

// A [batch, rows, cols] operand in a layout an engine reads (copied once if not).
struct Prepared {
  Tensor t;
  Operand op;
};
Prepared prepare(const Tensor& x) {
  if (auto op = gemm_layout(x.size(1), x.size(2), x.stride(1), x.stride(2))) return {x, *op};
  const Tensor c = x.contiguous();
  return {c, *gemm_layout(c.size(1), c.size(2), c.stride(1), c.stride(2))};
}

// ---- routes and their measurement --------------------------------------------------

// A way to run a signature: an engine's own kernel for the dtype, or (BF16/F16)
// conversion to F32 and the F32 route chosen for the same shape.
struct Route {
  int engine = 0;
  bool via_f32 = false;
};

struct Signature {
  DType dtype;
  bool trans_a, trans_b;
  int64_t batch, m, n, k;
  int threads;  // tasks the call is split into (1: a single-threaded call)
  bool operator==(const Signature&) const = default;
};

// A size in the tuning key: exact up to 64, above that rounded up to the next of four
// steps per octave (64, 80, 96, 112, 128, 160, ...).
int64_t tuning_size(int64_t v) {
  if (v <= 64) return v;
  int64_t octave = 64;
  while (octave * 2 <= v) octave *= 2;
  const int64_t step = octave / 4;
  return (v + step - 1) / step * step;
}

Signature tuning_key(Signature s) {
  s.batch = tuning_size(s.batch);
  s.m = tuning_size(s.m);
  s.n = tuning_size(s.n);
  s.k = tuning_size(s.k);
  return s;
}

struct SignatureHash {
  size_t operator()(const Signature& s) const {
    size_t h = static_cast<size_t>(s.dtype) * 4 + (s.trans_a ? 2 : 0) + (s.trans_b ? 1 : 0);
    for (int64_t v : {s.batch, s.m, s.n, s.k, static_cast<int64_t>(s.threads)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    }
    return h;
  }
};

// Timed rounds of a tuning: enough for each route to run about kTunedSeconds, within
// [kMinRounds, kMaxRounds] (a single round when every route takes over 20 ms). A call of a
// millisecond or less is often cut by another process on a shared machine and runs
// on with cold caches, which costs CPU time too; with four runs the best of a route
// varied by 7-8% between processes and near engines flipped (f32 NT 1024x256x256 on
// one core: OpenBLAS 123-131, oneDNN 128-139 GFLOP/s in three processes).
constexpr int kMinRounds = 4;
constexpr int kMaxRounds = 16;
constexpr double kTunedSeconds = 0.01;
// GEMMs smaller than this (multiply-adds) are not tuned: they take the default
// route, as their time is all call overhead.
constexpr int64_t kMinTunedWork = int64_t{1} << 18;
// A route must beat the default by this much to replace it: near-ties stay on one
// engine, so that ranks of one process, and mostly separate processes too, agree.
constexpr double kSwitchMargin = 0.95;

struct Tuning {
  Signature first;  // the call that was measured (the key's sizes are rounded)
  std::vector<Route> routes;
  std::vector<double> best;  // shortest measured call per route (seconds)
  int chosen = -1;
  bool measuring = false;
};

std::optional<int> pinned_engine() {
  static const std::optional<int> pinned = []() -> std::optional<int> {
    const char* want = std::getenv("DTENSOR_GEMM_ENGINE");
    if (!want || !*want || std::strcmp(want, "auto") == 0) return std::nullopt;
    const auto& engines = gemm_engines();
    for (size_t i = 0; i < engines.size(); ++i) {
      if (std::strcmp(engines[i]->name(), want) == 0) return static_cast<int>(i);
    }
    std::string names;
    for (const auto& e : engines) names += std::string(names.empty() ? "" : ", ") + e->name();
    DT_CHECK_ARG(false, "matmul", "DTENSOR_GEMM_ENGINE=", want, " is not an engine of this build (", names, ", auto)");
    return std::nullopt;
  }();
  return pinned;
}

std::vector<Route> routes_for(DType dtype) {
  const auto& engines = gemm_engines();
  const std::optional<int> pinned = pinned_engine();
  std::vector<Route> routes;
  for (int e = 0; e < static_cast<int>(engines.size()); ++e) {
    if (pinned && e != *pinned) continue;
    const bool native =
        dtype == DType::F32 || dtype == DType::F64 || (dtype == DType::BF16 && engines[e]->native_bf16());
    if (native) routes.push_back({e, false});
  }
  if (dtype == DType::BF16 || dtype == DType::F16) routes.push_back({0, true});
  // F64 on a pinned engine without dgemm: OpenBLAS (run_native falls back to it
  // when an engine's dgemm returns false).
  if (routes.empty()) routes.push_back({0, false});
  return routes;
}

// The route of GEMMs too small to tune and the one a challenger must beat by the
// margin: OpenBLAS's, the engine every build has (its small-matrix kernels also have
// the least call overhead); for BF16, which OpenBLAS lacks here, the first native
// route, else conversion.
int default_route(const std::vector<Route>& routes) {
  const auto& engines = gemm_engines();
  for (size_t i = 0; i < routes.size(); ++i) {
    if (!routes[i].via_f32 && std::strcmp(engines[routes[i].engine]->name(), "openblas") == 0)
      return static_cast<int>(i);
  }
  return 0;
}

// Cost of each route: one warm-up run each (kernel generation, first touch), then
// rounds that run every route still in the race once in turn (see kMinRounds),
// keeping each route's cheapest run. Interleaving spreads load changes over all
// routes alike; when every route's run is over 20 ms there is a single round.
std::vector<double> measure_routes(const std::vector<Route>& routes,
                                   const std::function<double(const Route&)>& run_once) {
  std::vector<double> best(routes.size(), 1e30);
  // The cheapest warm-up sets the count (another route's may include generating its
  // kernel); a route that is really slower drops out after the first round.
  double shortest = 1e30;
  for (const Route& r : routes) shortest = std::min(shortest, run_once(r));
  const int rounds =
      shortest > 0.02 ? 1
                      : std::clamp(static_cast<int>(kTunedSeconds / std::max(shortest, 1e-9)), kMinRounds, kMaxRounds);
  // A route over 1.5x the cheapest after a round cannot come back: it drops out, so
  // that a slow engine costs its warm-up and one round, not all of them.
  std::vector<bool> racing(routes.size(), true);
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < routes.size(); ++i) {
      if (racing[i]) best[i] = std::min(best[i], run_once(routes[i]));
    }
    const double leader = *std::min_element(best.begin(), best.end());
    for (size_t i = 0; i < routes.size(); ++i) racing[i] = racing[i] && best[i] <= 1.5 * leader;
  }
  return best;
}

class Tuner {
 public:
  // The route of signature s. The first call of a signature measures every candidate
  // with time_route (one run on scratch output, so results never depend on which
  // route ran a given call; see measure_routes) and keeps the fastest; later calls,
  // and calls of other threads that arrive while it measures, get that choice.
  Route choose(const Signature& s, const std::function<double(const Route&)>& time_route) {
    std::unique_lock<std::mutex> lock(mutex_);
    Tuning& t = table_[tuning_key(s)];
    if (t.routes.empty()) {
      t.first = s;
      t.routes = routes_for(s.dtype);
      t.best.assign(t.routes.size(), 0.0);
      const int64_t work = s.batch * s.m * s.n * s.k;
      if (t.routes.size() == 1 || work < kMinTunedWork) t.chosen = default_route(t.routes);
    }
    if (t.chosen >= 0) return t.routes[static_cast<size_t>(t.chosen)];
    if (t.measuring) {
      decided_.wait(lock, [&] { return t.chosen >= 0; });
      return t.routes[static_cast<size_t>(t.chosen)];
    }
    t.measuring = true;
    const std::vector<Route> routes = t.routes;
    lock.unlock();
    const std::vector<double> best = measure_routes(routes, time_route);
    lock.lock();
    const int fallback = default_route(routes);
    int pick = static_cast<int>(std::min_element(best.begin(), best.end()) - best.begin());
    if (best[static_cast<size_t>(pick)] > kSwitchMargin * best[static_cast<size_t>(fallback)]) pick = fallback;
    t.best = best;
    t.chosen = pick;
    decided_.notify_all();
    return t.routes[static_cast<size_t>(pick)];
  }

  std::vector<std::string> describe() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<Signature, Tuning>> rows(table_.begin(), table_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) {
      const Signature &a = x.second.first, &b = y.second.first;
      return std::tie(a.dtype, a.threads, a.batch, a.m, a.n, a.k, a.trans_a, a.trans_b) <
             std::tie(b.dtype, b.threads, b.batch, b.m, b.n, b.k, b.trans_a, b.trans_b);
    });
    std::vector<std::string> lines;
    const auto& engines = gemm_engines();
    for (const auto& [key, t] : rows) {
      const Signature& s = t.first;  // the shape measured, for the shapes near it
      std::ostringstream os;
      os << dtype_name(s.dtype) << ' ' << (s.trans_a ? 'T' : 'N') << (s.trans_b ? 'T' : 'N') << ' ';
      if (s.batch > 1) os << s.batch << " x ";
      os << s.m << 'x' << s.n << 'x' << s.k;
      if (s.threads > 1) os << " on " << s.threads << " threads";
      os << ": ";
      const double flops = 2.0 * s.batch * s.m * s.n * s.k;
      auto route_name = [&](const Route& r) {
        return std::string(r.via_f32 ? "f32 via " : "") + (r.via_f32 ? "best" : engines[r.engine]->name());
      };
      os << (t.chosen >= 0 ? route_name(t.routes[t.chosen]) : std::string("tuning"));
      if (t.routes.size() > 1) {
        os << " (";
        for (size_t i = 0; i < t.routes.size(); ++i) {
          os << (i ? ", " : "") << route_name(t.routes[i]);
          if (t.best[i] > 0) os << ' ' << static_cast<int>(flops / t.best[i] / 1e9 + 0.5) << " GFLOP/s per core";
        }
        os << ')';
      }
      lines.push_back(os.str());
    }
    return lines;
  }

 private:
  std::mutex mutex_;
  std::condition_variable decided_;
  std::unordered_map<Signature, Tuning, SignatureHash> table_;
};

// CPU seconds of one run (CpuTimer: this thread and the pool tasks it starts).
double cpu_seconds(const std::function<void()>& run) {
  const CpuTimer timer;
  run();
  return timer.seconds();
}

Tuner& tuner() {
  static Tuner* t = new Tuner;  // used by rank threads until the process exits
  return *t;
}

// ---- the split over the pool -----------------------------------------------------

// Work below this many multiply-adds per task is not worth a thread hand-off.
constexpr int64_t kMinTaskWork = int64_t{1} << 20;

// Threads a call of this size is split over.
int tasks_for(int64_t batch, int64_t m, int64_t n, int64_t k) {
  const int64_t work = batch * m * n * k;
  return std::max(1, std::min<int>(rank_threads(), static_cast<int>(std::min<int64_t>(work / kMinTaskWork, 1 << 20))));
}

// One task: batch entries [b0, b1), and within each entry output rows [r0, r1) and
// columns [c0, c1).
struct Tile {
  int64_t b0, b1, r0, r1, c0, c1;
};

// Cuts [batch, m, n] into tiles of similar work for `threads` threads: whole batch
// entries when they divide evenly (or are many), else bands of rows (of columns
// when n > m) in multiples of 16 within each entry.
std::vector<Tile> tiles(int64_t batch, int64_t m, int64_t n, int64_t k) {
  const int threads = tasks_for(batch, m, n, k);
  std::vector<Tile> out;
  if (threads == 1) return {{0, batch, 0, m, 0, n}};
  if (batch % threads == 0 || batch >= 4 * threads) {
    for (int t = 0; t < threads; ++t) out.push_back({t * batch / threads, (t + 1) * batch / threads, 0, m, 0, n});
    return out;
  }
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  const int64_t units = (extent + 15) / 16;
  const int parts = static_cast<int>(std::min<int64_t>(threads, units));
  for (int64_t b = 0; b < batch; ++b) {
    for (int p = 0; p < parts; ++p) {
      const int64_t lo = std::min(extent, p * units / parts * 16), hi = std::min(extent, (p + 1) * units / parts * 16);
      out.push_back(by_rows ? Tile{b, b + 1, lo, hi, 0, n} : Tile{b, b + 1, 0, m, lo, hi});
    }
  }
  return out;
}

// Element offset of op(X)[row, col] for a row-major X seen through `op`.
int64_t at(const Operand& op, int64_t row, int64_t col) { return op.trans ? col * op.ld + row : row * op.ld + col; }

// row r of the tile z (leading dim ld) += bias[0, cols), for every row.
template <class T>
void add_bias(T* z, int64_t rows, int64_t cols, int64_t ld, const T* bias) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = z + r * ld;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

// The GELU after the bias: `pre` ([batch, m, n] contiguous, the output's dtype) gets
// the biased tile, the output its GELU.
struct GeluEpilogue {
  VecUnary op;  // GeluTanh or GeluErf
  void* pre;
};

template <class T, class Run>
void run_tiles(const Prepared& a, const Prepared& b, int64_t batch, int64_t m, int64_t n, int64_t k, T* c, Run&& run) {
  const std::vector<Tile> work = tiles(batch, m, n, k);
  const T* pa = static_cast<const T*>(a.t.data_ptr());
  const T* pb = static_cast<const T*>(b.t.data_ptr());
  parallel_run(static_cast<int>(work.size()), [&](int task) {
    const Tile& w = work[static_cast<size_t>(task)];
    GemmArgs g{a.op.trans, b.op.trans, w.r1 - w.r0, w.c1 - w.c0, k, a.op.ld, b.op.ld, n, 0.0f};
    if (g.m == 0 || g.n == 0) return;
    for (int64_t i = w.b0; i < w.b1; ++i) {
      run(g, pa + i * a.t.stride(0) + at(a.op, w.r0, 0), pb + i * b.t.stride(0) + at(b.op, 0, w.c0),
          c + i * m * n + w.r0 * n + w.c0, i, w);
    }
  });
}

// bias: null, or [n] added to every output row; gelu: null, or the GELU epilogue
// (F32 only).
template <class T>
void run_native(GemmEngine& engine, const Prepared& a, const Prepared& b, int64_t batch, int64_t m, int64_t n,
                int64_t k, T* c, const T* bias, const GeluEpilogue* gelu) {
  run_tiles<T>(a, b, batch, m, n, k, c, [&](const GemmArgs& g, const T* x, const T* y, T* z, int64_t, const Tile& w) {
    // With the GELU the GEMM and the bias go to pre's tile, the GELU from there to z.
    T* dst = gelu ? static_cast<T*>(gelu->pre) + (z - c) : z;
    if constexpr (std::is_same_v<T, float>) {
      engine.sgemm(g, x, y, dst);
    } else if (!engine.dgemm(g, x, y, dst)) {
      gemm_engines()[0]->dgemm(g, x, y, dst);
    }
    if (bias) add_bias(dst, g.m, g.n, n, bias + w.c0);
    if constexpr (std::is_same_v<T, float>) {
      if (gelu) {
        for (int64_t r = 0; r < g.m; ++r) vec().unary[0](gelu->op, dst + r * n, z + r * n, g.n);
      }
    }
  });
}

// BF16 operands, BF16 output: the engine accumulates in F32 and rounds in its own
// epilogue (oneDNN), or each task rounds its F32 tile (still in cache) to BF16, the
// bias (F32, null for none) added first; with the GELU epilogue the rounded tile goes
// to pre and its GELU to the output.
void run_bf16(GemmEngine& engine, const Prepared& a, const Prepared& b, int64_t batch, int64_t m, int64_t n, int64_t k,
              bf16* c, const float* bias, const GeluEpilogue* gelu) {
  const std::vector<Tile> work = tiles(batch, m, n, k);
  const auto* pa = static_cast<const uint16_t*>(a.t.data_ptr());
  const auto* pb = static_cast<const uint16_t*>(b.t.data_ptr());
  parallel_run(static_cast<int>(work.size()), [&](int task) {
    const Tile& w = work[static_cast<size_t>(task)];
    const int64_t rows = w.r1 - w.r0, cols = w.c1 - w.c0;
    if (rows == 0 || cols == 0) return;
    for (int64_t i = w.b0; i < w.b1; ++i) {
      const uint16_t* x = pa + i * a.t.stride(0) + at(a.op, w.r0, 0);
      const uint16_t* y = pb + i * b.t.stride(0) + at(b.op, 0, w.c0);
      bf16* out = c + i * m * n + w.r0 * n + w.c0;
      // Rounded by the engine straight into the output where it can (no bias: it
      // would be a second rounding).
      if (!bias && !gelu &&
          engine.bf16gemm_rounded(GemmArgs{a.op.trans, b.op.trans, rows, cols, k, a.op.ld, b.op.ld, n, 0.0f}, x, y,
                                  reinterpret_cast<uint16_t*>(out))) {
        continue;
      }
      thread_local std::vector<float> scratch;
      scratch.resize(static_cast<size_t>(rows * cols));
      engine.bf16gemm(GemmArgs{a.op.trans, b.op.trans, rows, cols, k, a.op.ld, b.op.ld, cols, 0.0f}, x, y,
                      scratch.data());
      if (bias) add_bias(scratch.data(), rows, cols, cols, bias + w.c0);
      if (gelu) {
        bf16* pre = static_cast<bf16*>(gelu->pre) + (out - c);
        for (int64_t r = 0; r < rows; ++r) {
          f32_to_bf16(scratch.data() + r * cols, pre + r * n, cols);
          vec().unary[1](gelu->op, pre + r * n, out + r * n, cols);
        }
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) f32_to_bf16(scratch.data() + r * cols, out + r * n, cols);
    }
  });
}

void matmul_via_f32(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out);

// bias: undefined, or [n] contiguous in out's dtype. gelu: null, or the epilogue for
// an F32 or BF16 output (the routes through F32 run the GEMM into pre and the GELU
// after it).
void run_route(const Route& route, const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
               const GeluEpilogue* gelu = nullptr, Tensor* pre = nullptr) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  if (route.via_f32) {
    if (!gelu) return matmul_via_f32(a, b, bias, out);
    matmul_via_f32(a, b, bias, *pre);
    return unary(gelu->op == VecUnary::GeluTanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, *pre, out);
  }
  GemmEngine& engine = *gemm_engines()[static_cast<size_t>(route.engine)];
  const Prepared pa = prepare(a), pb = prepare(b);
  switch (out.dtype()) {
    case DType::F32:
      return run_native<float>(engine, pa, pb, batch, m, n, k, out.data<float>(),
                               bias.defined() ? bias.data<float>() : nullptr, gelu);
    case DType::F64:
      assert(!gelu);
      return run_native<double>(engine, pa, pb, batch, m, n, k, out.data<double>(),
                                bias.defined() ? bias.data<double>() : nullptr, nullptr);
    default: {
      const Tensor bias32 = bias.defined() ? bias.to(DType::F32) : Tensor();
      return run_bf16(engine, pa, pb, batch, m, n, k, static_cast<bf16*>(out.data_ptr()),
                      bias32.defined() ? bias32.data<float>() : nullptr, gelu);
    }
  }
}

void tuned_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const GeluEpilogue* gelu = nullptr,
                  Tensor* pre = nullptr) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  // The transposes of the layouts the operands will be read in (part of the shape
  // an engine sees).
  const auto la = gemm_layout(a.size(1), a.size(2), a.stride(1), a.stride(2));
  const auto lb = gemm_layout(b.size(1), b.size(2), b.stride(1), b.stride(2));
  const Signature s{out.dtype(), la && la->trans, lb && lb->trans, batch, m, n, k, tasks_for(batch, m, n, k)};
  const Route route = tuner().choose(s, [&](const Route& r) {
    Tensor scratch = Tensor::empty(out.shape(), out.dtype());
    // The epilogues cost every route the same.
    return cpu_seconds([&] { run_route(r, a, b, Tensor(), scratch); });
  });
  run_route(route, a, b, bias, out, gelu, pre);
}

void matmul_via_f32(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) {
  Tensor out32 = Tensor::empty(out.shape(), DType::F32);
  tuned_matmul(a.to(DType::F32), b.to(DType::F32), bias.defined() ? bias.to(DType::F32) : Tensor(), out32);
  copy(out32, out);
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  if (out.numel() == 0) return;
  if (a.size(2) == 0) {
    fill(out, 0.0);
    return;
  }
  tuned_matmul(a, b, Tensor(), out);
}

void matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out) {
  if (out.numel() == 0) return;
  if (a.size(2) == 0) {
    // An empty sum: every row is the bias.
    copy(bias.expand(out.shape()), out);
    return;
  }
  tuned_matmul(a, b, bias, out);
}

void matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, GeluApprox approx, Tensor& out,
                      Tensor& pre) {
  if (out.numel() == 0) return;
  const UnaryOp op = approx == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf;
  if (a.size(2) == 0 || (out.dtype() != DType::F32 && out.dtype() != DType::BF16)) {
    bias.defined() ? matmul_bias(a, b, bias, pre) : matmul(a, b, pre);
    return unary(op, pre, out);
  }
  const GeluEpilogue gelu{op == UnaryOp::GeluTanh ? VecUnary::GeluTanh : VecUnary::GeluErf, pre.data_ptr()};
  tuned_matmul(a, b, bias, out, &gelu, &pre);
}

void gemm_f32(const GemmArgs& g, const float* a, const float* b, float* c) {
  const Signature s{DType::F32, g.trans_a, g.trans_b, 1, g.m, g.n, g.k, 1};
  const auto& engines = gemm_engines();
  const Route route = tuner().choose(s, [&](const Route& r) {
    // Zeros: beta = 1 reads the output, and garbage could hold slow denormals.
    std::vector<float> scratch(static_cast<size_t>(g.m * g.ldc), 0.0f);
    return cpu_seconds([&] { engines[static_cast<size_t>(r.engine)]->sgemm(g, a, b, scratch.data()); });
  });
  engines[static_cast<size_t>(route.engine)]->sgemm(g, a, b, c);
}

std::vector<std::string> gemm_choices() { return tuner().describe(); }

void configure_blas_threads(int ranks_on_host) { configure_rank_threads(ranks_on_host); }

int blas_threads() { return rank_threads(); }

}  // namespace dtensor::backend::cpu
