// The MPI backend's collectives: each one the matching MPI call, blocking for sync
// calls and the non-blocking MPI_I* form for async ones (see mpi_group.h).
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "comm/mpi/mpi_group.h"
#include "comm/mpi/mpi_types.h"
#include "comm/reduce.h"
#include "dtensor/error.h"
#include "util/check.h"

namespace dtensor::comm {
namespace {

bool all_equal(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t c) { return c == v[0]; });
}

}  // namespace

template <class Blocking, class Start>
WorkPtr MPIGroup::issue(const char* op, bool async, std::shared_ptr<Scratch> scratch, std::function<void()> after,
                        const Blocking& blocking, const Start& start) {
  if (!async) {
    int code = MPI_SUCCESS;
    {
      Watch watch(watched_, op, calls_, timeout_);
      code = blocking();
    }
    if (code != MPI_SUCCESS) collective_failed(op, code);
    if (after) after();
    return nullptr;
  }
  auto work = std::make_shared<MPIWork>(shared_from_this(), op, std::move(scratch), std::move(after));
  work->requests.resize(1);
  if (const int code = start(&work->requests[0]); code != MPI_SUCCESS) collective_failed(op, code);
  return work;
}

WorkPtr MPIGroup::all_reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, bool async) {
  begin(CallKind::AllReduce, dtype, count, 0, op);
  const int c = to_int(count, "all_reduce");
  const MPI_Datatype type = mpi_datatype(dtype);
  const MPI_Op mop = mpi_op(dtype, op);
  // Async calls always reduce in place (out first gets a copy of in): Open MPI 4.1's
  // MPI_Iallreduce picks its algorithm by whether a call is in place, so ranks that
  // differ in that (legal MPI) exchange mismatched pieces (MPI_ERR_TRUNCATE).
  if (async && in != out && count > 0) std::memcpy(out, in, static_cast<size_t>(count) * dtype_size(dtype));
  const void* send = in == out || async ? MPI_IN_PLACE : in;
  MPI_Comm comm = comm_;
  std::function<void()> after;
  if (op == ReduceOp::Avg) after = [=, n = size_] { divide_by(dtype, out, count, n); };
  return issue(
      "all_reduce", async, nullptr, after, [=] { return MPI_Allreduce(send, out, c, type, mop, comm); },
      [=](MPI_Request* r) { return MPI_Iallreduce(send, out, c, type, mop, comm, r); });
}

WorkPtr MPIGroup::all_gather(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer, DType dtype,
                             bool async) {
  const char* op = "all_gather";
  const size_t esize = dtype_size(dtype);
  const MPI_Datatype type = mpi_datatype(dtype);
  MPI_Comm comm = comm_;
  if (outer == 1 && all_equal(counts)) {
    // The common case needs no count arrays and no scratch.
    begin(CallKind::AllGather, dtype, counts[0] * size_, 0, ReduceOp::Sum);
    const int mine = to_int(counts[0], op);
    const void* send = in == static_cast<const std::byte*>(out) + rank_ * counts[0] * esize ? MPI_IN_PLACE : in;
    return issue(
        op, async, nullptr, nullptr, [=] { return MPI_Allgather(send, mine, type, out, mine, type, comm); },
        [=](MPI_Request* r) { return MPI_Iallgather(send, mine, type, out, mine, type, comm, r); });
  }
  auto s = std::make_shared<Scratch>();
  s->a = std::make_unique<CountsAndDispls>(counts, outer, op);
  const int64_t total = s->a->displs.back() + s->a->counts.back();
  begin(CallKind::AllGather, dtype, total, 0, ReduceOp::Sum);
  const CountsAndDispls& cd = *s->a;
  void* recv = out;
  std::function<void()> after;
  if (outer > 1) {
    // MPI gathers rank-major; rows of the concatenated tensor interleave ranks.
    s->bytes.resize(total * esize);
    recv = s->bytes.data();
    after = [=, n = size_] {
      const int64_t row = total / outer;
      int64_t column = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t width = counts[r] * esize;
        for (int64_t o = 0; o < outer; ++o) {
          std::memcpy(static_cast<std::byte*>(out) + (o * row * esize + column),
                      s->bytes.data() + cd.displs[r] * esize + o * width, width);
        }
        column += width;
      }
    };
  }
  const bool in_place = outer == 1 && in == static_cast<const std::byte*>(out) + cd.displs[rank_] * esize;
  const void* send = in_place ? MPI_IN_PLACE : in;
  const int mine = cd.counts[rank_];
  if (all_equal(counts)) {  // scaled by `outer`, still equal
    return issue(
        op, async, s, after, [=] { return MPI_Allgather(send, mine, type, recv, mine, type, comm); },
        [=](MPI_Request* r) { return MPI_Iallgather(send, mine, type, recv, mine, type, comm, r); });
  }
  return issue(
      op, async, s, after,
      [=, &cd] { return MPI_Allgatherv(send, mine, type, recv, cd.counts.data(), cd.displs.data(), type, comm); },
      [=, &cd](MPI_Request* r) {
        return MPI_Iallgatherv(send, mine, type, recv, cd.counts.data(), cd.displs.data(), type, comm, r);
      });
}

WorkPtr MPIGroup::reduce_scatter(const void* in, void* out, const std::vector<int64_t>& counts, int64_t outer,
                                 DType dtype, ReduceOp op, bool async) {
  const char* name = "reduce_scatter";
  const MPI_Datatype type = mpi_datatype(dtype);
  const MPI_Op mop = mpi_op(dtype, op);
  MPI_Comm comm = comm_;
  std::function<void()> after;
  if (outer == 1 && all_equal(counts)) {
    begin(CallKind::ReduceScatter, dtype, counts[0] * size_, 0, op);
    const int c = to_int(counts[0], name);
    if (op == ReduceOp::Avg) after = [=, n = size_] { divide_by(dtype, out, c, n); };
    return issue(
        name, async, nullptr, std::move(after), [=] { return MPI_Reduce_scatter_block(in, out, c, type, mop, comm); },
        [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(in, out, c, type, mop, comm, r); });
  }
  auto s = std::make_shared<Scratch>();
  s->a = std::make_unique<CountsAndDispls>(counts, outer, name);
  const CountsAndDispls& cd = *s->a;
  const int64_t total = cd.displs.back() + cd.counts.back();
  begin(CallKind::ReduceScatter, dtype, total, 0, op);
  const size_t esize = dtype_size(dtype);
  const void* send = in;
  if (outer > 1) {
    // Rank-major packing: rank r's block of every row, one after the other.
    s->bytes.resize(total * esize);
    const int64_t row = total / outer;
    int64_t column = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t width = counts[r] * esize;
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(s->bytes.data() + cd.displs[r] * esize + o * width,
                    static_cast<const std::byte*>(in) + (o * row * esize + column), width);
      }
      column += width;
    }
    send = s->bytes.data();
  }
  const int64_t mine = cd.counts[rank_];
  if (op == ReduceOp::Avg) after = [=, n = size_] { divide_by(dtype, out, mine, n); };
  if (all_equal(counts)) {  // scaled by `outer`, still equal
    const int c = cd.counts[0];
    return issue(
        name, async, s, after, [=] { return MPI_Reduce_scatter_block(send, out, c, type, mop, comm); },
        [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, out, c, type, mop, comm, r); });
  }
  return issue(
      name, async, s, after, [=, &cd] { return MPI_Reduce_scatter(send, out, cd.counts.data(), type, mop, comm); },
      [=, &cd](MPI_Request* r) { return MPI_Ireduce_scatter(send, out, cd.counts.data(), type, mop, comm, r); });
}

WorkPtr MPIGroup::all_to_all(const void* in, const std::vector<int64_t>& send_counts, void* out,
                             const std::vector<int64_t>& recv_counts, DType dtype, bool equal_splits, bool async) {
  const char* op = "all_to_all";
  // The count slot of the fingerprint: the elements each rank sends each peer with
  // equal splits (the same everywhere), -1 when split sizes were given. All ranks
  // must call the same MPI routine.
  begin(CallKind::AllToAll, dtype, equal_splits ? send_counts[0] : -1, 0, ReduceOp::Sum);
  const MPI_Datatype type = mpi_datatype(dtype);
  MPI_Comm comm = comm_;
  if (equal_splits) {
    const int send = to_int(send_counts[0], op), recv = to_int(recv_counts[0], op);
    return issue(
        op, async, nullptr, nullptr, [=] { return MPI_Alltoall(in, send, type, out, recv, type, comm); },
        [=](MPI_Request* r) { return MPI_Ialltoall(in, send, type, out, recv, type, comm, r); });
  }
  auto s = std::make_shared<Scratch>();
  s->a = std::make_unique<CountsAndDispls>(send_counts, 1, op);
  s->b = std::make_unique<CountsAndDispls>(recv_counts, 1, op);
  const CountsAndDispls& sd = *s->a;
  const CountsAndDispls& rd = *s->b;
  // Split sizes given: the v-form, even if this rank's happen to be equal (another
  // rank's may not be, and all ranks must call the same MPI routine).
  return issue(
      op, async, s, nullptr,
      [=, &sd, &rd] {
        return MPI_Alltoallv(in, sd.counts.data(), sd.displs.data(), type, out, rd.counts.data(), rd.displs.data(),
                             type, comm);
      },
      [=, &sd, &rd](MPI_Request* r) {
        return MPI_Ialltoallv(in, sd.counts.data(), sd.displs.data(), type, out, rd.counts.data(), rd.displs.data(),
                              type, comm, r);
      });
}

void MPIGroup::all_to_all_blocks(const void* in, const BlockLayout& send, void* out, const BlockLayout& recv,
                                 DType dtype) {
  const char* op = "all_to_all";
  begin(CallKind::AllToAll, dtype, kStridedBlocks, 0, ReduceOp::Sum);
  const MPI_Datatype base = mpi_datatype(dtype);
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  struct Types {  // freed however the call ends
    std::vector<MPI_Datatype> all;
    ~Types() {
      for (MPI_Datatype& t : all) MPI_Type_free(&t);
    }
  } types;
  std::vector<MPI_Datatype> send_types(size_), recv_types(size_);
  // The piece's byte offset goes into its type (MPI_Aint), not into Alltoallw's int
  // displacements, which would cap buffers at 2 GiB.
  std::vector<int> ones(size_, 1), send_displs(size_, 0), recv_displs(size_, 0);
  auto describe = [&](const BlockLayout& layout, int s, MPI_Datatype* type) {
    const int width = to_int(layout.widths[s], op);
    MPI_Datatype segments = MPI_DATATYPE_NULL;
    if (layout.rows <= 1) {
      check_mpi(MPI_Type_contiguous(layout.rows * width, base, &segments), op);
    } else {
      check_mpi(MPI_Type_vector(to_int(layout.rows, op), width, to_int(layout.stride, op), base, &segments), op);
    }
    types.all.push_back(segments);
    const MPI_Aint offset = static_cast<MPI_Aint>(layout.offsets[s] * esize);
    check_mpi(MPI_Type_create_hindexed_block(1, 1, &offset, segments, type), op);
    types.all.push_back(*type);
    check_mpi(MPI_Type_commit(type), op);
  };
  for (int s = 0; s < size_; ++s) {
    describe(send, s, &send_types[s]);
    describe(recv, s, &recv_types[s]);
  }
  MPI_Comm comm = comm_;
  issue(
      op, false, nullptr, nullptr,
      [&] {
        return MPI_Alltoallw(in, ones.data(), send_displs.data(), send_types.data(), out, ones.data(),
                             recv_displs.data(), recv_types.data(), comm);
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoallw(in, ones.data(), send_displs.data(), send_types.data(), out, ones.data(),
                              recv_displs.data(), recv_types.data(), comm, r);
      });
}

WorkPtr MPIGroup::broadcast(void* data, int64_t count, DType dtype, int root, bool async) {
  begin(CallKind::Broadcast, dtype, count, root, ReduceOp::Sum);
  const int c = to_int(count, "broadcast");
  const MPI_Datatype type = mpi_datatype(dtype);
  MPI_Comm comm = comm_;
  return issue(
      "broadcast", async, nullptr, nullptr, [=] { return MPI_Bcast(data, c, type, root, comm); },
      [=](MPI_Request* r) { return MPI_Ibcast(data, c, type, root, comm, r); });
}

WorkPtr MPIGroup::gather(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                         bool async) {
  auto s = std::make_shared<Scratch>();
  s->a = std::make_unique<CountsAndDispls>(counts, 1, "gather");
  const CountsAndDispls& cd = *s->a;
  begin(CallKind::Gather, dtype, cd.displs.back() + cd.counts.back(), root, ReduceOp::Sum);
  const int mine = cd.counts[rank_];
  const MPI_Datatype type = mpi_datatype(dtype);
  MPI_Comm comm = comm_;
  return issue(
      "gather", async, s, nullptr,
      [=, &cd] { return MPI_Gatherv(in, mine, type, out, cd.counts.data(), cd.displs.data(), type, root, comm); },
      [=, &cd](MPI_Request* r) {
        return MPI_Igatherv(in, mine, type, out, cd.counts.data(), cd.displs.data(), type, root, comm, r);
      });
}

WorkPtr MPIGroup::scatter(const void* in, void* out, const std::vector<int64_t>& counts, DType dtype, int root,
                          bool async) {
  auto s = std::make_shared<Scratch>();
  s->a = std::make_unique<CountsAndDispls>(counts, 1, "scatter");
  const CountsAndDispls& cd = *s->a;
  begin(CallKind::Scatter, dtype, cd.displs.back() + cd.counts.back(), root, ReduceOp::Sum);
  const int mine = cd.counts[rank_];
  const MPI_Datatype type = mpi_datatype(dtype);
  MPI_Comm comm = comm_;
  return issue(
      "scatter", async, s, nullptr,
      [=, &cd] { return MPI_Scatterv(in, cd.counts.data(), cd.displs.data(), type, out, mine, type, root, comm); },
      [=, &cd](MPI_Request* r) {
        return MPI_Iscatterv(in, cd.counts.data(), cd.displs.data(), type, out, mine, type, root, comm, r);
      });
}

WorkPtr MPIGroup::barrier(bool async) {
  begin(CallKind::Barrier, DType::F32, 0, 0, ReduceOp::Sum);
  MPI_Comm comm = comm_;
  return issue(
      "barrier", async, nullptr, nullptr, [=] { return MPI_Barrier(comm); },
      [=](MPI_Request* r) { return MPI_Ibarrier(comm, r); });
}

}  // namespace dtensor::comm
