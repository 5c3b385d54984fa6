// Placements: constructors, string form and parser, shard arithmetic, validation.
#include "dtensor/placement.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <set>

#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor {

// ---- Placement -------------------------------------------------------------------------

Placement Shard(int64_t dim, int order) {
  Placement p;
  p.kind_ = Placement::Kind::Shard;
  p.dim_ = dim;
  p.order_ = order;
  return p;
}

Placement Replicate() { return Placement(); }

Placement Partial(ReduceOp op) {
  // A product of partial values has no use in the library and no collective that
  // turns it into a sharded value (reduce_scatter of a product); refusing it here
  // keeps every later stage from having to.
  DT_CHECK_ARG(op != ReduceOp::Product, "Partial",
               "expected a reduce op of sum, avg, max or min, got ", reduce_op_name(op));
  Placement p;
  p.kind_ = Placement::Kind::Partial;
  p.op_ = op;
  return p;
}

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::Replicate: return "R";
    case Kind::Shard:
      return order_ == 0 ? detail::concat("S(", dim_, ")")
                         : detail::concat("S(", dim_, ",order=", order_, ")");
    case Kind::Partial: return detail::concat("P(", reduce_op_name(op_), ")");
  }
  return "?";
}

Placement Placement::normalized(int64_t ndim) const {
  if (kind_ != Kind::Shard) return *this;
  DT_CHECK_ARG(dim_ >= -ndim && dim_ < ndim, "Placement::normalized", to_string(),
               " is out of range for a tensor of ", ndim, " dims: expected a shard dim in [",
               -ndim, ", ", ndim - 1, "]");
  Placement p = *this;
  if (p.dim_ < 0) p.dim_ += ndim;
  return p;
}

std::string placements_to_string(const Placements& placements) {
  std::string out;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (i) out += ',';
    out += placements[i].to_string();
  }
  return out;
}

// ---- parser ------------------------------------------------------------------------------

namespace {

// Recursive descent over: list := [item (',' item)*]; item := R | S '(' int [',' [order '=']
// int] ')' | P ['(' op ')']. Long names (replicate, shard, partial) and any letter case
// are accepted; spaces may appear between tokens. Positions in errors are 0-based.
class PlacementParser {
 public:
  explicit PlacementParser(std::string_view text) : text_(text) {}

  Placements parse() {
    Placements out;
    skip_spaces();
    if (pos_ == text_.size()) return out;  // "" is the list of no placements
    while (true) {
      out.push_back(item());
      skip_spaces();
      if (pos_ == text_.size()) return out;
      expect(',', "',' or end of text");
    }
  }

 private:
  Placement item() {
    skip_spaces();
    const size_t start = pos_;
    const std::string name = word();
    if (name == "r" || name == "replicate") {
      // "Replicate()" as PyTorch prints it.
      if (peek() == '(') {
        ++pos_;
        expect(')', "')'");
      }
      return Replicate();
    }
    if (name == "s" || name == "shard") {
      expect('(', "'(' after S");
      const int64_t dim = integer("a shard dim");
      int order = 0;
      if (peek() == ',') {
        ++pos_;
        skip_spaces();
        const size_t before = pos_;
        const std::string key = word();
        if (key.empty()) {
          pos_ = before;
        } else if (key != "order") {
          pos_ = before;
          fail("'order='");
        } else {
          expect('=', "'=' after order");
        }
        order = static_cast<int>(integer("a shard order"));
      }
      expect(')', "')'");
      return Shard(dim, order);
    }
    if (name == "p" || name == "partial") {
      if (peek() != '(') return Partial(ReduceOp::Sum);
      ++pos_;
      skip_spaces();
      const size_t op_start = pos_;
      const std::string op = word();
      ReduceOp reduce = ReduceOp::Sum;
      if (op == "sum") {
        reduce = ReduceOp::Sum;
      } else if (op == "avg") {
        reduce = ReduceOp::Avg;
      } else if (op == "max") {
        reduce = ReduceOp::Max;
      } else if (op == "min") {
        reduce = ReduceOp::Min;
      } else {
        pos_ = op_start;
        fail("a reduce op (sum, avg, max or min)");
      }
      expect(')', "')'");
      return Partial(reduce);
    }
    pos_ = start;
    fail("R, S(dim) or P(op)");
  }

  void skip_spaces() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  // The next non-space character, or '\0' at the end.
  char peek() {
    skip_spaces();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }

  void expect(char c, const char* what) {
    if (peek() != c) fail(what);
    ++pos_;
  }

  // Letters at the current position, lower-cased (empty when there are none).
  std::string word() {
    skip_spaces();
    std::string out;
    while (pos_ < text_.size() && std::isalpha(static_cast<unsigned char>(text_[pos_]))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(text_[pos_])));
      ++pos_;
    }
    return out;
  }

  int64_t integer(const char* what) {
    skip_spaces();
    const size_t start = pos_;
    bool negative = false;
    if (pos_ < text_.size() && (text_[pos_] == '-' || text_[pos_] == '+')) {
      negative = text_[pos_] == '-';
      ++pos_;
    }
    if (pos_ == text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      pos_ = start;
      fail(what);
    }
    int64_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      if (value > (int64_t{1} << 40)) {
        pos_ = start;
        fail(what);  // absurdly large: no tensor has that many dims
      }
      value = value * 10 + (text_[pos_] - '0');
      ++pos_;
    }
    return negative ? -value : value;
  }

  // What stands at the current position: a run of letters/digits, one other
  // character, or "end of text".
  std::string got() const {
    if (pos_ >= text_.size()) return "end of text";
    size_t end = pos_;
    while (end < text_.size() && std::isalnum(static_cast<unsigned char>(text_[end]))) ++end;
    if (end == pos_) end = pos_ + 1;
    return detail::concat("'", text_.substr(pos_, end - pos_), "'");
  }

  [[noreturn]] void fail(const char* expected) const {
    throw std::invalid_argument(detail::concat("[parse_placements] in '", text_, "' at position ",
                                               pos_, ": expected ", expected, ", got ", got()));
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

Placements parse_placements(std::string_view text) { return PlacementParser(text).parse(); }

// ---- shard arithmetic ------------------------------------------------------------------

Range chunk_range(int64_t size, int64_t pieces, int64_t index) {
  DT_CHECK_ARG(size >= 0 && pieces >= 1 && index >= 0 && index < pieces, "chunk_range",
               "expected size >= 0, pieces >= 1 and 0 <= index < pieces, got size ", size,
               ", pieces ", pieces, ", index ", index);
  const int64_t chunk = (size + pieces - 1) / pieces;
  const int64_t begin = std::min(size, index * chunk);
  const int64_t end = std::min(size, (index + 1) * chunk);
  return Range{begin, end - begin};
}

std::vector<int64_t> chunk_sizes(int64_t size, int64_t pieces) {
  std::vector<int64_t> sizes(static_cast<size_t>(pieces));
  for (int64_t i = 0; i < pieces; ++i) sizes[i] = chunk_range(size, pieces, i).length;
  return sizes;
}

std::vector<std::vector<int>> shard_nesting(const Placements& placements, int64_t tensor_ndim) {
  std::vector<std::vector<int>> nesting(static_cast<size_t>(tensor_ndim));
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    if (!p.is_shard()) continue;
    assert(p.dim() >= 0 && p.dim() < tensor_ndim && "shard_nesting needs normalized placements");
    nesting[p.dim()].push_back(static_cast<int>(m));
  }
  // Mesh dims were appended in increasing order, so a stable sort by order alone
  // breaks ties by mesh dim.
  for (auto& dims : nesting) {
    std::stable_sort(dims.begin(), dims.end(),
                     [&](int a, int b) { return placements[a].order() < placements[b].order(); });
  }
  return nesting;
}

std::vector<Range> local_block(const Shape& global_shape, const Shape& mesh_shape,
                               const Placements& placements,
                               const std::vector<int64_t>& coordinate) {
  DT_CHECK_ARG(placements.size() == mesh_shape.size() && coordinate.size() == mesh_shape.size(),
               "local_block", "expected one placement and one coordinate per mesh dim (",
               mesh_shape.size(), "), got ", placements.size(), " placements and ",
               coordinate.size(), " coordinates");
  const auto ndim = static_cast<int64_t>(global_shape.size());
  Placements normal;
  normal.reserve(placements.size());
  for (const Placement& p : placements) normal.push_back(p.normalized(ndim));
  const auto nesting = shard_nesting(normal, ndim);

  std::vector<Range> block(global_shape.size());
  for (int64_t d = 0; d < ndim; ++d) {
    Range range{0, global_shape[d]};
    // Each sharding mesh dim, outermost first, chunks the piece the previous one left.
    for (int m : nesting[d]) {
      const Range piece = chunk_range(range.length, mesh_shape[m], coordinate[m]);
      range = Range{range.offset + piece.offset, piece.length};
    }
    block[d] = range;
  }
  return block;
}

Shape local_shape(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                  const std::vector<int64_t>& coordinate) {
  const auto block = local_block(global_shape, mesh_shape, placements, coordinate);
  Shape shape(block.size());
  for (size_t d = 0; d < block.size(); ++d) shape[d] = block[d].length;
  return shape;
}

// ---- validation --------------------------------------------------------------------------

Placements validate_placements(const Placements& placements, int64_t mesh_ndim,
                               int64_t tensor_ndim, const char* op) {
  DT_CHECK_ARG(static_cast<int64_t>(placements.size()) == mesh_ndim, op, "expected ", mesh_ndim,
               " placements (one per mesh dim), got ", placements.size(), ": '",
               placements_to_string(placements), "'");
  Placements out;
  out.reserve(placements.size());
  std::set<ReduceOp> partial_ops;
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    if (p.is_shard()) {
      DT_CHECK_ARG(p.dim() >= -tensor_ndim && p.dim() < tensor_ndim, op, p.to_string(),
                   " on mesh dim ", m, " is out of range for a tensor of ", tensor_ndim,
                   " dims: expected a shard dim in [", -tensor_ndim, ", ", tensor_ndim - 1,
                   "] in '", placements_to_string(placements), "'");
    }
    if (p.is_partial()) partial_ops.insert(p.reduce_op());
    out.push_back(p.normalized(tensor_ndim));
  }
  // Reducing over several mesh dims happens one dim at a time in any order; that
  // only gives one answer when the ops commute, i.e. all linear (sum and avg) or
  // all the same.
  if (partial_ops.size() > 1) {
    const bool linear = std::all_of(partial_ops.begin(), partial_ops.end(), [](ReduceOp r) {
      return r == ReduceOp::Sum || r == ReduceOp::Avg;
    });
    DT_CHECK_ARG(linear, op, "Partial ops cannot be mixed across mesh dims unless all are sum or "
                 "avg: got '", placements_to_string(placements), "'");
  }
  return out;
}

}  // namespace dtensor
