// What faults cost on the threads backend, through the public API only (so the same
// program measures any version of the library):
//   release  a rank throws or returns while the others wait in a collective: the
//            time from the fault to each peer's error (max over peers), and a stall
//            against a 200 ms timeout, and a ring of receives none of which is
//            matched (the wait-for graph, or a 2 s timeout);
//   sweep    faults injected in user code (throw, return early, stall) at each of
//            the first 10 calls of a rank program (sub-group all-reduces of 256 KiB,
//            all-gathers with size exchange, batched point to point, async work in
//            flight) on 2, 4 and 8 ranks, rank 0 or the last failing: 180 cases, each
//            in its own process, counted as clean (every rank ended, every result
//            that came back right), wrong result, crash (a signal) or hang (> 20 s);
//            and whether a thread of the backend outlived launch (clean only if none did);
//            then the 60 throw cases in one process, 10 times, counting aborts.
// Run: bench_faults [release|sweep] (both by default).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/dtensor.h"

using namespace dtensor;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// ---- release times ------------------------------------------------------------------------

// Rank n-1 fails (throws, or returns) once the others are waiting in an all_reduce;
// returns the slowest peer's time from the fault to its error, in ms.
double release_ms(int n, bool returns) {
  std::atomic<int64_t> fault_ns{0};
  std::atomic<double> slowest{0};
  try {
    launch(n, [&](Group world) {
      if (world.rank() == n - 1) {
        std::this_thread::sleep_for(20ms);  // the others are asleep in the wait by now
        fault_ns = Clock::now().time_since_epoch().count();
        if (returns) return;
        throw std::runtime_error("injected");
      }
      try {
        all_reduce(world, Tensor::ones({1024}));
      } catch (const std::exception&) {
        const double ms = (Clock::now().time_since_epoch().count() - fault_ns.load()) / 1e6;
        double seen = slowest.load();
        while (ms > seen && !slowest.compare_exchange_weak(seen, ms)) {
        }
      }
    });
  } catch (const std::exception&) {
  }
  return slowest.load();
}

// Every rank receives from the next one first: a ring of receives none of which is
// ever matched (or ranks that disagree about who sends). The time from the last
// rank's start to the slowest rank's error, in ms (the timeout, 2 s, if the cycle
// is not found).
double receive_ring_ms(int n) {
  std::atomic<int64_t> last_start_ns{0}, last_error_ns{0};
  auto note_max = [](std::atomic<int64_t>& slot, int64_t ns) {
    int64_t seen = slot.load();
    while (ns > seen && !slot.compare_exchange_weak(seen, ns)) {
    }
  };
  try {
    launch(n, [&](Group world) {
      world.set_timeout(2s);
      barrier(world);
      note_max(last_start_ns, Clock::now().time_since_epoch().count());
      try {
        recv(world, Tensor::empty({1024}), (world.rank() + 1) % n);
      } catch (const std::exception&) {
        note_max(last_error_ns, Clock::now().time_since_epoch().count());
      }
    });
  } catch (const std::exception&) {
  }
  return (last_error_ns.load() - last_start_ns.load()) / 1e6;
}

double stall_ms(int n) {
  double worst = 0;
  std::mutex mutex;
  try {
    launch(n, [&](Group world) {
      world.set_timeout(200ms);
      if (world.rank() == n - 1) {
        std::this_thread::sleep_for(700ms);
        return;
      }
      const auto start = Clock::now();
      try {
        all_reduce(world, Tensor::ones({1024}));
      } catch (const std::exception&) {
        std::lock_guard<std::mutex> lock(mutex);
        worst = std::max(worst, ms_since(start));
      }
    });
  } catch (const std::exception&) {
  }
  return worst;
}

void release_table() {
  std::printf("| ranks | fault | min ms | median ms | max ms (20 trials; slowest peer each) |\n|---|---|---|---|---|\n");
  for (int n : {2, 4, 8}) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<double> v;
      for (int t = 0; t < (kind == 2 ? 5 : 20); ++t) {
        v.push_back(kind == 2 ? stall_ms(n) : kind == 3 ? receive_ring_ms(n) : release_ms(n, kind == 1));
      }
      std::sort(v.begin(), v.end());
      std::printf("| %d | %s | %.2f | %.2f | %.2f |\n", n,
                  kind == 0   ? "throw"
                  : kind == 1 ? "return"
                  : kind == 2 ? "stall (200 ms timeout; 5 trials)"
                              : "ring of receives (2 s timeout)",
                  v.front(), v[v.size() / 2], v.back());
    }
  }
}

// ---- the sweep -------------------------------------------------------------------------------

enum class Kind { Throw, Return, Stall };
const char* kind_name(Kind k) { return k == Kind::Throw ? "throw" : k == Kind::Return ? "return" : "stall"; }

struct Case {
  int n, rank, call;
  Kind kind;
};

struct EarlyReturn {};

// One rank program; `fault` runs before each of this rank's calls.
void program(Group world, const std::function<void()>& fault, std::atomic<int>& wrong) {
  const int n = world.size(), r = world.rank();
  Group half = world.split(r % 2);
  for (int k = 0; k < 3; ++k) {
    fault();
    Tensor x = Tensor::full({65536}, r + k);  // 256 KiB
    Work pending = all_reduce_async(half, x, x);
    fault();
    Tensor big = all_reduce(half, Tensor::full({65536}, 1.0));
    if (big.to_vector<float>()[65535] != static_cast<float>((n + 1 - r % 2) / 2)) wrong++;
    fault();
    Tensor gathered = all_gather(world, Tensor::full({r % 3 + 1}, r));
    int64_t expect = 0;
    for (int s = 0; s < n; ++s) expect += s % 3 + 1;
    if (gathered.numel() != expect || gathered.to_vector<float>().back() != n - 1) wrong++;
    fault();
    Tensor got = Tensor::zeros({4096});
    batch_send_recv(world, {P2POp::send(Tensor::full({4096}, r), (r + 1) % n), P2POp::recv(got, (r + n - 1) % n)});
    if (got.to_vector<float>()[4095] != (r + n - 1) % n) wrong++;
    pending.wait();
    float want = 0;
    for (int s = r % 2; s < n; s += 2) want += s + k;
    if (x.to_vector<float>()[65535] != want) wrong++;
  }
}

// Threads of this process (Linux: /proc/self/task).
int live_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// 0 clean, 1 wrong results, 2 a thread of the backend still alive after launch returned.
int run_case(const Case& c) {
  std::atomic<int> wrong{0};
  const int threads_before = live_threads();
  try {
    launch(c.n, [&](Group world) {
      world.set_timeout(c.kind == Kind::Stall ? 300ms : 10s);
      int calls = 0;
      auto fault = [&] {
        if (world.rank() != c.rank || ++calls != c.call) return;
        if (c.kind == Kind::Throw) throw std::runtime_error("injected");
        if (c.kind == Kind::Return) throw EarlyReturn{};
        std::this_thread::sleep_for(700ms);  // past the others' timeout
        throw EarlyReturn{};
      };
      try {
        program(world, fault, wrong);
      } catch (const EarlyReturn&) {
      }
    });
  } catch (const std::exception&) {
  }
  if (wrong.load() > 0) return 1;
  return live_threads() > threads_before ? 2 : 0;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int n : {2, 4, 8}) {
    for (Kind kind : {Kind::Throw, Kind::Return, Kind::Stall}) {
      for (int rank : {0, n - 1}) {
        for (int call = 1; call <= 10; ++call) out.push_back({n, rank, call, kind});
      }
    }
  }
  return out;
}

void sweep() {
  int clean = 0, wrong = 0, crashed = 0, hung = 0, threads_left = 0;
  for (const Case& c : cases()) {
    const pid_t child = fork();
    if (child == 0) _exit(run_case(c));
    int status = 0;
    const auto start = Clock::now();
    while (waitpid(child, &status, WNOHANG) == 0) {
      if (ms_since(start) > 20000) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        ++hung;
        std::printf("hang: %s at call %d of rank %d of %d\n", kind_name(c.kind), c.call, c.rank, c.n);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(2ms);
    }
    if (status == -1) continue;
    if (WIFSIGNALED(status)) {
      ++crashed;
      std::printf("crash (signal %d): %s at call %d of rank %d of %d\n", WTERMSIG(status), kind_name(c.kind), c.call,
                  c.rank, c.n);
    } else if (WEXITSTATUS(status) == 2) {
      ++threads_left;
      std::printf("thread left after launch: %s at call %d of rank %d of %d\n", kind_name(c.kind), c.call, c.rank, c.n);
    } else if (WEXITSTATUS(status) != 0) {
      ++wrong;
      std::printf("wrong result: %s at call %d of rank %d of %d\n", kind_name(c.kind), c.call, c.rank, c.n);
    } else {
      ++clean;
    }
  }
  std::printf(
      "sweep: %zu cases, one process each: %d clean, %d wrong results, %d crashed, %d hung, %d with a thread left "
      "after launch returned\n",
      cases().size(), clean, wrong, crashed, hung, threads_left);
  // The throw cases one after another in one process.
  int aborted = 0;
  for (int run = 0; run < 10; ++run) {
    const pid_t child = fork();
    if (child == 0) {
      int bad = 0;
      for (const Case& c : cases()) {
        if (c.kind == Kind::Throw) bad += run_case(c);
      }
      _exit(bad > 0 ? 1 : 0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFSIGNALED(status)) ++aborted;
  }
  std::printf("the 60 throw cases in one process, 10 runs: %d died\n", aborted);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  if (what == "all" || what == "release") release_table();
  if (what == "all" || what == "sweep") sweep();
  return 0;
}
