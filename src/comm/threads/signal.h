// Waiting for other rank threads without burning the cores they need.
//
// A wait spins for up to kSpinTime (with a core per rank, peers arrive within a
// microsecond), then yields for up to kYieldTime, then sleeps on a condition
// variable in short slices so it can notice an abort or a deadline.
// Why the spin is short: when other processes load the machine, the scheduler
// often queues two ranks on one CPU, and a spinning rank then only delays the
// peer it waits for (measured: a 2-rank barrier took 2 x the spin time, 45 us
// with a 20 us spin, 405 us with 200 us). A yield hands the CPU to that peer, and
// returns at once when the peer runs elsewhere. Sleeping at once would add a
// wake-up (~50-100 us) to every barrier; pure spinning starves 8 ranks on 2 cores.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DTENSOR_CPU_RELAX() _mm_pause()
#else
#define DTENSOR_CPU_RELAX() std::this_thread::yield()
#endif

namespace dtensor::comm::threads {

using Clock = std::chrono::steady_clock;

enum class WaitResult { Ready, Aborted, TimedOut };

class Signal {
 public:
  // Call after changing state others may wait for, with a seq_cst store or RMW.
  void notify() {
    // No fence here: callers change the state with seq_cst stores or RMWs, which
    // order it before this load (a fence cost 0.9 us per 2-rank all-reduce).
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      cv_.notify_all();
    }
  }

  // Waits until ready() (true), `aborted()` (true) or `deadline`. Aborted only if
  // ready() is still false after aborted() said so: a peer may complete the wait
  // and then end (which aborted() may report) between the two checks. `slow()` is
  // asked too, but only once the wait sleeps (after kYieldTime), once per slice:
  // checks too costly for every iteration of a short wait go there.
  template <class Ready, class Aborted>
  WaitResult wait(Ready ready, Aborted aborted, Clock::time_point deadline) {
    return wait(ready, aborted, deadline, [] { return false; });
  }
  template <class Ready, class Aborted, class Slow>
  WaitResult wait(Ready ready, Aborted aborted, Clock::time_point deadline, Slow slow) {
    if (ready()) return WaitResult::Ready;
    const auto start = Clock::now();
    for (int i = 1;; ++i) {
      if (ready()) return WaitResult::Ready;
      DTENSOR_CPU_RELAX();
      if (i % 64 == 0 && Clock::now() - start > kSpinTime) break;
    }
    while (Clock::now() - start < kYieldTime) {
      if (ready()) return WaitResult::Ready;
      if (aborted()) return ready() ? WaitResult::Ready : WaitResult::Aborted;
      std::this_thread::yield();
    }
    while (true) {
      if (ready()) return WaitResult::Ready;
      if (aborted() || slow()) return ready() ? WaitResult::Ready : WaitResult::Aborted;
      const auto now = Clock::now();
      if (now >= deadline) return WaitResult::TimedOut;
      // Slices bound the time to notice an abort (which also notifies) or a lost wake-up.
      const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(50));
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      // Callers' ready() may use acquire loads; the fence orders them after the
      // increment, so either notify() sees a sleeper or ready() sees the new state.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!ready() && !aborted()) cv_.wait_for(lock, slice);
      }
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

 private:
  static constexpr auto kSpinTime = std::chrono::microseconds(2);
  static constexpr auto kYieldTime = std::chrono::microseconds(500);
  std::atomic<int> sleepers_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace dtensor::comm::threads
