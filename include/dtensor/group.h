// Communication: process groups, collectives and point-to-point messages.
//
// A `Group` is a cheap-to-copy handle (MLX style) over a backend's group: the
// `threads` backend (ranks are threads of this process, started by `launch`), `mpi`
// (one process per rank, started by mpirun, through `init("mpi")`) or `nccl` (one
// GPU per rank, through `init("nccl")` inside `launch` or under mpirun; CPU tensors
// on it go through the threads or MPI group it was made from). Every program is
// SPMD: all ranks of a group call the same collectives in the same order with
// matching sizes.
//
// Conventions of every function below (see docs/communication.md):
// - Free functions taking the group first: `all_reduce(group, t, ReduceOp::Sum)`.
// - `op(...)` returns a new tensor; `op_(...)` works in place (as Tensor::copy_);
//   `op_into(...)` writes into a given output; `op_async(...)` does the same and
//   returns a `Work` at once.
// - Tensors on the CPU (every backend), or on a GPU for `threads` (all ranks in one
//   process) and `nccl` (each rank's own GPU). Inputs of any layout are accepted
//   (non-contiguous ones are copied first). On a GPU calls are stream ordered: a
//   synchronous call returns once queued, and `Work::wait` makes the caller's
//   stream wait for the call instead of blocking the host.
// - A group of size 1 returns its input (or copies it into the given output)
//   without communicating.
// - Uneven sizes follow the chunk rule of DESIGN.md unless sizes are given.
// - Errors: std::invalid_argument for mismatched or wrong arguments, std::runtime_error
//   for timeouts, failed peers and unsupported backends; messages start with `[op]`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/tensor.h"

namespace dtensor {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min, Product };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "avg", ...

namespace comm {
class GroupImpl;
class WorkImpl;
}  // namespace comm

// An operation in flight. A default-constructed Work is already complete.
// wait() rethrows the operation's error (timeout, failed peer, mismatch).
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<comm::WorkImpl> impl) : impl_(std::move(impl)) {}
  void wait();
  bool is_completed() const;

 private:
  std::shared_ptr<comm::WorkImpl> impl_;
};

class Group {
 public:
  Group() = default;  // undefined (split with a negative color returns one)
  explicit Group(std::shared_ptr<comm::GroupImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  std::string backend() const;  // "threads", "mpi" or "nccl"
  // The device this rank communicates on: for nccl its GPU (the one init("nccl")
  // made current for the rank: put the rank's model and batches there); for threads
  // and mpi the CPU, whatever tensors they are later given.
  Device device() const;
  // "world", then "world/c2" for the split with color 2 of it, and so on.
  std::string name() const;

  // Collective over this group: ranks with the same color form one new group,
  // ordered by (key, rank in this group). A negative color joins no group and
  // gets an undefined Group.
  Group split(int color, int key = 0) const;

  // Bound on every blocking wait of this rank in this group (default 10 min, or
  // DTENSOR_TIMEOUT_S). Set the same value on every rank.
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;

  // Same underlying group (not just the same ranks).
  bool operator==(const Group& other) const { return impl_ == other.impl_; }
  const std::shared_ptr<comm::GroupImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<comm::GroupImpl> impl_;
};

// ---- starting ranks ----------------------------------------------------------------

// Runs fn(world) on n ranks, each a thread of this process, with its own memory
// counters. If a rank throws, ranks blocked in communication are released with an
// error naming it, and launch rethrows the first error once all ranks ended.
void launch(int n, const std::function<void(Group world)>& fn);

// The world group of a backend: "threads" (inside `launch`: this rank's world;
// elsewhere a group of size 1), "mpi" (MPI_COMM_WORLD; initialises MPI once),
// "nccl" (one GPU per rank: a launch rank takes the GPU of its rank, an MPI process
// that of its rank on its host; bootstrapped over the launch's world or MPI's;
// std::runtime_error where there is no GPU, fewer GPUs than ranks on a host, or no
// NCCL in the build), "any" (threads inside launch, else mpi when started by mpirun
// and built with MPI, else threads). An empty name reads DTENSOR_BACKEND, default "any".
Group init(std::string_view backend = "");
// A group of the calling rank alone, made without communication on any backend
// (its collectives return their inputs). local_mesh() is built on it.
Group self_group();
bool is_available(std::string_view backend);
std::vector<std::string> available_backends();

// ---- collectives -------------------------------------------------------------------

// Elementwise reduction over the group. Avg needs a floating dtype. On Bool, Sum and
// Max are logical or, Min and Product logical and. BF16/F16 are reduced in F32.
Tensor all_reduce(const Group& group, const Tensor& input, ReduceOp op = ReduceOp::Sum);
void all_reduce_(const Group& group, const Tensor& tensor, ReduceOp op = ReduceOp::Sum);
Work all_reduce_async(const Group& group, const Tensor& input, const Tensor& output,
                      ReduceOp op = ReduceOp::Sum);
// `_into` forms write into a preallocated output, which may overlap the input in
// any way (the input is then read from a copy, unless the call works in place:
// all_reduce with output == input, all_gather from this rank's block of the output).
void all_reduce_into(const Group& group, const Tensor& input, const Tensor& output,
                     ReduceOp op = ReduceOp::Sum);

// Concatenation of every rank's input along `dim`, in rank order. Sizes along dim
// may differ by rank (other dims must match); `sizes` gives them when known,
// otherwise they are exchanged first.
Tensor all_gather(const Group& group, const Tensor& input, int64_t dim = 0,
                  const std::vector<int64_t>& sizes = {});
// Every rank's input as it is (shapes may differ entirely; one dtype).
std::vector<Tensor> all_gather_list(const Group& group, const Tensor& input);
// `output` must already have the gathered shape; empty `sizes` means even sizes.
Work all_gather_async(const Group& group, const Tensor& input, const Tensor& output,
                      int64_t dim = 0, const std::vector<int64_t>& sizes = {});
void all_gather_into(const Group& group, const Tensor& input, const Tensor& output,
                     int64_t dim = 0, const std::vector<int64_t>& sizes = {});

// Reduces the inputs and gives rank r piece r along `dim`. Pieces follow `sizes`
// (one per rank, summing to input.size(dim)) or, when empty, the chunk rule.
Tensor reduce_scatter(const Group& group, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                      int64_t dim = 0, const std::vector<int64_t>& sizes = {});
Work reduce_scatter_async(const Group& group, const Tensor& input, const Tensor& output,
                          ReduceOp op = ReduceOp::Sum, int64_t dim = 0,
                          const std::vector<int64_t>& sizes = {});
void reduce_scatter_into(const Group& group, const Tensor& input, const Tensor& output,
                         ReduceOp op = ReduceOp::Sum, int64_t dim = 0,
                         const std::vector<int64_t>& sizes = {});

// Rank r sends rows [in_off(s), +input_split_sizes[s]) of dim 0 to rank s and
// receives output_split_sizes[s] rows from it, in rank order. Empty input splits:
// equal splits. Empty output splits: exchanged (equal when inputs are equal).
// All ranks must agree on which split sizes they pass (as in PyTorch): a call
// without any is an equal-split exchange (MPI_Alltoall), one with sizes the
// general form (MPI_Alltoallv), even where the sizes happen to be equal.
Tensor all_to_all(const Group& group, const Tensor& input,
                  const std::vector<int64_t>& output_split_sizes = {},
                  const std::vector<int64_t>& input_split_sizes = {});
Work all_to_all_async(const Group& group, const Tensor& input, const Tensor& output,
                      const std::vector<int64_t>& output_split_sizes = {},
                      const std::vector<int64_t>& input_split_sizes = {});
void all_to_all_into(const Group& group, const Tensor& input, const Tensor& output,
                     const std::vector<int64_t>& output_split_sizes = {},
                     const std::vector<int64_t>& input_split_sizes = {});

// Root's tensor to every rank (same shape on every rank).
void broadcast_(const Group& group, const Tensor& tensor, int root);
Tensor broadcast(const Group& group, const Tensor& input, int root);
Work broadcast_async(const Group& group, const Tensor& tensor, int root);

// Concatenation along dim 0 of every rank's input (sizes may differ) on `root`;
// an undefined Tensor elsewhere.
Tensor gather(const Group& group, const Tensor& input, int root);
// Rank r receives piece r along dim 0 of root's input into `output` (which has that
// piece's shape; pieces may differ). `input` is only read on root.
void scatter(const Group& group, const Tensor& input, const Tensor& output, int root);
// Async forms need the per-rank sizes along dim 0 (they cannot exchange them first).
Work gather_async(const Group& group, const Tensor& input, const Tensor& output, int root,
                  const std::vector<int64_t>& sizes);
Work scatter_async(const Group& group, const Tensor& input, const Tensor& output, int root,
                   const std::vector<int64_t>& sizes);

void barrier(const Group& group);
Work barrier_async(const Group& group);

// ---- point to point ----------------------------------------------------------------

// Messages between two ranks match by (source, tag) in the order they were posted.
// Sizes and dtypes of a matched send and recv must agree.
void send(const Group& group, const Tensor& tensor, int dst, int tag = 0);
void recv(const Group& group, const Tensor& tensor, int src, int tag = 0);
Work send_async(const Group& group, const Tensor& tensor, int dst, int tag = 0);
Work recv_async(const Group& group, const Tensor& tensor, int src, int tag = 0);

struct P2POp {
  enum class Kind : uint8_t { Send, Recv };
  Kind kind = Kind::Send;
  Tensor tensor;
  int peer = 0;
  int tag = 0;
  static P2POp send(Tensor t, int dst, int tag = 0) { return {Kind::Send, std::move(t), dst, tag}; }
  static P2POp recv(Tensor t, int src, int tag = 0) { return {Kind::Recv, std::move(t), src, tag}; }
};
// Posts all operations together: no deadlock whatever their order on each rank.
Work batch_send_recv_async(const Group& group, const std::vector<P2POp>& ops);
void batch_send_recv(const Group& group, const std::vector<P2POp>& ops);

}  // namespace dtensor
