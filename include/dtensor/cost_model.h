// The alpha-beta communication cost model.
//
// A collective over n ranks costs hops * latency + bytes_on_the_wire / bandwidth,
// with the ring factors of nccl-tests: all-reduce moves 2(n-1)/n of the buffer in
// 2(n-1) hops; all-gather, reduce-scatter and all-to-all move (n-1)/n of the whole
// buffer in n-1 hops. Local copies cost bytes / local bandwidth. The planner uses it
// to choose paths; bench_redistribute reports how far its predictions are from
// measured times.
#pragma once

#include <cstdint>
#include <string_view>

namespace dtensor {

struct CostModel {
  double latency_s = 2e-6;                  // per hop
  double bandwidth_bytes_per_s = 5e9;       // per rank, one direction
  double local_bandwidth_bytes_per_s = 8e9; // a local copy (read + write)
  // Dense kernel throughput per rank (F32 GEMM-like work such as attention blocks):
  // how much communication a computation can hide when the two overlap.
  double flops_per_s = 2e10;
  // The backend exchanges strided pieces where they lie (threads: direct copies;
  // mpi: derived datatypes): an all-to-all between non-outermost dims needs no
  // packing or unpacking copies. False for a backend on the generic pack path.
  bool strided_all_to_all = false;

  // Defaults measured on the machines this project runs on (bench/RESULTS.md):
  // "threads" (shared memory), "mpi" (OpenMPI shared-memory transport). Ranks that
  // outnumber the cores of their host share them, and with them the memory
  // bandwidth: both bandwidths scale by min(1, cores / ranks_on_host).
  static CostModel for_backend(std::string_view backend, int64_t ranks_on_host = 1);

  // `bytes` is the size of the whole buffer the collective produces or reduces.
  double all_reduce(int64_t bytes, int64_t ranks) const;
  double all_gather(int64_t output_bytes, int64_t ranks) const;
  double reduce_scatter(int64_t input_bytes, int64_t ranks) const;
  double all_to_all(int64_t bytes, int64_t ranks) const;
  // Point-to-point exchange: `peers` messages, `bytes` sent by the busiest rank.
  double point_to_point(int64_t bytes, int64_t peers) const;
  double local_copy(int64_t bytes) const;
};

}  // namespace dtensor
