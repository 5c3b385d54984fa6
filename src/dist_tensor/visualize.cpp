// visualize_sharding: a text picture of which rank holds which block.
//
// Tensors of rank 1 and 2 print as a table whose rows (and columns) are the
// distinct index ranges of the tensor dims; each cell lists the world ranks that
// hold that block, with its size, so replicated blocks show every holder and
// uneven or empty shards show their real sizes:
//
//   DistTensor [7, 5] f32 on mesh dp=2,tp=2, placements S(0),S(1)
//   rows \ cols  0:3           3:5
//   0:4          rank 0 (4x3)  rank 1 (4x2)
//   4:7          rank 2 (3x3)  rank 3 (3x2)
//
// Higher ranks print one line per rank: "rank 5 (1,0,1): [0:4, 3:5, :] 4x2x3".
#include <algorithm>
#include <set>

#include "dtensor/dist_tensor.h"
#include "dtensor/error.h"
#include "mesh/mesh_index.h"
#include "util/check.h"

namespace dtensor {

namespace {

struct Holder {
  int world_rank;
  std::vector<int64_t> coordinate;
  std::vector<Range> block;
};

std::vector<Holder> holders(const Shape& shape, const DeviceMesh& mesh, const Placements& placements) {
  const Shape& mesh_shape = mesh.shape();
  std::vector<Holder> out;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    const auto coordinate = mesh_index::coordinate_of(r, mesh_shape);
    out.push_back({mesh.ranks()[r], coordinate, local_block(shape, mesh_shape, placements, coordinate)});
  }
  return out;
}

std::string range_text(const Range& r) { return detail::concat(r.offset, ":", r.end()); }

std::string size_text(const std::vector<Range>& block) {
  if (block.empty()) return "scalar";
  std::string out;
  for (size_t d = 0; d < block.size(); ++d) {
    if (d) out += 'x';
    out += std::to_string(block[d].length);
  }
  return out;
}

// " partial(sum)" when some mesh dim is Partial (every holder has a partial value).
std::string partial_text(const Placements& placements) {
  std::vector<std::string> ops;
  for (const Placement& p : placements) {
    if (!p.is_partial()) continue;
    const std::string name(reduce_op_name(p.reduce_op()));
    if (std::find(ops.begin(), ops.end(), name) == ops.end()) ops.push_back(name);
  }
  if (ops.empty()) return "";
  std::string out = " partial(";
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) out += ',';
    out += ops[i];
  }
  return out + ")";
}

std::string holders_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ranks[i]);
  }
  return out;
}

// Left-aligned columns, two spaces apart, without trailing spaces.
std::string render_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

// The distinct ranges of tensor dim `d` over all holders, by offset then length.
std::vector<Range> distinct_ranges(const std::vector<Holder>& all, size_t d) {
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const Holder& h : all) seen.emplace(h.block[d].offset, h.block[d].length);
  std::vector<Range> out;
  for (const auto& [offset, length] : seen) out.push_back(Range{offset, length});
  return out;
}

std::string grid(const std::vector<Holder>& all, int64_t ndim, const std::string& partial) {
  // A block is the product of one range per dim, and different tensor dims are
  // split by different mesh dims, so every (row range, column range) pair is held.
  auto cell = [&](const Range* row, const Range* col) {
    std::vector<int> ranks;
    std::vector<Range> block;
    for (const Holder& h : all) {
      if ((row && h.block[0] != *row) || (col && h.block[ndim - 1] != *col)) continue;
      ranks.push_back(h.world_rank);
      block = h.block;
    }
    return detail::concat(holders_text(ranks), " (", size_text(block), ")", partial);
  };
  std::vector<std::vector<std::string>> rows;
  if (ndim == 0) {
    rows.push_back({"value", cell(nullptr, nullptr)});
  } else if (ndim == 1) {
    rows.push_back({"range", "held by"});
    for (const Range& r : distinct_ranges(all, 0)) rows.push_back({range_text(r), cell(&r, nullptr)});
  } else {
    const auto row_ranges = distinct_ranges(all, 0), col_ranges = distinct_ranges(all, 1);
    std::vector<std::string> header{"rows \\ cols"};
    for (const Range& c : col_ranges) header.push_back(range_text(c));
    rows.push_back(std::move(header));
    for (const Range& r : row_ranges) {
      std::vector<std::string> line{range_text(r)};
      for (const Range& c : col_ranges) line.push_back(cell(&r, &c));
      rows.push_back(std::move(line));
    }
  }
  return render_table(rows);
}

std::string per_rank(const std::vector<Holder>& all, const Shape& shape, const std::string& partial) {
  std::vector<std::vector<std::string>> rows;
  for (const Holder& h : all) {
    std::string coordinate, block;
    for (size_t m = 0; m < h.coordinate.size(); ++m) {
      if (m) coordinate += ',';
      coordinate += std::to_string(h.coordinate[m]);
    }
    for (size_t d = 0; d < h.block.size(); ++d) {
      const bool whole = h.block[d].offset == 0 && h.block[d].length == shape[d];
      if (d) block += ", ";
      block += whole ? std::string(":") : range_text(h.block[d]);
    }
    rows.push_back({detail::concat("rank ", h.world_rank, " (", coordinate, "):"),
                    "[" + block + "]", size_text(h.block) + partial});
  }
  return render_table(rows);
}

std::string picture(const std::string& title, const Shape& shape, const DeviceMesh& mesh,
                    const Placements& placements) {
  DT_CHECK_ARG(mesh.defined(), "visualize_sharding", "expected a defined mesh");
  const auto ndim = static_cast<int64_t>(shape.size());
  const Placements normalized = validate_placements(placements, mesh.ndim(), ndim, "visualize_sharding");
  const auto all = holders(shape, mesh, normalized);
  const std::string partial = partial_text(normalized);
  const std::string head = detail::concat(title, " on mesh ", mesh.to_string(), ", placements ",
                                          placements_to_string(normalized), "\n");
  return head + (ndim <= 2 ? grid(all, ndim, partial) : per_rank(all, shape, partial));
}

}  // namespace

std::string visualize_sharding(const DistTensor& t) {
  DT_CHECK_ARG(t.defined(), "visualize_sharding", "expected a defined DistTensor");
  return picture(detail::concat("DistTensor ", t.shape(), " ", dtype_name(t.dtype())), t.shape(),
                 t.mesh(), t.placements());
}

std::string visualize_sharding(const Shape& shape, const DeviceMesh& mesh, const Placements& placements) {
  return picture(detail::concat("DistTensor ", shape), shape, mesh, placements);
}

}  // namespace dtensor
