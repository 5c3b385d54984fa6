// DistTensor: a local tensor + a DeviceMesh + one placement per mesh dim, standing
// for one global tensor.
//
//   DistTensor d = distribute(full, mesh, {Shard(0), Replicate()});
//   DistTensor r = d.redistribute({Replicate(), Shard(1)});
//   Tensor back = r.full_tensor();                   // equals full
//
// Uneven shards follow the chunk rule (placement.h); local tensors are never padded.
// Everything that communicates is collective over the mesh: every rank of the mesh
// calls it with the same arguments.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/placement.h"
#include "dtensor/redistribute.h"
#include "dtensor/tensor.h"

namespace dtensor {

struct FromLocalOptions {
  // Verify with one all-gather of a small record per rank (a hash of the bytes, the
  // dtype and the shape) that ranks which differ only along Replicate mesh dims
  // hold bitwise equal pieces, and that pieces along Partial dims have one shape.
  // A violation fails on every rank with the same message naming the ranks.
  bool run_check = false;
};

class DistTensor {
 public:
  DistTensor() = default;

  // Wraps this rank's piece. Without `global_shape` the shape is inferred with one
  // all-gather of the local sizes (never by assuming even shards); with it, the
  // local shape is checked against the chunk rule.
  static DistTensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                               const std::optional<Shape>& global_shape = std::nullopt, FromLocalOptions options = {});

  // ---- the local boundary, with autograd ------------------------------------------
  // This rank's piece as a tensor of its own: a DistTensor on local_mesh() whose
  // global shape is the local shape (ops on it never communicate). Recorded: its
  // gradient comes back as this tensor's gradient, this rank's piece of it under
  // `grad_placements` (default: this tensor's placements, as PyTorch's
  // to_local(grad_placements) does).
  DistTensor as_local(const std::optional<Placements>& grad_placements = std::nullopt) const;
  // The reverse: `local` (a DistTensor on local_mesh(), e.g. computed from
  // as_local() pieces) as this rank's piece on `mesh`. Recorded: the gradient is
  // moved to `placements` (Partial as Replicate) and its local piece flows back.
  static DistTensor from_local(const DistTensor& local, const DeviceMesh& mesh, const Placements& placements,
                               const std::optional<Shape>& global_shape = std::nullopt, FromLocalOptions options = {});

  bool defined() const { return impl_ != nullptr; }
  const Tensor& to_local() const;
  // The global tensor on every rank (collective).
  Tensor full_tensor() const;

  // The same global tensor in another layout, with the cheapest planned path
  // (see explain_redistribute). Collective.
  DistTensor redistribute(const Placements& placements) const;
  DistTensor redistribute(const DeviceMesh& mesh, const Placements& placements) const;
  // Starts the redistribution and returns at once; the first communication step is
  // in flight when it returns, later steps of a multi-step plan run in wait().
  PendingRedistribute redistribute_async(const Placements& placements) const;

  const Shape& shape() const;  // global
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t dim) const;
  int64_t numel() const { return shape_numel(shape()); }
  DType dtype() const;
  Device device() const;
  const DeviceMesh& mesh() const;
  const Placements& placements() const;
  // "DistTensor(shape=[7, 5], dtype=f32, mesh=dp=2,tp=2, placements=S(0),R, local=[4, 5])"
  std::string to_string() const;

  // ---- autograd (autograd.h) --------------------------------------------------------
  bool requires_grad() const;
  // Marks a leaf as a parameter whose gradient accumulates into grad(). Returns *this.
  DistTensor& set_requires_grad(bool enabled = true);
  bool is_leaf() const;     // not produced by a recorded op
  DistTensor grad() const;  // undefined until a backward reaches this leaf
  void set_grad(const DistTensor& grad) const;
  void zero_grad() const;  // drops the gradient
  // The same data without history (and not requiring grad).
  DistTensor detach() const;
  // Name of the recorded op that produced this tensor ("" for leaves).
  std::string grad_fn_name() const;
  void backward(const DistTensor& grad = {}, bool retain_graph = false) const;

  // ---- fluent forms of ops.h ---------------------------------------------------------
  DistTensor matmul(const DistTensor& other) const;
  DistTensor relu() const;
  DistTensor gelu() const;
  DistTensor silu() const;
  DistTensor exp() const;
  DistTensor log() const;
  DistTensor tanh() const;
  DistTensor sigmoid() const;
  DistTensor softmax(int64_t dim) const;
  DistTensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  DistTensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  DistTensor transpose(int64_t dim0, int64_t dim1) const;
  DistTensor t() const { return transpose(0, 1); }
  DistTensor reshape(const Shape& shape) const;
  DistTensor to(DType dtype) const;
  // The same values on another device (the mesh and placements unchanged; self if
  // already there). Differentiable: the gradient is copied back to this device.
  DistTensor to(Device device) const;

  // The shared state behind the handle and its autograd record
  // (src/dist_tensor/dist_tensor_impl.h; internal).
  struct Impl;
  struct AutogradMeta;
  explicit DistTensor(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// Partial placements at creation (distribute, distribute_from, the factories): on a
// Partial(sum) mesh dim coordinate 0 holds the value and the other coordinates hold
// zeros; on Partial(avg), Partial(max) and Partial(min) dims every coordinate holds
// the value (the mean, max or min of equal values is that value). This is also what
// redistribute does for Replicate -> Partial.

// Every rank holds `full`; each keeps a copy of its piece (no communication; a copy
// so that ranks sharing one `full` never alias each other's pieces).
DistTensor distribute(const Tensor& full, const DeviceMesh& mesh, const Placements& placements);
// Only the mesh rank at `source` (a row-major mesh index) needs `full`; the pieces
// are sent from it. Other ranks may pass any tensor, even an undefined one: shape,
// dtype and device come from the source (one broadcast, then one message per rank
// that holds a non-empty, non-zero piece); a GPU source gives each rank a piece on
// its own GPU under nccl (Group::device()), on the source's GPU otherwise.
DistTensor distribute_from(const Tensor& full, const DeviceMesh& mesh, const Placements& placements, int64_t source);

// Factories on a mesh. Each rank creates only its piece, on `device`; randn/rand give
// the same global tensor for every mesh, placement and device (element i uses Philox
// index i, so they equal Tensor::randn/rand(shape, seed)). Partial placements follow
// the rule above.
DistTensor empty(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, DType dtype = DType::F32,
                 Device device = Device::cpu());
DistTensor zeros(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, DType dtype = DType::F32,
                 Device device = Device::cpu());
DistTensor ones(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, DType dtype = DType::F32,
                Device device = Device::cpu());
DistTensor full(const Shape& shape, double value, const DeviceMesh& mesh, const Placements& placements,
                DType dtype = DType::F32, Device device = Device::cpu());
DistTensor randn(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, uint64_t seed,
                 DType dtype = DType::F32, Device device = Device::cpu());
DistTensor rand(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, uint64_t seed,
                DType dtype = DType::F32, Device device = Device::cpu());

// A text picture of which rank holds which block of the global tensor (1-D, 2-D
// and 3-D meshes; uneven shards show their sizes). Needs no communication.
std::string visualize_sharding(const DistTensor& t);
std::string visualize_sharding(const Shape& shape, const DeviceMesh& mesh, const Placements& placements);

}  // namespace dtensor
