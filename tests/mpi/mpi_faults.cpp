// Fault scenarios on the mpi backend, one per run: `mpi_faults SCENARIO TAG`, started
// under mpirun by fault_case.sh, which checks how the job ended (status, message,
// time) and that no process outlived it. TAG only marks the processes for that check.
// Each scenario prints "rank R done" from every rank that finishes normally.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "dtensor/dtensor.h"

using namespace dtensor;
using namespace std::chrono_literals;

namespace {

// Collectives until the job is ended from outside (by a fault on some rank).
void keep_reducing(const Group& world, int calls) {
  for (int k = 0; k < calls; ++k) {
    Tensor t = Tensor::full({1024}, 1.0);
    all_reduce_(world, t);
    if (t.to_vector<float>()[0] != world.size()) throw std::runtime_error("wrong all_reduce result");
  }
}

int run(const std::string& scenario, const Group& world) {
  const int r = world.rank();
  if (scenario == "throw_caught") {
    // Rank 1 fails, reports it and returns a status; rank 0 waits for it in a
    // collective. The non-zero exit ends the job at once.
    if (r == 1) {
      try {
        throw std::runtime_error("rank one gave up");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank 1: %s\n", e.what());
        return 3;
      }
    }
    keep_reducing(world, 1);
  } else if (scenario == "throw_uncaught") {
    if (r == 1) throw std::runtime_error("rank one gave up");
    keep_reducing(world, 1);
  } else if (scenario == "loop") {
    // Faults come from DTENSOR_FAULT (exit, stall, kill) or from outside (kill -9).
    std::fprintf(stderr, "rank %d pid %d\n", r, static_cast<int>(getpid()));
    keep_reducing(world, 1 << 30);
  } else if (scenario == "mismatch") {
    // Different collectives: with DTENSOR_DEBUG=collectives both ranks get the error
    // and go on; without it the job ends at the timeout (or at MPI's own error).
    try {
      if (r == 0) all_reduce(world, Tensor::ones({4}));
      else barrier(world);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    }
    barrier(world);
  } else if (scenario == "size_mismatch") {
    // 8 elements on rank 0, 5 on the others: never a success on any rank.
    try {
      Tensor t = Tensor::ones({r == 0 ? 8 : 5});
      all_reduce_(world, t);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    }
    barrier(world);
  } else if (scenario == "skipped") {
    // Rank 1 skips the second of three all-reduces.
    for (int k = 0; k < 3; ++k) {
      if (r == 1 && k == 1) continue;
      all_reduce(world, Tensor::ones({16}));
    }
    barrier(world);
  } else {
    throw std::invalid_argument("unknown scenario " + scenario);
  }
  std::fprintf(stderr, "rank %d done\n", r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpi_faults SCENARIO [TAG]\n");
    return 2;
  }
  Group world = init("mpi");
  return run(argv[1], world);
}
