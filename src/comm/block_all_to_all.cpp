// all_to_all between strided pieces: the tensor-level entry, the layout of pieces
// cut along a dim, the piece copy, and the backends' default (pack, all_to_all,
// unpack).
#include "comm/block_all_to_all.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "comm/collective_args.h"
#include "util/check.h"

namespace dtensor::comm {

BlockLayout blocks_along(const Tensor& t, int64_t dim, const std::vector<int64_t>& sizes) {
  const Shape& shape = t.shape();
  BlockLayout layout;
  layout.rows = product(shape, 0, static_cast<int>(dim));
  const int64_t inner = product(shape, static_cast<int>(dim) + 1, static_cast<int>(shape.size()));
  layout.stride = shape[dim] * inner;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    layout.offsets.push_back(offset * inner);
    layout.widths.push_back(s * inner);
    offset += s;
  }
  return layout;
}

namespace {

// One piece's segments: `rows` runs of `width` elements, `stride` apart from `offset`.
struct Segments {
  int64_t offset = 0, width = 0, stride = 0, rows = 0;
};

Segments segments_of(const BlockLayout& layout, int piece) {
  return {layout.offsets[piece], layout.widths[piece], layout.stride, layout.rows};
}

// Its segments follow one another without gaps.
bool dense(const Segments& s) { return s.rows <= 1 || s.stride == s.width; }

// A dense piece seen as runs of `width` elements (which divides its count).
Segments recut(const Segments& s, int64_t width) { return {s.offset, width, width, s.rows * s.width / width}; }

}  // namespace

std::vector<PieceCopy> plan_piece_copy(const BlockLayout& to_layout, int to_piece, const BlockLayout& from_layout,
                                       int from_piece) {
  Segments from = segments_of(from_layout, from_piece), to = segments_of(to_layout, to_piece);
  const int64_t count = from.rows * from.width;
  if (count == 0) return {};
  if (dense(from) && dense(to)) return {{to.offset, count, from.offset, count, count, 1}};
  if (dense(from)) from = recut(from, to.width);
  if (dense(to)) to = recut(to, from.width);
  // Runs repeat every lcm(widths) elements (count is a common multiple of both).
  const int64_t period = std::lcm(from.width, to.width);
  const int64_t periods = count / period;
  const int64_t from_pitch = period / from.width * from.stride, to_pitch = period / to.width * to.stride;
  std::vector<PieceCopy> copies;
  int64_t from_row = 0, from_col = 0, to_row = 0, to_col = 0;
  for (int64_t left = period; left > 0;) {
    const int64_t len = std::min(from.width - from_col, to.width - to_col);
    PieceCopy c{to.offset + to_row * to.stride + to_col,
                to_pitch,
                from.offset + from_row * from.stride + from_col,
                from_pitch,
                len,
                periods};
    if (periods == 1) c.dst_pitch = c.src_pitch = len;
    copies.push_back(c);
    left -= len;
    if ((from_col += len) == from.width) from_col = 0, ++from_row;
    if ((to_col += len) == to.width) to_col = 0, ++to_row;
  }
  return copies;
}

void copy_piece(std::byte* dst, const BlockLayout& to_layout, int to_piece, const std::byte* src,
                const BlockLayout& from_layout, int from_piece, size_t element_size) {
  for (const PieceCopy& c : plan_piece_copy(to_layout, to_piece, from_layout, from_piece)) {
    const size_t bytes = static_cast<size_t>(c.width) * element_size;
    for (int64_t h = 0; h < c.height; ++h) {
      std::memcpy(dst + static_cast<size_t>(c.dst_offset + h * c.dst_pitch) * element_size,
                  src + static_cast<size_t>(c.src_offset + h * c.src_pitch) * element_size, bytes);
    }
  }
}

namespace {

// The pieces one after another, in rank order (what all_to_all() exchanges).
BlockLayout packed(const BlockLayout& layout, int n) {
  BlockLayout p;
  p.rows = 1;
  int64_t offset = 0;
  for (int s = 0; s < n; ++s) {
    p.offsets.push_back(offset);
    p.widths.push_back(layout.count(s));
    offset += layout.count(s);
  }
  p.stride = offset;
  return p;
}

bool is_packed(const BlockLayout& layout, int n) {
  if (layout.rows != 1) return layout.rows == 0;
  int64_t offset = 0;
  for (int s = 0; s < n; ++s) {
    if (layout.offsets[s] != offset) return false;
    offset += layout.widths[s];
  }
  return true;
}

// Every piece of `layout` lies inside `t`.
void check_fits(const BlockLayout& layout, const Tensor& t, const char* what) {
  DT_CHECK_ARG(layout.rows >= 0, "all_to_all", what, " layout has ", layout.rows, " rows");
  for (size_t s = 0; s < layout.widths.size(); ++s) {
    DT_CHECK_ARG(layout.widths[s] >= 0 && layout.offsets[s] >= 0, "all_to_all", what, " piece ", s, " has width ",
                 layout.widths[s], " at offset ", layout.offsets[s]);
    if (layout.count(static_cast<int>(s)) == 0) continue;
    const int64_t end = layout.offsets[s] + (layout.rows - 1) * layout.stride + layout.widths[s];
    DT_CHECK_ARG(end <= t.numel(), "all_to_all", what, " piece ", s, " ends at element ", end, ", past the ", t.numel(),
                 " elements of its tensor");
  }
}

}  // namespace

void GroupImpl::all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                                  DType dtype) {
  const int n = size();
  const size_t esize = dtype_size(dtype);
  const BlockLayout send_packed = packed(send, n), recv_packed = packed(recv, n);
  std::vector<std::byte> send_buffer, recv_buffer;
  const void* send_data = in;
  void* recv_data = out;
  if (!is_packed(send, n)) {
    send_buffer.resize(send_packed.stride * esize);
    for (int s = 0; s < n; ++s) {
      copy_piece(send_buffer.data(), send_packed, s, static_cast<const std::byte*>(in), send, s, esize);
    }
    send_data = send_buffer.data();
  }
  if (!is_packed(recv, n)) {
    recv_buffer.resize(recv_packed.stride * esize);
    recv_data = recv_buffer.data();
  }
  all_to_all(send_data, send_packed.widths, recv_data, recv_packed.widths, dtype, false, false);
  if (recv_data != out) {
    for (int s = 0; s < n; ++s) {
      copy_piece(static_cast<std::byte*>(out), recv, s, recv_buffer.data(), recv_packed, s, esize);
    }
  }
}

void all_to_all_blocks(const Group& group, const Tensor& input, const BlockLayout& send, const Tensor& output,
                       const BlockLayout& recv) {
  const char* kOp = "all_to_all";
  GroupImpl& backend = check_input_output(group, input, output, kOp);
  const int n = group.size();
  auto dense = [](const Tensor& t) { return t.is_contiguous() || t.numel() == 0; };
  DT_CHECK_ARG(dense(input) && dense(output), kOp, "block exchange needs contiguous tensors, got strides ",
               Shape(input.strides()), " and ", Shape(output.strides()));
  DT_CHECK_ARG(static_cast<int>(send.widths.size()) == n && static_cast<int>(recv.widths.size()) == n &&
                   send.offsets.size() == send.widths.size() && recv.offsets.size() == recv.widths.size(),
               kOp, "expected ", n, " pieces on each side, got ", send.widths.size(), " and ", recv.widths.size());
  check_fits(send, input, "send");
  check_fits(recv, output, "receive");
  const FlightToken record =
      begin_call(kOp, group, static_cast<int64_t>(input.nbytes()), flight_call(input, output, false));
  if (n == 1) {
    DT_CHECK_ARG(send.count(0) == recv.count(0), kOp, "a group of one sends ", send.count(0),
                 " elements to itself but expects ", recv.count(0));
  }
  if (n == 1 && input.device().is_cpu()) {
    copy_piece(static_cast<std::byte*>(output.data_ptr()), recv, 0, static_cast<const std::byte*>(input.data_ptr()),
               send, 0, dtype_size(input.dtype()));
    return;
  }
  BufferDeviceScope device(input.device());
  backend.all_to_all_blocks(input.data_ptr(), send, output.data_ptr(), recv, input.dtype());
}

}  // namespace dtensor::comm
