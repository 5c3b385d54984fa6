// The alpha-beta cost model (see cost_model.h for the formulas).
#include "dtensor/cost_model.h"

namespace dtensor {

CostModel CostModel::for_backend(std::string_view backend) {
  CostModel model;
  if (backend == "mpi") {
    // OpenMPI over shared memory on a 2-core host: more latency per hop, and about
    // 2 GB/s for large buffers (bench/RESULTS.md, bench_collectives).
    model.latency_s = 10e-6;
    model.bandwidth_bytes_per_s = 2.0e9;
  } else {
    // threads: ranks copy from each other's buffers directly; a hop is a
    // synchronisation (a few microseconds), bandwidth is memory bandwidth.
    model.latency_s = 3e-6;
    model.bandwidth_bytes_per_s = 6.0e9;
  }
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
