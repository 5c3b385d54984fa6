// The per-rank core budget and thread pool (see parallel.h).
#include "backend/cpu/parallel.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DTENSOR_CPU_RELAX() _mm_pause()
#else
#define DTENSOR_CPU_RELAX() std::this_thread::yield()
#endif

namespace dtensor::backend::cpu {
namespace {

// How long an idle worker (or a caller waiting for its workers) polls before it
// sleeps on a futex: kernels of a step follow each other within microseconds, and a
// futex wake costs 5-20 us on a VM.
constexpr auto kSpin = std::chrono::microseconds(50);

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  return end && *end == '\0' && parsed > 0 ? static_cast<int>(parsed) : 0;
}

// Ranks of this job on this host when an MPI launcher started us (else 0).
int launcher_local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MPI_LOCAL_NRANKS"}) {
    if (const int n = env_int(name)) return n;
  }
  return 0;
}

int default_budget(int ranks_on_host) {
  if (const int forced = env_int("DTENSOR_NUM_THREADS")) return forced;
  return std::max(1, usable_cores() / std::max(1, ranks_on_host));
}

std::atomic<int>& budget() {
  static std::atomic<int> value{default_budget(std::max(1, launcher_local_ranks()))};
  return value;
}

// Waits until `word` differs from `old`: polls for kSpin, then sleeps on it.
template <class T>
T await_change(const std::atomic<T>& word, T old) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    const T now = word.load(std::memory_order_acquire);
    if (now != old) return now;
    DTENSOR_CPU_RELAX();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
  }
  for (;;) {
    word.wait(old, std::memory_order_acquire);
    const T now = word.load(std::memory_order_acquire);
    if (now != old) return now;
  }
}

thread_local bool inside_region = false;  // a worker, or a caller inside parallel_for
thread_local bool pool_worker = false;
thread_local CpuTimer* active_timer = nullptr;

int64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    workers_.reserve(static_cast<size_t>(threads - 1));
    for (int w = 0; w + 1 < threads; ++w) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    stop_.store(true, std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  void run(int tasks, const std::function<void(int)>& fn) {
    fn_ = &fn;
    tasks_ = tasks;
    error_ = nullptr;
    next_.store(0, std::memory_order_relaxed);
    const int helpers = std::min(tasks, threads_) - 1;
    active_.store(helpers, std::memory_order_relaxed);
    // Release: a worker that claims a slot through wanted_ sees this region's fields
    // even when it woke up for an earlier epoch.
    wanted_.store(helpers, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    run_tasks();
    for (int left = active_.load(std::memory_order_acquire); left != 0;) {
      left = await_change(active_, left);
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    inside_region = true;
    pool_worker = true;
    uint64_t seen = 0;
    for (;;) {
      seen = await_change(epoch_, seen);
      if (stop_.load(std::memory_order_relaxed)) return;
      // Only the workers a region needs take part; the others go back to waiting.
      if (wanted_.fetch_sub(1, std::memory_order_acq_rel) <= 0) continue;
      run_tasks();
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) active_.notify_one();
    }
  }

  void run_tasks() {
    for (int t; (t = next_.fetch_add(1, std::memory_order_relaxed)) < tasks_;) {
      try {
        (*fn_)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> active_{0}, wanted_{0}, next_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* fn_ = nullptr;
  int tasks_ = 0;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// This rank thread's pool, rebuilt when the budget changes.
Pool* pool_for_this_thread(int threads) {
  thread_local std::unique_ptr<Pool> pool;
  if (!pool || pool->threads() != threads) {
    pool.reset();
    pool = std::make_unique<Pool>(threads);
  }
  return pool.get();
}

}  // namespace

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int rank_threads() { return budget().load(std::memory_order_relaxed); }

void configure_rank_threads(int ranks_on_host) {
  budget().store(default_budget(ranks_on_host), std::memory_order_relaxed);
}

void parallel_run(int tasks, const std::function<void(int task)>& fn) {
  if (tasks <= 0) return;
  const int threads = rank_threads();
  if (tasks == 1 || threads == 1 || inside_region) {
    for (int t = 0; t < tasks; ++t) fn(t);
    return;
  }
  inside_region = true;
  struct Reset {
    ~Reset() { inside_region = false; }
  } reset;
  if (CpuTimer* timer = active_timer) {
    // Tasks on workers add their CPU time; the caller's own is in its thread clock.
    pool_for_this_thread(threads)->run(tasks, [&](int t) {
      if (!pool_worker) return fn(t);
      const int64_t t0 = thread_cpu_ns();
      fn(t);
      timer->task_ns_.fetch_add(thread_cpu_ns() - t0, std::memory_order_relaxed);
    });
    return;
  }
  pool_for_this_thread(threads)->run(tasks, fn);
}

CpuTimer::CpuTimer() : start_ns_(thread_cpu_ns()), previous_(active_timer) { active_timer = this; }
CpuTimer::~CpuTimer() { active_timer = previous_; }
double CpuTimer::seconds() const {
  return static_cast<double>(thread_cpu_ns() - start_ns_ + task_ns_.load(std::memory_order_relaxed)) * 1e-9;
}

int parallel_chunks(int64_t n, int64_t grain) {
  if (inside_region || n <= 0) return 1;
  const int64_t by_grain = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  return static_cast<int>(std::min<int64_t>(rank_threads(), by_grain));
}

void parallel_chunks_for(int64_t n, int64_t grain,
                         const std::function<void(int chunk, int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return;
  const int chunks = parallel_chunks(n, grain);
  parallel_run(chunks, [&](int c) { fn(c, c * n / chunks, (c + 1) * n / chunks); });
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn) {
  parallel_chunks_for(n, grain, [&fn](int, int64_t begin, int64_t end) { fn(begin, end); });
}

}  // namespace dtensor::backend::cpu
