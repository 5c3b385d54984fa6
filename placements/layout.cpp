// Layout helpers shared by the transforms and the planner.
#include <algorithm>
#include <limits>

#include "placements/transform.h"

namespace dtensor::redistribution {

Placements canonicalize(const Placements& placements, int64_t tensor_ndim) {
  Placements out = placements;
  const std::vector<std::vector<int>> nesting = shard_nesting(placements, tensor_ndim);
  for (const std::vector<int>& nest : nesting) {
    // Smallest orders that keep the nesting: a mesh dim after a smaller mesh dim
    // can share its order (ties go by mesh dim); after a larger one it needs +1.
    int order = 0;
    for (size_t k = 0; k < nest.size(); ++k) {
      if (k > 0 && nest[k] < nest[k - 1]) ++order;
      out[nest[k]] = Shard(placements[nest[k]].dim(), order);
    }
  }
  return out;
}

std::string layout_key(const Placements& placements, const Shape& mesh_shape, int64_t tensor_ndim) {
  std::string key;
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    // Appended piecewise: GCC 12 warns falsely (-Wstringop-overflow) on
    // "S" + std::to_string(...) once <string> is precompiled.
    if (p.is_shard()) {
      key += 'S';
      key += std::to_string(p.dim());
    } else {
      key += p.to_string();
    }
    key += ',';
  }
  for (const std::vector<int>& nest : shard_nesting(placements, tensor_ndim)) {
    key += '|';
    for (int m : nest) {
      if (mesh_shape[m] > 1) key += std::to_string(m) + ".";
    }
  }
  return key;
}

bool is_innermost(const Placements& placements, const Shape& mesh_shape, int64_t tensor_ndim,
                  int mesh_dim, int64_t tensor_dim) {
  const std::vector<int> nest = shard_nesting(placements, tensor_ndim)[tensor_dim];
  for (auto it = nest.rbegin(); it != nest.rend(); ++it) {
    if (*it == mesh_dim) return true;
    if (mesh_shape[*it] > 1) return false;  // a real splitter sits inside mesh_dim
  }
  return false;
}

Placements with_placement(const Placements& placements, int mesh_dim, const Placement& p) {
  Placements out = placements;
  out[mesh_dim] = p;
  return out;
}

Placements with_inner_shard(const Placements& placements, int64_t tensor_ndim, int mesh_dim,
                            int64_t tensor_dim) {
  int max_order = -1;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (static_cast<int>(i) != mesh_dim && placements[i].is_shard(tensor_dim)) {
      max_order = std::max(max_order, placements[i].order());
    }
  }
  return canonicalize(with_placement(placements, mesh_dim, Shard(tensor_dim, max_order + 1)),
                      tensor_ndim);
}

bool partials_compatible(const Placements& placements) {
  std::vector<ReduceOp> ops;
  for (const Placement& p : placements) {
    if (p.is_partial()) ops.push_back(p.reduce_op());
  }
  const bool all_equal = std::all_of(ops.begin(), ops.end(), [&](ReduceOp op) { return op == ops[0]; });
  const bool all_linear = std::all_of(ops.begin(), ops.end(), [](ReduceOp op) {
    return op == ReduceOp::Sum || op == ReduceOp::Avg;
  });
  return all_equal || all_linear;
}

Range parent_range(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                   const std::vector<int64_t>& coordinate, int mesh_dim, int64_t tensor_dim) {
  const Placements without = with_placement(placements, mesh_dim, Replicate());
  return local_block(global_shape, mesh_shape, without, coordinate)[tensor_dim];
}

int64_t ranges_numel(const std::vector<Range>& block) {
  int64_t n = 1;
  for (const Range& r : block) n *= r.length;
  return n;
}

std::vector<Range> intersect_blocks(const std::vector<Range>& a, const std::vector<Range>& b) {
  std::vector<Range> out(a.size());
  for (size_t d = 0; d < a.size(); ++d) {
    const int64_t lo = std::max(a[d].offset, b[d].offset);
    const int64_t hi = std::min(a[d].end(), b[d].end());
    out[d] = {lo, std::max<int64_t>(hi - lo, 0)};
  }
  return out;
}

Tensor block_view(const Tensor& t, const std::vector<Range>& held, const std::vector<Range>& part) {
  Tensor v = t;
  for (size_t d = 0; d < part.size(); ++d) {
    v = v.narrow(static_cast<int64_t>(d), part[d].offset - held[d].offset, part[d].length);
  }
  return v;
}

int64_t max_local_numel(const Shape& global_shape, const Shape& mesh_shape,
                        const Placements& placements) {
  const std::vector<int64_t> origin(mesh_shape.size(), 0);
  return ranges_numel(local_block(global_shape, mesh_shape, placements, origin));
}

int64_t max_local_bytes(const StepContext& ctx, const Placements& placements) {
  return max_local_numel(ctx.global_shape, ctx.mesh.shape(), placements) * static_cast<int64_t>(dtype_size(ctx.dtype));
}

Footprint collective_footprint(const StepContext& ctx, const char* collective) {
  const auto block = local_block(ctx.global_shape, ctx.mesh.shape(), ctx.from, ctx.mesh.coordinate());
  return {collective, 1, ranges_numel(block) * static_cast<int64_t>(dtype_size(ctx.dtype))};
}

StartedStep in_flight(Work work, Tensor out) {
  return {work, [work, out]() mutable {
            work.wait();
            return out;
          }};
}

double reduce_identity(ReduceOp op, DType dtype) {
  // Integer extremes that survive the trip through double (2^63 - 1 does not).
  const double int_lowest = dtype == DType::I32 ? std::numeric_limits<int32_t>::lowest()
                                                : static_cast<double>(std::numeric_limits<int64_t>::lowest());
  const double int_highest = dtype == DType::I32 ? std::numeric_limits<int32_t>::max()
                                                 : 9223372036854774784.0;  // 2^63 - 1024
  switch (op) {
    case ReduceOp::Max:
      if (dtype == DType::Bool) return 0.0;
      return is_integral(dtype) ? int_lowest : -std::numeric_limits<double>::infinity();
    case ReduceOp::Min:
      if (dtype == DType::Bool) return 1.0;
      return is_integral(dtype) ? int_highest : std::numeric_limits<double>::infinity();
    case ReduceOp::Product: return 1.0;
    default: return 0.0;
  }
}

}  // namespace dtensor::redistribution
