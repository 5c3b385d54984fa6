// libFuzzer target: the redistribution planner and its replay. The input picks a
// mesh (1-3 dims, at most 8 ranks), a tensor shape (1-3 dims of 0-9), a source and
// a target layout (Replicate, Partial sum/max, Shard of any dim with a nesting
// order). On thread ranks, redistributing a tensor built from a full reference must
// give the reference back (exactly: the values are small integers), locally shaped
// as the layout says, with the communication explain_redistribute promised; the
// async path must agree. Layouts the library rejects must fail with
// std::invalid_argument on every rank.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>

#include "dtensor/dtensor.h"

using namespace dtensor;

namespace {

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  int next(int bound) { return pos_ < size_ ? data_[pos_++] % bound : 0; }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

Placement pick(Bytes& in, int64_t tensor_ndim) {
  switch (in.next(4)) {
    case 0: return Replicate();
    case 1: return Partial(in.next(2) == 0 ? ReduceOp::Sum : ReduceOp::Max);
    default: return Shard(in.next(static_cast<int>(tensor_ndim)), in.next(2));
  }
}

// A DistTensor of `full` with genuinely partial values on Partial dims: for sum,
// coordinate 0 holds value - (n - 1) and the others 1; for max, coordinate c holds
// value - c (exact in F32 for these small integers).
DistTensor make_input(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  Placements replicated = placements;
  for (Placement& p : replicated) {
    if (p.is_partial()) p = Replicate();
  }
  Tensor local = distribute(full, mesh, replicated).to_local().clone();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_partial()) continue;
    const int64_t c = mesh.coordinate(static_cast<int>(i)), n = mesh.size(static_cast<int>(i));
    if (placements[i].reduce_op() == ReduceOp::Max) {
      local = sub(local, static_cast<double>(c));
    } else {
      local = c == 0 ? sub(local, static_cast<double>(n - 1)) : Tensor::ones(local.shape());
    }
  }
  return DistTensor::from_local(local.contiguous(), mesh, placements, full.shape());
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
}

[[noreturn]] void fail(const std::string& what, const Placements& from, const Placements& to, const Shape& shape,
                       const DeviceMesh& mesh) {
  std::fprintf(stderr, "%s: %s -> %s, shape %s, mesh %s\n", what.c_str(), placements_to_string(from).c_str(),
               placements_to_string(to).c_str(), shape_to_string(shape).c_str(), mesh.to_string().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  Shape mesh_shape;
  int64_t ranks = 1;
  const int mesh_ndim = 1 + in.next(3);
  for (int d = 0; d < mesh_ndim; ++d) {
    const int64_t s = 1 + in.next(ranks >= 4 ? 2 : 4);  // at most 8 ranks
    mesh_shape.push_back(s);
    ranks *= s;
  }
  if (ranks > 8) return 0;
  Shape shape;
  const int tensor_ndim = 1 + in.next(3);
  for (int d = 0; d < tensor_ndim; ++d) shape.push_back(in.next(10));
  Placements from, to;
  for (int d = 0; d < mesh_ndim; ++d) from.push_back(pick(in, tensor_ndim));
  for (int d = 0; d < mesh_ndim; ++d) to.push_back(pick(in, tensor_ndim));
  const Tensor full = Tensor::arange(0, static_cast<double>(shape_numel(shape)), 1).view(shape);

  try {
    launch(static_cast<int>(ranks), [&](Group world) {
      const DeviceMesh mesh(world, mesh_shape);
      const DistTensor source = make_input(full, mesh, from);
      const RedistributePlan plan = explain_redistribute(from, to, shape, mesh);
      std::map<std::string, int64_t> promised;
      for (const RedistributeStep& step : plan.steps) {
        if (!step.collective.empty()) promised[step.collective] += step.collective_calls;
      }
      DistTensor result;
      {
        CommDebugMode comm;
        result = source.redistribute(to);
        for (const char* kind : {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "send"}) {
          if (comm.count(kind) != promised[kind]) fail(std::string("unpromised ") + kind, from, to, shape, mesh);
        }
      }
      const Placements target = validate_placements(to, mesh.ndim(), full.dim(), "fuzz");
      if (result.to_local().shape() != local_shape(shape, mesh.shape(), target, mesh.coordinate())) {
        fail("local shape", from, to, shape, mesh);
      }
      if (!same(result.full_tensor(), full)) fail("values", from, to, shape, mesh);
      if (!same(source.redistribute_async(to).wait().to_local(), result.to_local())) {
        fail("async values", from, to, shape, mesh);
      }
    });
  } catch (const std::invalid_argument&) {
    // A layout the library rejects (mixed non-linear Partials, a bad order, ...).
  }
  return 0;
}
