// The public rooted collectives (broadcast, gather, scatter) and barrier.
#include "comm/collective_args.h"
#include "comm/reduce.h"
#include "dtensor/comm_debug.h"
#include "util/check.h"

namespace dtensor {
namespace {

using namespace comm;

Work broadcast_impl(const Group& group, const Tensor& tensor, int root, bool async) {
  const char* kOp = "broadcast";
  comm::GroupImpl& backend = backend_of(group, kOp);
  check_tensor(group, tensor, kOp, "broadcast");
  check_root(group, root, kOp);
  FlightToken record =
      begin_call(kOp, group, static_cast<int64_t>(tensor.nbytes()), flight_call(tensor, tensor, async, root));
  if (group.size() == 1) return Work();
  Output out = writable(tensor);
  if (out.needs_copy()) out.buffer = tensor.contiguous();
  BufferDeviceScope device(tensor.device());
  WorkPtr w = backend.broadcast(out.buffer.data_ptr(), tensor.numel(), tensor.dtype(), root, async);
  if (group.rank() == root) out.user = Tensor();  // nothing to copy back on the root
  return finish(std::move(w), {out.buffer}, out, async, record);
}

// Elements per row of dim 0 (shape without dim 0).
int64_t row_elements(const Tensor& t, const char* op) {
  DT_CHECK_ARG(t.dim() >= 1, op, "expected a tensor with at least one dim, got a scalar");
  return shape_numel(Shape(t.shape().begin() + 1, t.shape().end()));
}

Work gather_impl(const Group& group, const Tensor& input, const Tensor& output, int root,
                 const std::vector<int64_t>& sizes, bool async) {
  const char* kOp = "gather";
  comm::GroupImpl& backend = backend_of(group, kOp);
  check_tensor(group, input, kOp, "input");
  check_root(group, root, kOp);
  const int n = group.size();
  DT_CHECK_ARG(static_cast<int>(sizes.size()) == n && sizes[group.rank()] == input.size(0), kOp,
               "expected ", n, " sizes with this rank's = ", input.size(0), ", got ", Shape(sizes));
  const bool is_root = group.rank() == root;
  if (is_root) {
    check_tensor(group, output, kOp, "output");
    check_same_dtype(input, output, kOp);
    check_same_device(input, output, kOp, "input", "output");
    const Shape expected = with_dim(input.shape(), 0, sum(sizes));
    check_output_shape(output, expected, kOp);
  }
  FlightToken record;
  if (record_or_finish_alone(group, kOp, input, output, async, record, root)) return Work();
  Tensor in = input.contiguous();
  Output out = is_root ? writable(output) : Output{};
  // The root copies every rank's input into its output: its own must not be in the way.
  if (is_root && memory_overlaps(in, out.buffer)) in = input.clone();
  BufferDeviceScope device(input.device());
  WorkPtr w = backend.gather(in.data_ptr(), is_root ? out.buffer.data_ptr() : nullptr,
                             backend_counts(0, sizes, n, 0, row_elements(input, kOp)), in.dtype(), root, async);
  return finish(std::move(w), {in, out.buffer}, out, async, record);
}

Work scatter_impl(const Group& group, const Tensor& input, const Tensor& output, int root,
                  const std::vector<int64_t>& sizes, bool async) {
  const char* kOp = "scatter";
  comm::GroupImpl& backend = backend_of(group, kOp);
  check_tensor(group, output, kOp, "output");
  check_root(group, root, kOp);
  const int n = group.size();
  DT_CHECK_ARG(static_cast<int>(sizes.size()) == n && sizes[group.rank()] == output.size(0), kOp,
               "expected ", n, " sizes with this rank's = ", output.size(0), ", got ", Shape(sizes));
  const bool is_root = group.rank() == root;
  Tensor in;
  if (is_root) {
    check_tensor(group, input, kOp, "input");
    check_same_dtype(input, output, kOp);
    check_same_device(input, output, kOp, "input", "output");
    const Shape expected = with_dim(output.shape(), 0, sum(sizes));
    DT_CHECK_ARG(input.shape() == expected, kOp, "root's input shape must be ", expected, ", got ",
                 input.shape());
    in = input.contiguous();
  }
  FlightToken record =
      begin_call(kOp, group, is_root ? static_cast<int64_t>(input.nbytes()) : 0, flight_call(in, output, async, root));
  if (n == 1) {
    copy_into(output, input);
    return Work();
  }
  Output out = writable(output);
  // Every rank reads the root's input while the root writes its output.
  if (is_root && memory_overlaps(in, out.buffer)) in = input.clone();
  BufferDeviceScope device(output.device());
  WorkPtr w = backend.scatter(is_root ? in.data_ptr() : nullptr, out.buffer.data_ptr(),
                              backend_counts(0, sizes, n, 0, row_elements(output, kOp)), output.dtype(), root, async);
  return finish(std::move(w), {in, out.buffer}, out, async, record);
}

Work barrier_impl(const Group& group, bool async) {
  comm::GroupImpl& backend = backend_of(group, "barrier");
  FlightToken record = begin_call("barrier", group, 0, {.dtype = DType::I32, .async = async});
  if (backend.size() == 1) return Work();
  return finish(backend.barrier(async), {}, Output{}, async, record);
}

}  // namespace

// ---- public API ------------------------------------------------------------------------

void broadcast_(const Group& group, const Tensor& tensor, int root) {
  broadcast_impl(group, tensor, root, false);
}

Tensor broadcast(const Group& group, const Tensor& input, int root) {
  if (backend_of(group, "broadcast").size() == 1) {
    broadcast_impl(group, input, root, false);
    return input;
  }
  Tensor output = input.clone();
  broadcast_impl(group, output, root, false);
  return output;
}

Work broadcast_async(const Group& group, const Tensor& tensor, int root) {
  return broadcast_impl(group, tensor, root, true);
}

Tensor gather(const Group& group, const Tensor& input, int root) {
  const char* kOp = "gather";
  backend_of(group, kOp);
  check_tensor(group, input, kOp, "input");
  row_elements(input, kOp);
  check_root(group, root, kOp);
  if (group.size() == 1) {
    gather_impl(group, input, input, root, {input.size(0)}, false);
    return input;
  }
  const std::vector<int64_t> sizes = exchange_sizes(group, kOp, input, 0);
  Tensor output;
  if (group.rank() == root)
    output = Tensor::empty(with_dim(input.shape(), 0, sum(sizes)), input.dtype(), input.device());
  gather_impl(group, input, output, root, sizes, false);
  return output;
}

void scatter(const Group& group, const Tensor& input, const Tensor& output, int root) {
  const char* kOp = "scatter";
  backend_of(group, kOp);
  check_tensor(group, output, kOp, "output");
  row_elements(output, kOp);
  const std::vector<int64_t> sizes =
      group.size() == 1 ? std::vector<int64_t>{output.size(0)} : exchange_sizes(group, kOp, output, 0);
  scatter_impl(group, input, output, root, sizes, false);
}

Work gather_async(const Group& group, const Tensor& input, const Tensor& output, int root,
                  const std::vector<int64_t>& sizes) {
  return gather_impl(group, input, output, root, sizes, true);
}

Work scatter_async(const Group& group, const Tensor& input, const Tensor& output, int root,
                   const std::vector<int64_t>& sizes) {
  return scatter_impl(group, input, output, root, sizes, true);
}

void barrier(const Group& group) { barrier_impl(group, false); }

Work barrier_async(const Group& group) { return barrier_impl(group, true); }

}  // namespace dtensor
