// Collective bandwidth, nccl-tests style: for all_reduce, all_gather,
// reduce_scatter and all_to_all, sizes 4 KiB..64 MiB, worlds 2 and 4, the time per
// call, algbw = bytes / time and busbw = algbw x 2(n-1)/n (all_reduce) or (n-1)/n
// (the others), where bytes is the whole array (nccl-tests' "size"). In one run:
//   raw   MPI_Allreduce etc. on a sub-communicator of the first n processes,
//   mpi   dtensor's mpi backend on the same buffers,
//   thr   dtensor's threads backend, n threads inside process 0,
//   memcpy single-thread memcpy of `bytes`, the ceiling a CPU copy reaches.
// Run: mpirun -np 4 --oversubscribe --bind-to none bench_collectives [--max-mib=64] [--worlds=2,4]
// (--bind-to none: otherwise mpirun pins process 0 to one core and the threads
// columns run all their rank threads on it)
//      [--only=all_reduce]
// Without mpirun (or in a build without MPI) only threads and memcpy are measured.
//   bench_collectives --nccl [--max-mib=1024] [--worlds=2,4,8]
// measures dtensor's nccl backend instead, a thread per GPU (worlds up to the GPUs
// visible), CUDA buffers, the columns nccl-tests prints (time, algbw, busbw; out of
// place, F32 sum): put all_reduce_perf's figures for the same sizes beside them.
#if DTENSOR_WITH_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/cuda.h"
#include "dtensor/device.h"
#include "dtensor/group.h"

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

enum class Coll { AllReduce, AllGather, ReduceScatter, AllToAll };
// Measured collectives (--only= keeps one).
std::vector<Coll> collectives = {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll};
const char* name(Coll c) {
  static const char* names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  return names[static_cast<int>(c)];
}
double bus_factor(Coll c, int n) { return (c == Coll::AllReduce ? 2.0 : 1.0) * (n - 1) / n; }

// Enough calls for a stable figure without letting 64 MiB runs dominate. Every
// figure is the best of kTrials averages: on a shared machine other jobs only
// ever make a collective slower, so the minimum is the least noisy estimate.
int iterations(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((96LL << 20) / bytes, 3, 100)); }
// The same for every column: the 5% target is finer than this machine's run-to-run
// noise, and raw MPI against the mpi backend also alternates within every trial.
constexpr int kTrials = 7;

// Per-rank buffers of one collective on `bytes` (nccl-tests sizes: the whole array).
struct Buffers {
  Tensor in, out;
  Buffers(Coll c, int64_t bytes, int n, Device device = Device::cpu()) {
    const int64_t count = bytes / 4 / n * n;  // F32, divisible by n
    const int64_t in_count = c == Coll::AllGather ? count / n : count;
    const int64_t out_count = c == Coll::ReduceScatter ? count / n : count;
    in = Tensor::full({in_count}, 1.0).to(device);
    out = Tensor::zeros({out_count}).to(device);
  }
};

void run_dtensor(Coll c, const Group& g, Buffers& b) {
  switch (c) {
    case Coll::AllReduce: all_reduce_into(g, b.in, b.out); break;
    case Coll::AllGather: all_gather_into(g, b.in, b.out); break;
    case Coll::ReduceScatter: reduce_scatter_into(g, b.in, b.out); break;
    case Coll::AllToAll: all_to_all_into(g, b.in, b.out); break;
  }
}

#if DTENSOR_WITH_MPI
void run_raw(Coll c, MPI_Comm comm, int n, Buffers& b) {
  const int out = static_cast<int>(b.out.numel());
  const int in = static_cast<int>(b.in.numel());
  switch (c) {
    case Coll::AllReduce: MPI_Allreduce(b.in.data_ptr(), b.out.data_ptr(), in, MPI_FLOAT, MPI_SUM, comm); break;
    case Coll::AllGather: MPI_Allgather(b.in.data_ptr(), in, MPI_FLOAT, b.out.data_ptr(), in, MPI_FLOAT, comm); break;
    case Coll::ReduceScatter:
      MPI_Reduce_scatter_block(b.in.data_ptr(), b.out.data_ptr(), out, MPI_FLOAT, MPI_SUM, comm);
      break;
    case Coll::AllToAll:
      MPI_Alltoall(b.in.data_ptr(), in / n, MPI_FLOAT, b.out.data_ptr(), out / n, MPI_FLOAT, comm);
      break;
  }
}

// Seconds per call of two functions: for each, the slowest rank's average over
// `iters` calls, best of the trials. The two alternate within every trial, so drift
// in the machine's load hits both alike (comparing raw MPI with the mpi backend).
template <class FnA, class FnB>
std::pair<double, double> time_mpi_pair(MPI_Comm comm, int iters, FnA a, FnB b) {
  a();
  b();
  double best_a = 1e30, best_b = 1e30;
  auto measure = [&](auto& fn) {
    MPI_Barrier(comm);
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iters;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
    return seconds;
  };
  for (int trial = 0; trial < kTrials; ++trial) {
    best_a = std::min(best_a, measure(a));
    best_b = std::min(best_b, measure(b));
  }
  return {best_a, best_b};
}

#endif

// Seconds per call of the threads backend for every size, n threads in one launch
// (rank threads live as long as a program's do). Each size first runs for ~20 ms:
// freshly started threads share one core until the scheduler spreads them, and
// a 100-call figure taken before that measures context switches.
std::vector<double> time_threads(Coll c, int n, const std::vector<int64_t>& sizes) {
  std::vector<double> seconds(sizes.size(), 0.0);
  launch(n, [&](Group g) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      Buffers b(c, sizes[s], n);
      const int iters = iterations(sizes[s]);
      // Rank 0's clock decides when warming up ends, so all ranks make the same calls.
      Tensor more = Tensor::ones({1});
      for (const auto start = Clock::now(); more.item<float>() != 0;) {
        run_dtensor(c, g, b);
        if (g.rank() == 0) more.fill_(Clock::now() - start < std::chrono::milliseconds(20) ? 1 : 0);
        broadcast_(g, more, 0);
      }
      double best = 1e30;
      for (int trial = 0; trial < kTrials; ++trial) {
        barrier(g);
        const auto start = Clock::now();
        for (int i = 0; i < iters; ++i) run_dtensor(c, g, b);
        barrier(g);
        best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iters);
      }
      if (g.rank() == 0) seconds[s] = best;
    }
  });
  return seconds;
}

// Seconds per call of the nccl backend for every size: n rank threads, each on its
// own GPU, timed as nccl-tests times (calls queued back to back, the stream
// synchronised once at the end), the best of the trials, rank 0's figure (nccl-tests
// averages its ranks' by default; threads of one process start each trial together).
std::vector<double> time_nccl(Coll c, int n, const std::vector<int64_t>& sizes) {
  std::vector<double> seconds(sizes.size(), 0.0);
  launch(n, [&](Group host) {
    const Group g = init("nccl");
    const Device device = g.device();
    const cuda::Stream stream = cuda::current_stream(device.index);
    for (size_t s = 0; s < sizes.size(); ++s) {
      Buffers b(c, sizes[s], n, device);
      const int iters = iterations(sizes[s]);
      for (int i = 0; i < 5; ++i) run_dtensor(c, g, b);  // warm-up (nccl-tests: 5)
      stream.synchronize();
      double best = 1e30;
      for (int trial = 0; trial < kTrials; ++trial) {
        barrier(host);
        const auto start = Clock::now();
        for (int i = 0; i < iters; ++i) run_dtensor(c, g, b);
        stream.synchronize();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iters);
      }
      if (g.rank() == 0) seconds[s] = best;
    }
  });
  return seconds;
}

double memcpy_gbps(int64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  const int iters = iterations(bytes);
  std::memcpy(b.data(), a.data(), bytes);
  double best = 1e30;
  for (int trial = 0; trial < kTrials; ++trial) {
    const auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");  // keep every copy
    }
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iters);
  }
  return bytes / best / 1e9;
}

#if DTENSOR_WITH_MPI
// Processes not measuring wait here without spinning, so they leave the cores to
// those that are; the measuring ones join when done.
void rendezvous_without_spinning() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    // Long sleeps: every wake-up of a waiting process preempts a measuring thread.
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

#endif

struct Row {
  double raw = 0, mpi = 0, thr = 0;  // seconds per call (0: not measured)
};

std::string size_label(int64_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

// --nccl: the table of time_nccl for every world that fits the GPUs.
int run_nccl(const std::vector<int>& worlds, const std::vector<int64_t>& sizes) {
  if (!is_available("nccl")) {
    std::fprintf(stderr,
                 "bench_collectives --nccl: the nccl backend is not available here (no NCCL in this build, "
                 "or no GPU visible)\n");
    return 2;
  }
  const int gpus = cuda_device_count();
  std::printf(
      "# bench_collectives --nccl: F32 sum, out of place, a thread per GPU (%d GPUs visible); nccl-tests' "
      "columns (time in us, algbw and busbw in GB/s)\n\n",
      gpus);
  std::printf("| collective | n | size | time us | algbw | busbw |\n|---|---|---|---|---|---|\n");
  for (const int n : worlds) {
    if (n > gpus) {
      std::printf("| (world %d skipped: %d GPUs) | | | | | |\n", n, gpus);
      continue;
    }
    for (const Coll c : collectives) {
      const std::vector<double> seconds = time_nccl(c, n, sizes);
      for (size_t s = 0; s < sizes.size(); ++s) {
        const double bytes = static_cast<double>(sizes[s]), algbw = bytes / seconds[s] / 1e9;
        std::printf("| %s | %d | %s | %.1f | %.2f | %.2f |\n", name(c), n, size_label(sizes[s]).c_str(),
                    seconds[s] * 1e6, algbw, algbw * bus_factor(c, n));
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t max_bytes = 64LL << 20;
  std::vector<int> worlds{2, 4};
  std::string only;
  bool nccl = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--nccl") nccl = true;
    if (arg.rfind("--only=", 0) == 0) only = arg.substr(7);
    if (arg.rfind("--max-mib=", 0) == 0) max_bytes = std::stoll(arg.substr(10)) << 20;
    if (arg.rfind("--worlds=", 0) == 0) {
      worlds.clear();
      for (size_t p = 9; p < arg.size(); p = arg.find(',', p) + 1) {
        worlds.push_back(std::stoi(arg.substr(p)));
        if (arg.find(',', p) == std::string::npos) break;
      }
    }
  }
  if (!only.empty()) std::erase_if(collectives, [&](Coll c) { return only != name(c); });
  std::vector<int64_t> sizes;
  for (int64_t s = 4 << 10; s <= max_bytes; s *= 4) sizes.push_back(s);
  if (nccl) return run_nccl(worlds, sizes);

  const bool with_mpi = is_available("mpi") && init("any").backend() == "mpi";
  Group world = with_mpi ? init("mpi") : Group();
  const int rank = with_mpi ? world.rank() : 0;
  const int procs = with_mpi ? world.size() : 1;
  if (rank == 0) {
    std::printf("# bench_collectives: F32 sum, out of place; times in us, bandwidths in GB/s\n");
    std::printf("# %d MPI processes, %u hardware threads\n\n", procs, std::thread::hardware_concurrency());
    std::printf(
        "| collective | n | size | raw MPI us | raw busbw | mpi us | mpi busbw | mpi/raw time "
        "| threads us | threads busbw | threads/raw busbw | memcpy GB/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (int n : worlds) {
    std::vector<std::vector<Row>> rows(4, std::vector<Row>(sizes.size()));
#if DTENSOR_WITH_MPI
    // MPI columns: the first n processes; the others wait.
    if (with_mpi && n <= procs) {
      const bool active = rank < n;
      MPI_Comm raw = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, active ? 0 : MPI_UNDEFINED, rank, &raw);
      Group group = world.split(active ? 0 : -1);
      if (active) {
        for (Coll c : collectives) {
          for (size_t s = 0; s < sizes.size(); ++s) {
            Buffers b(c, sizes[s], n);
            const int iters = iterations(sizes[s]);
            const auto [raw_s, mpi_s] = time_mpi_pair(
                raw, iters, [&] { run_raw(c, raw, n, b); }, [&] { run_dtensor(c, group, b); });
            rows[static_cast<int>(c)][s].raw = raw_s;
            rows[static_cast<int>(c)][s].mpi = mpi_s;
          }
        }
        MPI_Comm_free(&raw);
      }
      rendezvous_without_spinning();
    }
#endif
    // Threads columns: n threads in process 0; the other processes wait.
    if (rank == 0) {
      for (Coll c : collectives) {
        const std::vector<double> seconds = time_threads(c, n, sizes);
        for (size_t s = 0; s < sizes.size(); ++s) rows[static_cast<int>(c)][s].thr = seconds[s];
      }
    }
#if DTENSOR_WITH_MPI
    if (with_mpi) rendezvous_without_spinning();
#endif
    if (rank != 0) continue;
    for (Coll c : collectives) {
      for (size_t s = 0; s < sizes.size(); ++s) {
        const Row& r = rows[static_cast<int>(c)][s];
        const double bytes = static_cast<double>(sizes[s]);
        auto busbw = [&](double t) { return t > 0 ? bytes / t / 1e9 * bus_factor(c, n) : 0.0; };
        std::printf("| %s | %d | %s | %.1f | %.2f | %.1f | %.2f | %.3f | %.1f | %.2f | %.2f | %.2f |\n", name(c), n,
                    size_label(sizes[s]).c_str(), r.raw * 1e6, busbw(r.raw), r.mpi * 1e6, busbw(r.mpi),
                    r.raw > 0 ? r.mpi / r.raw : 0.0, r.thr * 1e6, busbw(r.thr),
                    r.raw > 0 ? busbw(r.thr) / busbw(r.raw) : 0.0, memcpy_gbps(sizes[s]));
      }
    }
    std::fflush(stdout);
  }
  return 0;
}
