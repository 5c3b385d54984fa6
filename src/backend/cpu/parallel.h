// The cores of one rank and the thread pool that uses them (internal).
//
// Every CPU kernel of a rank, GEMM included, runs on one budget of cores: the
// process's usable cores (its affinity mask) divided by the ranks on this host
// (`launch(n)` sets n; MPI processes read OMPI_COMM_WORLD_LOCAL_SIZE and the like),
// or DTENSOR_NUM_THREADS when set. The GEMM engines are always called
// single-threaded from this pool, so no BLAS or OpenMP runtime keeps threads of its
// own spinning against the pool's (the scheduler and sched_yield time that a
// threaded OpenBLAS costs between small GEMMs).
//
// The pool is per rank thread: a rank with a budget of c cores owns c - 1 workers
// that sleep on a futex between parallel regions after a short spin (50 us, about
// the gap between two kernels of a training step). A budget of one runs everything
// inline on the caller. Work is split statically into contiguous chunks, so a
// reduction that combines per-chunk partials in chunk order gives the same bits on
// every run with the same budget.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace dtensor::backend::cpu {

// Cores this rank's kernels may use (>= 1).
int rank_threads();
// Sets the budget from the number of ranks sharing this host's cores (launch calls
// it before starting its rank threads; DTENSOR_NUM_THREADS, when set, wins).
void configure_rank_threads(int ranks_on_host);
// Usable cores of this process: its CPU affinity mask (what mpirun --bind-to leaves).
int usable_cores();

// Runs fn(0) ... fn(tasks - 1) on this rank's threads (the caller is one of them)
// and returns when all are done; the first exception thrown by a task is rethrown
// here. Tasks are handed out in order to whichever thread is free. One task, a
// budget of one core, or a call from inside a task runs inline.
void parallel_run(int tasks, const std::function<void(int task)>& fn);

// How many chunks parallel_for(n, grain, ...) makes: min(rank_threads(), n / grain),
// at least 1 (1 inside a task). Chunk c covers [c * n / k, (c + 1) * n / k), so
// callers that keep per-chunk partial results combine them in a fixed order.
int parallel_chunks(int64_t n, int64_t grain);

// fn(chunk, begin, end) for the chunks of parallel_chunks(n, grain).
void parallel_chunks_for(int64_t n, int64_t grain,
                         const std::function<void(int chunk, int64_t begin, int64_t end)>& fn);

// fn(begin, end) on the same chunks, without the index.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

// CPU seconds spent on a piece of work: the calling thread's own CPU time in scope
// plus that of every pool task it starts meanwhile. Unlike wall time it does not
// count the time other processes hold the cores, so comparisons made with it (the
// GEMM engine choice) hold on a loaded machine.
class CpuTimer {
 public:
  CpuTimer();
  ~CpuTimer();
  CpuTimer(const CpuTimer&) = delete;
  CpuTimer& operator=(const CpuTimer&) = delete;
  double seconds() const;

 private:
  friend void parallel_run(int, const std::function<void(int)>&);
  int64_t start_ns_;
  std::atomic<int64_t> task_ns_{0};
  CpuTimer* previous_;
};

}  // namespace dtensor::backend::cpu
