// Creation of DistTensors: distribute (local slicing), distribute_from (scatter from
// one rank) and the factories, each rank building only its own block.
//
// Partial placements at creation (also in dist_tensor.h): on a Partial(sum) mesh
// dim the value sits on coordinate 0 and the others hold zeros; on Partial(avg),
// Partial(max) and Partial(min) dims every coordinate holds the value (the average,
// maximum or minimum of equal values is that value). The reduction over all
// Partial dims is then the global tensor, whatever order the dims are reduced in.
#include <map>

#include "dist_tensor/dist_tensor_impl.h"
#include "dtensor/dist_tensor.h"
#include "dtensor/error.h"
#include "dtensor/random.h"
#include "mesh/mesh_index.h"
#include "util/check.h"

namespace dtensor {

namespace {

DistTensor wrap(Tensor local, const DeviceMesh& mesh, Placements normalized, Shape global) {
  auto impl = std::make_shared<DistTensor::Impl>();
  impl->local = std::move(local);
  impl->mesh = mesh;
  impl->placements = std::move(normalized);
  impl->global_shape = std::move(global);
  return DistTensor(std::move(impl));
}

void check_member(const DeviceMesh& mesh, const char* op) {
  DT_CHECK_ARG(mesh.defined() && mesh.is_member(), op, "this rank is not in mesh ", mesh.to_string(),
               "; only mesh ranks hold a DistTensor");
}

// On a rank outside the mesh: the tensor exists (shape, dtype, placements) but holds
// nothing here (dist_tensor.h).
DistTensor elsewhere(const Shape& shape, DType dtype, const DeviceMesh& mesh, Placements normalized,
                     Device device = Device::cpu()) {
  return wrap(Tensor::empty({0}, dtype, device), mesh, std::move(normalized), shape);
}

void check_shape(const Shape& shape, const char* op) {
  for (int64_t s : shape) DT_CHECK_ARG(s >= 0, op, "expected non-negative sizes, got shape ", shape);
}

// Whether the mesh coordinate holds the value under the Partial rule above (false
// means it holds zeros).
bool holds_value(const Placements& placements, const std::vector<int64_t>& coordinate) {
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].is_partial() && placements[m].reduce_op() == ReduceOp::Sum && coordinate[m] != 0) {
      return false;
    }
  }
  return true;
}

Shape lengths(const std::vector<Range>& block) {
  Shape shape(block.size());
  for (size_t d = 0; d < block.size(); ++d) shape[d] = block[d].length;
  return shape;
}

Tensor slice_block(const Tensor& full, const std::vector<Range>& block) {
  Tensor view = full;
  for (size_t d = 0; d < block.size(); ++d) {
    view = view.narrow(static_cast<int64_t>(d), block[d].offset, block[d].length);
  }
  return view;
}

}  // namespace

DistTensor distribute(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  const char* op = "distribute";
  DT_CHECK_ARG(full.defined(), op, "expected a defined tensor");
  DT_CHECK_ARG(mesh.defined(), op, "expected a defined mesh");
  Placements normalized = validate_placements(placements, mesh.ndim(), full.dim(), op);
  if (!mesh.is_member()) return elsewhere(full.shape(), full.dtype(), mesh, std::move(normalized), full.device());
  const auto block = local_block(full.shape(), mesh.shape(), normalized, mesh.coordinate());
  // A copy even where a view would do: ranks that are threads of one process often
  // pass the same `full`, and an in-place update of one rank's piece (an optimizer
  // step) must not reach another rank's.
  Tensor local = holds_value(normalized, mesh.coordinate())
                     ? slice_block(full, block).clone()
                     : Tensor::zeros(lengths(block), full.dtype(), full.device());
  return wrap(std::move(local), mesh, std::move(normalized), full.shape());
}

// ---- distribute_from -----------------------------------------------------------------------

namespace {
// The source's header, one fixed-size broadcast: dtype, ndim, device type and index,
// sizes. A negative dtype or ndim reports the source's own error so every rank fails
// together.
constexpr int64_t kMaxDims = 16;
constexpr int64_t kSizes = 4;  // where the sizes start
constexpr int64_t kHeader = kSizes + kMaxDims;
constexpr int64_t kUndefinedSource = -1;
constexpr int64_t kTooManyDims = -2;
constexpr int kDistributeTag = 0x4454;  // "DT": keeps these messages apart from user tags
}  // namespace

DistTensor distribute_from(const Tensor& full, const DeviceMesh& mesh, const Placements& placements, int64_t source) {
  const char* op = "distribute_from";
  check_member(mesh, op);
  DT_CHECK_ARG(source >= 0 && source < mesh.size(), op, "source ", source, " is not a mesh index of mesh ",
               mesh.to_string(), ": expected [0, ", mesh.size(), ")");
  DT_CHECK_ARG(static_cast<int64_t>(placements.size()) == mesh.ndim(), op, "expected ", mesh.ndim(),
               " placements (one per mesh dim), got ", placements.size(), ": '", placements_to_string(placements), "'");
  const Group& group = mesh.group();  // its rank r is mesh index r
  const bool is_source = mesh.linear_index() == source;

  Tensor header = Tensor::zeros({kHeader}, DType::I64);
  if (is_source) {
    int64_t* h = header.data<int64_t>();
    if (!full.defined()) {
      h[0] = kUndefinedSource;
    } else if (full.dim() > kMaxDims) {
      h[0] = kTooManyDims;
    } else {
      h[0] = static_cast<int64_t>(full.dtype());
      h[1] = full.dim();
      h[2] = static_cast<int64_t>(full.device().type);
      h[3] = full.device().index;
      for (int64_t d = 0; d < full.dim(); ++d) h[kSizes + d] = full.size(d);
    }
  }
  broadcast_(group, header, static_cast<int>(source));
  const int64_t* h = header.data<int64_t>();
  DT_CHECK_ARG(h[0] != kUndefinedSource, op, "the source (mesh index ", source, ") passed an undefined tensor");
  DT_CHECK_SUPPORTED(h[0] != kTooManyDims, op, "supports tensors of up to ", kMaxDims, " dims; the source's has more");
  const auto dtype = static_cast<DType>(h[0]);
  const Shape shape(h + kSizes, h + kSizes + h[1]);
  // The pieces go where the source's tensor is: the same CPU device, or a GPU (on
  // nccl each rank's own, Group::device(); ranks that are threads share the source's).
  const Device source_device{static_cast<DeviceType>(h[2]), static_cast<int>(h[3])};
  const Device device = !source_device.is_cuda()    ? source_device
                        : group.backend() == "nccl" ? group.device()
                                                    : source_device;
  Placements normalized = validate_placements(placements, mesh.ndim(), h[1], op);
  const Shape& mesh_shape = mesh.shape();

  // A rank receives a message only when its block is non-empty and holds the value;
  // the source applies the same test, so sends and receives pair up.
  auto needs_data = [&](const std::vector<int64_t>& coordinate, const std::vector<Range>& block) {
    return holds_value(normalized, coordinate) && shape_numel(lengths(block)) > 0;
  };
  const auto my_block = local_block(shape, mesh_shape, normalized, mesh.coordinate());
  if (!is_source) {
    Tensor local = Tensor::zeros(lengths(my_block), dtype, device);
    if (needs_data(mesh.coordinate(), my_block)) recv(group, local, static_cast<int>(source), kDistributeTag);
    return wrap(std::move(local), mesh, std::move(normalized), shape);
  }

  // Replicated blocks go to several ranks: copy each distinct block once.
  std::map<std::vector<std::pair<int64_t, int64_t>>, Tensor> copies;
  std::vector<P2POp> sends;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    if (r == source) continue;
    const auto coordinate = mesh_index::coordinate_of(r, mesh_shape);
    const auto block = local_block(shape, mesh_shape, normalized, coordinate);
    if (!needs_data(coordinate, block)) continue;
    std::vector<std::pair<int64_t, int64_t>> key;
    for (const Range& range : block) key.emplace_back(range.offset, range.length);
    auto [it, inserted] = copies.try_emplace(key);
    if (inserted) it->second = slice_block(full, block).contiguous().to(device);
    sends.push_back(P2POp::send(it->second, static_cast<int>(r), kDistributeTag));
  }
  batch_send_recv(group, sends);
  Tensor local = holds_value(normalized, mesh.coordinate()) ? slice_block(full, my_block).clone().to(device)
                                                            : Tensor::zeros(lengths(my_block), dtype, device);
  return wrap(std::move(local), mesh, std::move(normalized), shape);
}

// ---- factories -----------------------------------------------------------------------------

namespace {

// The local block of `shape`, built by make(block) where this coordinate holds the
// value and zeros where a Partial(sum) dim says it does not.
template <class Make>
DistTensor make_local(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, DType dtype,
                      Device device, const char* op, Make make) {
  check_shape(shape, op);
  DT_CHECK_ARG(mesh.defined(), op, "expected a defined mesh");
  Placements normalized = validate_placements(placements, mesh.ndim(), static_cast<int64_t>(shape.size()), op);
  if (!mesh.is_member()) return elsewhere(shape, dtype, mesh, std::move(normalized), device);
  const auto block = local_block(shape, mesh.shape(), normalized, mesh.coordinate());
  Tensor local =
      holds_value(normalized, mesh.coordinate()) ? make(block) : Tensor::zeros(lengths(block), dtype, device);
  return wrap(std::move(local), mesh, std::move(normalized), shape);
}

// Element (i0, ..., ik) of the block gets draw(seed, global row-major index). The
// innermost dim is a run of consecutive global indices, so the loop walks the
// outer dims with an odometer and fills each run directly.
template <float (*Draw)(uint64_t, uint64_t)>
Tensor random_block(const Shape& global_shape, const std::vector<Range>& block, uint64_t seed, DType dtype) {
  Tensor out = Tensor::empty(lengths(block), DType::F32);
  float* p = out.data<float>();
  const int64_t numel = out.numel();
  const auto ndim = static_cast<int64_t>(block.size());
  if (numel > 0 && ndim == 0) p[0] = Draw(seed, 0);
  if (numel > 0 && ndim > 0) {
    const Strides global_strides = contiguous_strides(global_shape);
    const int64_t run = block.back().length;
    std::vector<int64_t> outer(static_cast<size_t>(ndim - 1), 0);
    for (int64_t written = 0; written < numel; written += run) {
      auto base = static_cast<uint64_t>(block.back().offset);
      for (int64_t d = 0; d + 1 < ndim; ++d) {
        base += static_cast<uint64_t>((block[d].offset + outer[d]) * global_strides[d]);
      }
      for (int64_t j = 0; j < run; ++j) p[written + j] = Draw(seed, base + static_cast<uint64_t>(j));
      for (int64_t d = ndim - 2; d >= 0; --d) {
        if (++outer[d] < block[d].length) break;
        outer[d] = 0;
      }
    }
  }
  // Tensor::randn converts each float to the dtype the same way, so the values
  // match it bit for bit in every floating dtype.
  return dtype == DType::F32 ? out : out.to(dtype);
}

void check_floating(DType dtype, const char* op) {
  DT_CHECK_ARG(is_floating(dtype), op, "expected a floating dtype, got ", dtype_name(dtype));
}

}  // namespace

DistTensor empty(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, DType dtype, Device device) {
  // Coordinates off 0 on a Partial(sum) dim still get zeros (make_local): then a
  // reduction over them adds nothing to whatever the caller writes on coordinate 0.
  return make_local(shape, mesh, placements, dtype, device, "empty",
                    [&](const std::vector<Range>& b) { return Tensor::empty(lengths(b), dtype, device); });
}

DistTensor zeros(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, DType dtype, Device device) {
  return make_local(shape, mesh, placements, dtype, device, "zeros",
                    [&](const std::vector<Range>& b) { return Tensor::zeros(lengths(b), dtype, device); });
}

DistTensor ones(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, DType dtype, Device device) {
  return make_local(shape, mesh, placements, dtype, device, "ones",
                    [&](const std::vector<Range>& b) { return Tensor::ones(lengths(b), dtype, device); });
}

DistTensor full(const Shape& shape, double value, const DeviceMesh& mesh, const Placements& placements, DType dtype,
                Device device) {
  return make_local(shape, mesh, placements, dtype, device, "full",
                    [&](const std::vector<Range>& b) { return Tensor::full(lengths(b), value, dtype, device); });
}

DistTensor randn(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, uint64_t seed, DType dtype,
                 Device device) {
  check_floating(dtype, "randn");
  // Drawn on the host, so that every device gets the CPU's numbers.
  return make_local(shape, mesh, placements, dtype, device, "randn", [&](const std::vector<Range>& b) {
    return random_block<random::normal>(shape, b, seed, dtype).to(device);
  });
}

DistTensor rand(const Shape& shape, const DeviceMesh& mesh, const Placements& placements, uint64_t seed, DType dtype,
                Device device) {
  check_floating(dtype, "rand");
  // Drawn on the host, so that every device gets the CPU's numbers.
  return make_local(shape, mesh, placements, dtype, device, "rand", [&](const std::vector<Range>& b) {
    return random_block<random::uniform>(shape, b, seed, dtype).to(device);
  });
}

}  // namespace dtensor
