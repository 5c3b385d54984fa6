// The flat buffer layout of FSDP groups and DDP buckets, and its copies.
#include "parallel/flat_layout.h"

#include "dtensor/tensor_ops.h"
#include "util/check.h"

namespace dtensor::parallel::detail {

namespace {

// The pieces of one parameter in both layouts: the ranks whose shard is a whole chunk
// ([f, chunk] in each), and the one short shard after them (may be empty).
struct Pieces {
  Tensor whole_slots, whole_flat;
  Tensor short_slot, short_flat;
};

Pieces pieces(const FlatSlot& s, int64_t ranks, const Tensor& slots /*[N, slot]*/, const Tensor& flat /*[numel]*/) {
  Pieces p;
  if (s.numel() == 0) return p;
  const int64_t whole = std::min(ranks, s.rows / s.chunk_rows);
  const int64_t rest = s.rows - whole * s.chunk_rows;
  if (whole > 0) {
    p.whole_slots = slots.narrow(0, 0, whole);
    p.whole_flat = flat.narrow(0, 0, whole * s.slot_numel()).view({whole, s.slot_numel()});
  }
  if (rest > 0) {
    p.short_slot = slots.select(0, whole).narrow(0, 0, rest * s.row_numel);
    p.short_flat = flat.narrow(0, whole * s.slot_numel(), rest * s.row_numel);
  }
  return p;
}

void copy_or_add(Tensor dst, const Tensor& src, bool accumulate) {
  if (!dst.defined()) return;
  if (accumulate) {
    dst.copy_(add(dst, src));
  } else {
    dst.copy_(src);
  }
}

}  // namespace

FlatLayout::FlatLayout(const std::vector<Shape>& unsharded_shapes, int64_t ranks, int64_t rank)
    : ranks_(ranks), rank_(rank), shapes_(unsharded_shapes) {
  DT_CHECK_ARG(ranks >= 1 && rank >= 0 && rank < ranks, "fully_shard", "rank ", rank, " of ", ranks);
  for (const Shape& shape : shapes_) {
    DT_CHECK_ARG(!shape.empty() || ranks == 1, "fully_shard", "cannot shard a 0-d parameter along dim 0");
    FlatSlot s;
    s.rows = shape.empty() ? 1 : shape[0];
    s.row_numel = shape.empty() ? 1 : shape_numel(Shape(shape.begin() + 1, shape.end()));
    s.chunk_rows = (s.rows + ranks - 1) / ranks;
    s.slot_offset = region_numel_;
    s.unsharded_offset = unsharded_numel_;
    region_numel_ += s.slot_numel();
    unsharded_numel_ += s.numel();
    slots_.push_back(s);
  }
}

Shape FlatLayout::shard_shape(size_t i) const {
  Shape shape = shapes_[i];
  if (shape.empty()) return shape;  // one rank: the whole 0-d tensor
  shape[0] = chunk_range(shape[0], ranks_, rank_).length;
  return shape;
}

Tensor FlatLayout::shard_view(const Tensor& region, size_t i) const {
  const FlatSlot& s = slots_[i];
  const Shape shape = shard_shape(i);
  return region.narrow(0, s.slot_offset, shape_numel(shape)).view(shape);
}

Tensor FlatLayout::unsharded_view(const Tensor& unsharded, size_t i) const {
  const FlatSlot& s = slots_[i];
  return unsharded.narrow(0, s.unsharded_offset, s.numel()).view(shapes_[i]);
}

Tensor FlatLayout::slots_of(const Tensor& rank_major, size_t i) const {
  const FlatSlot& s = slots_[i];
  return rank_major.view({ranks_, region_numel_}).narrow(1, s.slot_offset, s.slot_numel());
}

void FlatLayout::scatter_into_region(const std::vector<Tensor>& unsharded, const Tensor& region) const {
  Tensor(region).fill_(0);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Range rows = chunk_range(slots_[i].rows, ranks_, rank_);
    shard_view(region, i).copy_(unsharded[i].narrow(0, rows.offset, rows.length));
  }
}

void FlatLayout::unpack(const Tensor& rank_major, const Tensor& unsharded) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const FlatSlot& s = slots_[i];
    const Pieces p = pieces(s, ranks_, slots_of(rank_major, i), unsharded.narrow(0, s.unsharded_offset, s.numel()));
    copy_or_add(p.whole_flat, p.whole_slots, false);
    copy_or_add(p.short_flat, p.short_slot, false);
  }
}

void FlatLayout::pack(size_t i, const Tensor& grad, const Tensor& rank_major, bool accumulate) const {
  const FlatSlot& s = slots_[i];
  DT_CHECK_ARG(grad.shape() == shapes_[i], "fully_shard", "gradient of shape ", grad.shape(), ", expected ",
               shapes_[i]);
  const Pieces p = pieces(s, ranks_, slots_of(rank_major, i), grad.reshape({s.numel()}));
  copy_or_add(p.whole_slots, p.whole_flat, accumulate);
  copy_or_add(p.short_slot, p.short_flat, accumulate);
}

void FlatLayout::zero_slots(size_t i, const Tensor& rank_major) const { slots_of(rank_major, i).fill_(0); }

void FlatLayout::zero_padding(const Tensor& rank_major) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const FlatSlot& s = slots_[i];
    const Tensor slots = slots_of(rank_major, i);
    for (int64_t r = 0; r < ranks_; ++r) {
      const int64_t used = chunk_range(s.rows, ranks_, r).length * s.row_numel;
      if (used < s.slot_numel()) slots.select(0, r).narrow(0, used, s.slot_numel() - used).fill_(0);
    }
  }
}

}  // namespace dtensor::parallel::detail
