// Checkpoint shard arithmetic (plan.h).
#include "checkpoint/plan.h"

#include <algorithm>
#include <cassert>

namespace dtensor::checkpoint::detail {

int64_t box_numel(const Box& box) {
  int64_t n = 1;
  for (const Range& r : box) n *= r.length;
  return n;
}

Box full_box(const Shape& shape) {
  Box box;
  box.reserve(shape.size());
  for (int64_t size : shape) box.push_back({0, size});
  return box;
}

Shape box_shape(const Box& box) {
  Shape shape;
  shape.reserve(box.size());
  for (const Range& r : box) shape.push_back(r.length);
  return shape;
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  assert(a.size() == b.size());
  Box out(a.size());
  for (size_t d = 0; d < a.size(); ++d) {
    const int64_t begin = std::max(a[d].offset, b[d].offset);
    const int64_t end = std::min(a[d].end(), b[d].end());
    if (end <= begin) return std::nullopt;
    out[d] = {begin, end - begin};
  }
  return out;
}

Box block_of(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
             const std::vector<int64_t>& coordinate) {
  return local_block(global_shape, mesh_shape, placements, coordinate);
}

bool writes_block(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                  const std::vector<int64_t>& coordinate) {
  for (size_t d = 0; d < mesh_shape.size(); ++d) {
    const bool splits = placements[d].is_shard() && mesh_shape[d] > 1;
    if (!splits && coordinate[d] != 0) return false;
  }
  return box_numel(block_of(global_shape, mesh_shape, placements, coordinate)) > 0;
}

std::vector<ByteRun> byte_runs(const Box& chunk, const Box& destination, const Box& part, int64_t element_size) {
  const size_t ndim = part.size();
  std::vector<ByteRun> runs;
  if (box_numel(part) == 0) return runs;
  // The run is the innermost dims that `part` spans whole in both the chunk and the
  // destination, plus the next dim's extent: runs_dim is the first dim of the run.
  size_t runs_dim = ndim;
  int64_t run_elements = 1;
  while (runs_dim > 0) {
    const size_t d = runs_dim - 1;
    run_elements *= part[d].length;
    runs_dim = d;
    if (part[d].length != chunk[d].length || part[d].length != destination[d].length) break;
  }
  // Row-major strides (in elements) of the chunk and the destination.
  std::vector<int64_t> chunk_stride(ndim, 1), dest_stride(ndim, 1);
  for (size_t d = ndim; d-- > 1;) {
    chunk_stride[d - 1] = chunk_stride[d] * chunk[d].length;
    dest_stride[d - 1] = dest_stride[d] * destination[d].length;
  }
  // Walk the index of the dims outside the run.
  std::vector<int64_t> index(runs_dim, 0);
  while (true) {
    int64_t source = 0, dest = 0;
    for (size_t d = 0; d < ndim; ++d) {
      const int64_t at = part[d].offset + (d < runs_dim ? index[d] : 0);
      source += (at - chunk[d].offset) * chunk_stride[d];
      dest += (at - destination[d].offset) * dest_stride[d];
    }
    const ByteRun run{source * element_size, dest * element_size, run_elements * element_size};
    if (!runs.empty() && runs.back().source + runs.back().length == run.source &&
        runs.back().destination + runs.back().length == run.destination) {
      runs.back().length += run.length;
    } else {
      runs.push_back(run);
    }
    size_t d = runs_dim;
    for (; d > 0; --d) {
      if (++index[d - 1] < part[d - 1].length) break;
      index[d - 1] = 0;
    }
    if (d == 0) break;
  }
  return runs;
}

int64_t block_count(int64_t chunk_bytes, int64_t block_bytes) {
  return chunk_bytes == 0 ? 0 : (chunk_bytes + block_bytes - 1) / block_bytes;
}

std::vector<ByteRange> read_ranges(const std::vector<ByteRun>& runs, int64_t chunk_bytes, int64_t block_bytes) {
  std::vector<ByteRange> ranges;
  ranges.reserve(runs.size());
  for (const ByteRun& run : runs) {
    ByteRange r{run.source, run.source + run.length};
    if (block_bytes > 0) {
      r.begin = r.begin / block_bytes * block_bytes;
      r.end = std::min(chunk_bytes, (r.end + block_bytes - 1) / block_bytes * block_bytes);
    }
    ranges.push_back(r);
  }
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (!merged.empty() && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace dtensor::checkpoint::detail
