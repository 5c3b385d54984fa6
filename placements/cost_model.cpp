// The alpha-beta cost model (see cost_model.h for the formulas).
#include "dtensor/cost_model.h"

#include <algorithm>
#include <thread>

namespace dtensor {

CostModel CostModel::for_backend(std::string_view backend, int64_t ranks_on_host) {
  CostModel model;
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const double share = std::min(1.0, cores / static_cast<double>(std::max<int64_t>(ranks_on_host, 1)));
  if (backend == "mpi") {
    // OpenMPI's shared-memory transport on a 2-core host: about 2 GB/s per rank for
    // large buffers and ~10 us per hop (bench_collectives, raw MPI rows). Strided
    // pieces travel as derived datatypes (MPI_Alltoallw).
    model.latency_s = 10e-6;
    model.bandwidth_bytes_per_s = 2.0e9 * share;
    model.strided_all_to_all = true;
  } else {
    // threads: ranks copy from each other's buffers; a hop is a synchronisation of a
    // few microseconds. Fitted to bench_redistribute's bare collectives on 64 MiB
    // (4 ranks on 2 cores, idle machine: 1.8-3.3 GB/s per rank, ~5 GB/s unshared).
    model.latency_s = 3e-6;
    model.bandwidth_bytes_per_s = 5.0e9 * share;
    model.strided_all_to_all = backend == "threads";
  }
  // A local copy (read + write) on one core: bench_redistribute's local chunk.
  model.local_bandwidth_bytes_per_s = 7e9 * share;
  // The attention kernel on one core of this project's machines: ~20-40 GFLOP/s
  // (bench_context_parallel, seq 4096 on one rank).
  model.flops_per_s = 2e10 * share;
  return model;
}

double CostModel::all_reduce(int64_t bytes, int64_t ranks) const {
  if (ranks <= 1) return 0;
  const double factor = 2.0 * (ranks - 1) / ranks;
  return 2.0 * (ranks - 1) * latency_s + factor * bytes / bandwidth_bytes_per_s;
}

double CostModel::all_gather(int64_t output_bytes, int64_t ranks) const {
  if (ranks <= 1) return 0;
  const double factor = static_cast<double>(ranks - 1) / ranks;
  return (ranks - 1) * latency_s + factor * output_bytes / bandwidth_bytes_per_s;
}

double CostModel::reduce_scatter(int64_t input_bytes, int64_t ranks) const {
  return all_gather(input_bytes, ranks);
}

double CostModel::all_to_all(int64_t bytes, int64_t ranks) const { return all_gather(bytes, ranks); }

double CostModel::point_to_point(int64_t bytes, int64_t peers) const {
  return peers * latency_s + bytes / bandwidth_bytes_per_s;
}

double CostModel::local_copy(int64_t bytes) const { return bytes / local_bandwidth_bytes_per_s; }

}  // namespace dtensor
