// Placements: how a tensor is laid out along one mesh dim, and the shard arithmetic.
//
//   Shard(d)     the tensor is split along tensor dim d across the mesh dim;
//   Replicate()  every coordinate of the mesh dim holds the same values;
//   Partial(op)  every coordinate holds a partial value; the tensor is their
//                reduction by op (sum, avg, max, min).
//
// Several mesh dims may shard the same tensor dim. They then split it one inside
// the other: the outer one chunks the dim, the next chunks the outer one's piece,
// and so on. By default mesh dim 0 is outermost (the DESIGN default). `order`
// changes that: among the mesh dims sharding one tensor dim, smaller orders are
// outer, ties go by mesh dim. FSDP over tensor parallel on a (dp, tp) mesh is
// {Shard(0, 1), Shard(0, 0)}: tp splits the rows first, dp splits each tp piece.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/group.h"
#include "dtensor/tensor.h"

namespace dtensor {

class Placement {
 public:
  enum class Kind : uint8_t { Replicate, Shard, Partial };

  Kind kind() const { return kind_; }
  bool is_replicate() const { return kind_ == Kind::Replicate; }
  bool is_shard() const { return kind_ == Kind::Shard; }
  bool is_shard(int64_t dim) const { return kind_ == Kind::Shard && dim_ == dim; }
  bool is_partial() const { return kind_ == Kind::Partial; }
  int64_t dim() const { return dim_; }  // the shard dim as given (may be negative)
  int order() const { return order_; }  // nesting order among shards of one dim
  ReduceOp reduce_op() const { return op_; }

  // "R", "S(0)", "S(0,order=1)", "P(sum)".
  std::string to_string() const;
  bool operator==(const Placement& other) const = default;

  // The same placement with a non-negative shard dim for a tensor of `ndim` dims.
  Placement normalized(int64_t ndim) const;

 private:
  friend Placement Shard(int64_t, int);
  friend Placement Replicate();
  friend Placement Partial(ReduceOp);
  Kind kind_ = Kind::Replicate;
  int64_t dim_ = 0;
  int order_ = 0;
  ReduceOp op_ = ReduceOp::Sum;
};

Placement Shard(int64_t dim, int order = 0);
Placement Replicate();
Placement Partial(ReduceOp op = ReduceOp::Sum);

using Placements = std::vector<Placement>;

// "S(0),R"; parse_placements accepts that form with optional spaces, "P" for
// P(sum) and lower-case names. An unparseable string throws naming the position.
std::string placements_to_string(const Placements& placements);
Placements parse_placements(std::string_view text);

// ---- shard arithmetic (pure functions) ------------------------------------------------

// The chunk rule of DESIGN.md: piece `index` of `size` split into `pieces` is
// [index*c, min(size, (index+1)*c)) clamped, with c = ceil(size / pieces).
// Example: size 5, 4 pieces -> offsets 0, 2, 4, 5 and lengths 2, 2, 1, 0.
struct Range {
  int64_t offset = 0;
  int64_t length = 0;
  int64_t end() const { return offset + length; }
  bool operator==(const Range&) const = default;
};
Range chunk_range(int64_t size, int64_t pieces, int64_t index);
std::vector<int64_t> chunk_sizes(int64_t size, int64_t pieces);

// For each tensor dim, the mesh dims that shard it, outermost first (by order,
// then mesh dim). placements must be normalized.
std::vector<std::vector<int>> shard_nesting(const Placements& placements, int64_t tensor_ndim);

// The block of the global tensor held at `coordinate` of a mesh of `mesh_shape`:
// one Range per tensor dim (Partial and Replicate mesh dims do not split).
std::vector<Range> local_block(const Shape& global_shape, const Shape& mesh_shape,
                               const Placements& placements, const std::vector<int64_t>& coordinate);
Shape local_shape(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                  const std::vector<int64_t>& coordinate);

// Checks placements against a mesh and tensor rank and returns them normalized
// (non-negative shard dims). Throws std::invalid_argument naming `op` when the
// count differs from the mesh ndim, a shard dim is out of range, or Partial ops
// mix non-linear reductions (only sum and avg may appear together).
Placements validate_placements(const Placements& placements, int64_t mesh_ndim,
                               int64_t tensor_ndim, const char* op);

}  // namespace dtensor
