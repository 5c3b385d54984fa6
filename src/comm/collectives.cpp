// The public reducing and gathering collectives: all_reduce, all_gather,
// reduce_scatter, all_to_all. Each checks tensors, makes buffers contiguous,
// allocates outputs, counts the call and hands raw buffers to the backend.
#include "comm/collective_args.h"
#include "comm/reduce.h"
#include "dtensor/comm_debug.h"
#include "util/check.h"

namespace dtensor {
namespace {

using namespace comm;

// ---- implementations shared by the sync and async forms -------------------------------

Work all_reduce_impl(const Group& group, const Tensor& input, const Tensor& output, ReduceOp op,
                     bool async) {
  const char* kOp = "all_reduce";
  comm::GroupImpl& backend = check_input_output(group, input, output, kOp);
  DT_CHECK_ARG(input.shape() == output.shape(), kOp, "output shape must equal input shape ",
               input.shape(), ", got ", output.shape());
  comm::check_reduce_supported(input.dtype(), op, kOp);
  FlightToken record;
  if (record_or_finish_alone(group, kOp, input, output, async, record)) return Work();
  CallBuffers b(input, output);
  b.reuse_input_copy_for_output();
  b.stage_overlapping_input(b.out().data_ptr());
  WorkPtr w = backend.all_reduce(b.in().data_ptr(), b.out().data_ptr(), input.numel(), input.dtype(), op, async);
  return b.finish(std::move(w), async, record);
}

Work all_gather_impl(const Group& group, const Tensor& input, const Tensor& output, int64_t dim,
                     std::vector<int64_t> sizes, bool async) {
  const char* kOp = "all_gather";
  comm::GroupImpl& backend = check_input_output(group, input, output, kOp);
  const int n = group.size();
  const int d = normalize_dim(dim, std::max<int64_t>(input.dim(), 1), kOp);
  DT_CHECK_ARG(input.dim() >= 1, kOp, "expected a tensor with at least one dim, got a scalar");
  DT_CHECK_ARG(sizes.empty() || static_cast<int>(sizes.size()) == n, kOp, "expected ", n,
               " sizes (one per rank), got ", sizes.size());
  DT_CHECK_ARG(sizes.empty() || sizes[group.rank()] == input.size(d), kOp, "sizes say rank ",
               group.rank(), " has ", sizes.empty() ? 0 : sizes[group.rank()], " along dim ", d,
               ", its input has ", input.size(d));
  const int64_t total = sizes.empty() ? n * input.size(d) : sum(sizes);
  check_output_shape_with_dim(output, input.shape(), d, total, kOp);
  FlightToken record;
  if (record_or_finish_alone(group, kOp, input, output, async, record)) return Work();
  CallBuffers b(input, output);
  const int64_t inner = product(input.shape(), d + 1, static_cast<int>(input.dim()));
  const int64_t outer = product(input.shape(), 0, d);
  // In place when the input is this rank's block of the output (one block per row).
  const int64_t block = sizes.empty() ? group.rank() * input.size(d)
                                      : std::accumulate(sizes.begin(), sizes.begin() + group.rank(), int64_t{0});
  b.stage_overlapping_input(outer != 1 ? nullptr
                                       : static_cast<const std::byte*>(b.out().data_ptr()) +
                                             block * inner * static_cast<int64_t>(dtype_size(input.dtype())));
  WorkPtr w = backend.all_gather(b.in().data_ptr(), b.out().data_ptr(),
                                 backend_counts(0, sizes, n, input.size(d), inner),
                                 outer, input.dtype(), async);
  return b.finish(std::move(w), async, record);
}

Work reduce_scatter_impl(const Group& group, const Tensor& input, const Tensor& output, ReduceOp op,
                         int64_t dim, std::vector<int64_t> sizes, bool async) {
  const char* kOp = "reduce_scatter";
  comm::GroupImpl& backend = check_input_output(group, input, output, kOp);
  comm::check_reduce_supported(input.dtype(), op, kOp);
  DT_CHECK_ARG(input.dim() >= 1, kOp, "expected a tensor with at least one dim, got a scalar");
  const int n = group.size();
  const int d = normalize_dim(dim, input.dim(), kOp);
  // Without sizes: equal chunks when the dim divides (the common case, no allocation),
  // else ceil-sized chunks with the remainder last.
  const bool even = sizes.empty() && input.size(d) % n == 0;
  if (sizes.empty() && !even) sizes = chunk_sizes(input.size(d), n);
  DT_CHECK_ARG(even || (static_cast<int>(sizes.size()) == n && sum(sizes) == input.size(d)), kOp,
               "expected ", n, " sizes summing to ", input.size(d), " (input size along dim ", d,
               "), got ", Shape(sizes));
  const int64_t mine = even ? input.size(d) / n : sizes[group.rank()];
  check_output_shape_with_dim(output, input.shape(), d, mine, kOp);
  FlightToken record;
  if (record_or_finish_alone(group, kOp, input, output, async, record)) return Work();
  CallBuffers b(input, output);
  b.stage_overlapping_input(nullptr);
  const int64_t inner = product(input.shape(), d + 1, static_cast<int>(input.dim()));
  WorkPtr w = backend.reduce_scatter(b.in().data_ptr(), b.out().data_ptr(),
                                     backend_counts(0, sizes, n, input.size(d) / n, inner),
                                     product(input.shape(), 0, d), input.dtype(), op, async);
  return b.finish(std::move(w), async, record);
}

// Checks all_to_all split sizes against dim 0 (`total`); empty means equal splits.
void check_splits(const std::vector<int64_t>& splits, int64_t total, int n, const char* what,
                  const Tensor& t) {
  if (splits.empty()) {
    DT_CHECK_ARG(total % n == 0, "all_to_all", "without ", what, " split sizes, dim 0 (", total,
                 ") must divide by the group size ", n);
    return;
  }
  DT_CHECK_ARG(static_cast<int>(splits.size()) == n, "all_to_all", "expected ", n, " ", what,
               " split sizes, got ", Shape(splits));
  DT_CHECK_ARG(sum(splits) == total, "all_to_all", "split sizes must sum to dim 0: ", what, " ",
               t.shape(), " with ", Shape(splits));
}

Work all_to_all_impl(const Group& group, const Tensor& input, const Tensor& output,
                     const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits,
                     bool async) {
  const char* kOp = "all_to_all";
  comm::GroupImpl& backend = check_input_output(group, input, output, kOp);
  DT_CHECK_ARG(input.dim() >= 1 && output.dim() == input.dim(), kOp,
               "expected input and output with the same number (>= 1) of dims, got ",
               input.shape(), " and ", output.shape());
  const int n = group.size();
  check_splits(in_splits, input.size(0), n, "input", input);
  check_splits(out_splits, output.size(0), n, "output", output);
  DT_CHECK_ARG(std::equal(input.shape().begin() + 1, input.shape().end(), output.shape().begin() + 1,
                          output.shape().end()),
               kOp, "input and output must agree after dim 0, got ", input.shape(), " and ",
               output.shape());
  FlightToken record;
  if (record_or_finish_alone(group, kOp, input, output, async, record)) return Work();
  CallBuffers b(input, output);
  b.stage_overlapping_input(nullptr);
  const int64_t inner = product(input.shape(), 1, static_cast<int>(input.dim()));
  // Neither split given: equal splits, and (the documented contract) no split sizes
  // on any rank, so backends may use their equal-split routine.
  const bool equal_splits = in_splits.empty() && out_splits.empty();
  WorkPtr w = backend.all_to_all(b.in().data_ptr(), backend_counts(0, in_splits, n, input.size(0) / n, inner),
                                 b.out().data_ptr(), backend_counts(1, out_splits, n, output.size(0) / n, inner),
                                 input.dtype(), equal_splits, async);
  return b.finish(std::move(w), async, record);
}

}  // namespace

// ---- public API ------------------------------------------------------------------------

Tensor all_reduce(const Group& group, const Tensor& input, ReduceOp op) {
  if (group.defined() && group.size() == 1) {
    all_reduce_impl(group, input, input, op, false);  // checks and counts the call
    return input;
  }
  DT_CHECK_ARG(input.defined(), "all_reduce", "expected a defined input tensor, got an undefined one");
  Tensor output = Tensor::empty(input.shape(), input.dtype(), input.device());
  all_reduce_impl(group, input, output, op, false);
  return output;
}

void all_reduce_(const Group& group, const Tensor& tensor, ReduceOp op) {
  all_reduce_impl(group, tensor, tensor, op, false);
}

Work all_reduce_async(const Group& group, const Tensor& input, const Tensor& output, ReduceOp op) {
  return all_reduce_impl(group, input, output, op, true);
}

void all_reduce_into(const Group& group, const Tensor& input, const Tensor& output, ReduceOp op) {
  all_reduce_impl(group, input, output, op, false);
}

void all_gather_into(const Group& group, const Tensor& input, const Tensor& output, int64_t dim,
                     const std::vector<int64_t>& sizes) {
  all_gather_impl(group, input, output, dim, sizes, false);
}

void reduce_scatter_into(const Group& group, const Tensor& input, const Tensor& output, ReduceOp op,
                         int64_t dim, const std::vector<int64_t>& sizes) {
  reduce_scatter_impl(group, input, output, op, dim, sizes, false);
}

void all_to_all_into(const Group& group, const Tensor& input, const Tensor& output,
                     const std::vector<int64_t>& output_split_sizes,
                     const std::vector<int64_t>& input_split_sizes) {
  all_to_all_impl(group, input, output, output_split_sizes, input_split_sizes, false);
}

Tensor all_gather(const Group& group, const Tensor& input, int64_t dim,
                  const std::vector<int64_t>& sizes) {
  DT_CHECK_ARG(input.defined() && input.dim() >= 1, "all_gather",
               "expected a defined tensor with at least one dim");
  const int d = normalize_dim(dim, input.dim(), "all_gather");
  if (backend_of(group, "all_gather").size() == 1) {
    all_gather_impl(group, input, input, d, sizes, false);
    return input;
  }
  std::vector<int64_t> all = sizes.empty() ? exchange_sizes(group, "all_gather", input, d) : sizes;
  DT_CHECK_ARG(static_cast<int>(all.size()) == group.size(), "all_gather", "expected ",
               group.size(), " sizes (one per rank), got ", all.size());
  Tensor output = Tensor::empty(with_dim(input.shape(), d, sum(all)), input.dtype(), input.device());
  all_gather_impl(group, input, output, d, all, false);
  return output;
}

std::vector<Tensor> all_gather_list(const Group& group, const Tensor& input) {
  const char* kOp = "all_gather";
  comm::GroupImpl& backend = backend_of(group, kOp);
  check_tensor(group, input, kOp, "input");
  const int n = group.size();
  if (n == 1) {
    (void)begin_call(kOp, group, static_cast<int64_t>(input.nbytes()));
    return {input};
  }
  // Shapes first (a fixed record per rank: ndim then up to 8 dims), then the data.
  constexpr int kMaxDims = 8;
  DT_CHECK_SUPPORTED(input.dim() <= kMaxDims, kOp, "list form supports up to ", kMaxDims,
                     " dims, got ", input.shape());
  std::vector<int64_t> record(kMaxDims + 1, 0), records(static_cast<size_t>(n) * (kMaxDims + 1));
  record[0] = input.dim();
  std::copy(input.shape().begin(), input.shape().end(), record.begin() + 1);
  {
    InternalCallScope scope(kOp, "shape exchange");
    backend.all_gather(record.data(), records.data(), std::vector<int64_t>(n, kMaxDims + 1), 1,
                       DType::I64, false);
  }
  std::vector<Shape> shapes(n);
  std::vector<int64_t> counts(n);
  for (int r = 0; r < n; ++r) {
    const int64_t* rec = records.data() + r * (kMaxDims + 1);
    shapes[r] = Shape(rec + 1, rec + 1 + rec[0]);
    counts[r] = shape_numel(shapes[r]);
  }
  Tensor flat = Tensor::empty({sum(counts)}, input.dtype(), input.device());
  const FlightToken flight =
      begin_call(kOp, group, static_cast<int64_t>(input.nbytes()), flight_call(input, flat, false));
  Tensor in = input.contiguous();
  {
    BufferDeviceScope device(input.device());
    backend.all_gather(in.data_ptr(), flat.data_ptr(), counts, 1, input.dtype(), false);
  }
  std::vector<Tensor> result;
  int64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    result.push_back(flat.narrow(0, offset, counts[r]).view(shapes[r]));
    offset += counts[r];
  }
  return result;
}

Work all_gather_async(const Group& group, const Tensor& input, const Tensor& output, int64_t dim,
                      const std::vector<int64_t>& sizes) {
  return all_gather_impl(group, input, output, dim, sizes, true);
}

Tensor reduce_scatter(const Group& group, const Tensor& input, ReduceOp op, int64_t dim,
                      const std::vector<int64_t>& sizes) {
  DT_CHECK_ARG(input.defined() && input.dim() >= 1, "reduce_scatter",
               "expected a defined tensor with at least one dim");
  const int n = backend_of(group, "reduce_scatter").size();
  const int d = normalize_dim(dim, input.dim(), "reduce_scatter");
  if (n == 1) {
    reduce_scatter_impl(group, input, input, op, d, sizes, false);
    return input;
  }
  const std::vector<int64_t> pieces = sizes.empty() ? chunk_sizes(input.size(d), n) : sizes;
  DT_CHECK_ARG(static_cast<int>(pieces.size()) == n, "reduce_scatter", "expected ", n,
               " sizes (one per rank), got ", pieces.size());
  Tensor output = Tensor::empty(with_dim(input.shape(), d, pieces[group.rank()]), input.dtype(), input.device());
  reduce_scatter_impl(group, input, output, op, d, pieces, false);
  return output;
}

Work reduce_scatter_async(const Group& group, const Tensor& input, const Tensor& output, ReduceOp op,
                          int64_t dim, const std::vector<int64_t>& sizes) {
  return reduce_scatter_impl(group, input, output, op, dim, sizes, true);
}

Tensor all_to_all(const Group& group, const Tensor& input, const std::vector<int64_t>& output_split_sizes,
                  const std::vector<int64_t>& input_split_sizes) {
  DT_CHECK_ARG(input.defined() && input.dim() >= 1, "all_to_all",
               "expected a defined tensor with at least one dim");
  const int n = backend_of(group, "all_to_all").size();
  if (n == 1) {
    all_to_all_impl(group, input, input, output_split_sizes, input_split_sizes, false);
    return input;
  }
  std::vector<int64_t> recv = output_split_sizes;
  if (recv.empty() && !input_split_sizes.empty()) {
    // Unequal inputs, unknown outputs: every rank tells each peer what it will send,
    // with its dtype and row size, which must agree for the rows to fit.
    DT_CHECK_ARG(static_cast<int>(input_split_sizes.size()) == n, "all_to_all", "expected ", n,
                 " input split sizes, got ", Shape(input_split_sizes));
    constexpr int kFields = 3;
    const int64_t row = product(input.shape(), 1, static_cast<int>(input.dim()));
    std::vector<int64_t> told(static_cast<size_t>(n) * kFields), heard(static_cast<size_t>(n) * kFields);
    for (int s = 0; s < n; ++s) {
      told[s * kFields] = input_split_sizes[s];
      told[s * kFields + 1] = static_cast<int64_t>(input.dtype());
      told[s * kFields + 2] = row;
    }
    const std::vector<int64_t> fields(n, kFields);
    {
      InternalCallScope scope("all_to_all", "split size exchange");
      group.impl()->all_to_all(told.data(), fields, heard.data(), fields, DType::I64, true, false);
    }
    recv.assign(n, 0);
    for (int s = 0; s < n; ++s) {
      const int64_t* f = heard.data() + s * kFields;
      DT_CHECK_ARG(f[1] == told[1] && f[2] == row, "all_to_all", "rank ", s, " sends ",
                   dtype_name(static_cast<DType>(f[1])), " rows of ", f[2], " elements, this rank (", group.rank(),
                   ") ", dtype_name(input.dtype()), " rows of ", row);
      recv[s] = f[0];
    }
  }
  const int64_t rows = recv.empty() ? input.size(0) : sum(recv);
  Tensor output = Tensor::empty(with_dim(input.shape(), 0, rows), input.dtype(), input.device());
  all_to_all_impl(group, input, output, recv, input_split_sizes, false);
  return output;
}

Work all_to_all_async(const Group& group, const Tensor& input, const Tensor& output,
                      const std::vector<int64_t>& output_split_sizes,
                      const std::vector<int64_t>& input_split_sizes) {
  return all_to_all_impl(group, input, output, output_split_sizes, input_split_sizes, true);
}

}  // namespace dtensor
