// Helpers shared by the public collective functions (collectives.cpp,
// rooted_collectives.cpp, point_to_point.cpp): argument checks, contiguous
// buffers for the backend, and the Work that keeps tensors alive and copies
// results into non-contiguous outputs.
#pragma once

#include <initializer_list>
#include <numeric>
#include <vector>

#include "dtensor/comm_backend.h"
#include "dtensor/comm_debug.h"
#include "dtensor/error.h"
#include "dtensor/group.h"

namespace dtensor::comm {

inline GroupImpl& backend_of(const Group& group, const char* op) {
  DT_CHECK_ARG(group.defined(), op, "expected a defined group, got an undefined one "
               "(split with a negative color returns one)");
  return *group.impl();
}

inline void check_tensor(const Group& group, const Tensor& t, const char* op, const char* what) {
  DT_CHECK_ARG(t.defined(), op, "expected a defined ", what, " tensor, got an undefined one");
  DT_CHECK_SUPPORTED(t.device().is_cpu(), op, "the ", group.backend(), " backend needs CPU tensors, got ",
                     what, " on ", t.device().to_string());
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  DT_CHECK_ARG(a.dtype() == b.dtype(), op, "input is ", dtype_name(a.dtype()), " but output is ",
               dtype_name(b.dtype()));
}

inline void check_root(const Group& group, int root, const char* op) {
  DT_CHECK_ARG(root >= 0 && root < group.size(), op, "root must be in [0, ", group.size(),
               "), got ", root);
}

// The checks every collective with an input and an output makes; returns the backend.
inline GroupImpl& check_input_output(const Group& group, const Tensor& input, const Tensor& output,
                                     const char* op) {
  GroupImpl& backend = backend_of(group, op);
  check_tensor(group, input, op, "input");
  check_tensor(group, output, op, "output");
  check_same_dtype(input, output, op);
  return backend;
}

inline void check_output_shape(const Tensor& output, const Shape& expected, const char* op) {
  DT_CHECK_ARG(output.shape() == expected, op, "output shape must be ", expected, ", got ",
               output.shape());
}

inline Shape with_dim(Shape shape, int d, int64_t size) {
  shape[d] = size;
  return shape;
}

// Checks output.shape() == `shape` with dim `d` set to `size` without building it
// (sync collectives allocate nothing on the way to the backend).
inline void check_output_shape_with_dim(const Tensor& output, const Shape& shape, int d, int64_t size,
                                        const char* op) {
  const Shape& got = output.shape();
  bool ok = got.size() == shape.size();
  for (size_t i = 0; ok && i < got.size(); ++i) ok = got[i] == (static_cast<int>(i) == d ? size : shape[i]);
  if (!ok) check_output_shape(output, with_dim(shape, d, size), op);
}

// The counts handed to a backend: `sizes` times `inner` (or `n` counts of
// `each` x `inner` when sizes is empty), in a per-thread buffer `slot` (0 or 1)
// that later calls reuse. Backends copy what they keep past the call.
inline const std::vector<int64_t>& backend_counts(int slot, const std::vector<int64_t>& sizes, int n,
                                                  int64_t each, int64_t inner) {
  thread_local std::vector<int64_t> buffers[2];
  std::vector<int64_t>& v = buffers[slot];
  if (sizes.empty()) {
    v.assign(n, each * inner);
  } else {
    v.assign(sizes.begin(), sizes.end());
    for (auto& x : v) x *= inner;
  }
  return v;
}

// dst <- src unless they are already the same memory.
inline void copy_into(const Tensor& dst, const Tensor& src) {
  if (dst.data_ptr() == src.data_ptr() && dst.is_contiguous() && src.is_contiguous()) return;
  Tensor handle = dst;  // a handle copy: copy_ writes the shared storage
  // Overlapping views (a transpose of the source, say): copy from a snapshot.
  handle.copy_(dst.shares_storage(src) ? src.clone() : src);
}

// Where a backend writes a result: the output itself when contiguous, else a
// temporary copied into it when the operation completes.
struct Output {
  Tensor user;
  Tensor buffer;
  bool needs_copy() const { return !user.is_contiguous(); }
};
inline Output writable(const Tensor& t) {
  return t.is_contiguous() ? Output{t, t} : Output{t, Tensor::empty(t.shape(), t.dtype())};
}

// Keeps the tensors of an async call alive and copies results out once done.
class FinishingWork final : public WorkImpl {
 public:
  FinishingWork(WorkPtr inner, std::vector<Tensor> keep, std::vector<Output> outs)
      : inner_(std::move(inner)), keep_(std::move(keep)), outs_(std::move(outs)) {}
  void wait() override {
    if (inner_) inner_->wait();
    if (!finished_) {
      finished_ = true;
      for (Output& out : outs_) {
        if (out.user.defined() && out.needs_copy()) out.user.copy_(out.buffer);
      }
      keep_.clear();
    }
  }
  bool is_completed() override { return !inner_ || inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::vector<Tensor> keep_;
  std::vector<Output> outs_;
  bool finished_ = false;
};

// The buffers a backend reads and writes for one input and one output: the
// caller's tensors themselves when contiguous (no handle copies: a sync call
// should cost what the raw backend call costs), else contiguous stand-ins.
// Holds references to the caller's arguments: lives inside one collective call.
class CallBuffers {
 public:
  CallBuffers(const Tensor& input, const Tensor& output) : input_(input), output_(output) {
    if (!input.is_contiguous()) in_copy_ = input.contiguous();
    if (!output.is_contiguous()) out_copy_ = Tensor::empty(output.shape(), output.dtype());
  }
  const Tensor& in() const { return in_copy_.defined() ? in_copy_ : input_; }
  const Tensor& out() const { return out_copy_.defined() ? out_copy_ : output_; }
  // In place on a non-contiguous tensor (output and input the same view): work in
  // place on the input's contiguous copy. An output that overlaps the input
  // differently keeps its own stand-in, filled from the intact input.
  void reuse_input_copy_for_output() {
    if (out_copy_.defined() && in_copy_.defined() && output_.data_ptr() == input_.data_ptr() &&
        output_.shape() == input_.shape() && output_.strides() == input_.strides()) {
      out_copy_ = in_copy_;
    }
  }
  // Sync: waits and copies a stand-in's result into the output. Async: a Work that
  // keeps the buffers alive and does that when waited for.
  Work finish(WorkPtr inner, bool async) const {
    if (!async) {
      if (inner) inner->wait();
      if (out_copy_.defined()) Tensor(output_).copy_(out_copy_);
      return Work();
    }
    return Work(std::make_shared<FinishingWork>(std::move(inner), std::vector<Tensor>{in(), out()},
                                                std::vector<Output>{Output{output_, out()}}));
  }

 private:
  const Tensor& input_;
  const Tensor& output_;
  Tensor in_copy_, out_copy_;
};

// Counts the call; on a group of size 1 also does its whole work (a copy) and
// returns true.
inline bool record_or_finish_alone(const Group& group, const char* op, const Tensor& input,
                                   const Tensor& output) {
  CommDebugMode::record(op, group, static_cast<int64_t>(input.nbytes()));
  if (group.size() != 1) return false;
  copy_into(output, input);
  return true;
}

// A sync call completes here without allocating (its cost is compared with raw
// MPI's); an async one gets a Work that keeps `keep` alive until it is waited for.
inline Work finish(WorkPtr inner, std::initializer_list<Tensor> keep, Output out, bool async) {
  if (!async) {
    if (inner) inner->wait();
    if (out.user.defined() && out.needs_copy()) out.user.copy_(out.buffer);
    return Work();
  }
  return Work(std::make_shared<FinishingWork>(std::move(inner), std::vector<Tensor>(keep),
                                              std::vector<Output>{std::move(out)}));
}

inline int64_t product(const Shape& shape, int begin, int end) {
  int64_t p = 1;
  for (int i = begin; i < end; ++i) p *= shape[i];
  return p;
}

// Every rank's `mine`, in rank order (not counted by CommDebugMode).
inline std::vector<int64_t> exchange_sizes(const Group& group, int64_t mine) {
  const int n = group.size();
  std::vector<int64_t> all(n);
  group.impl()->all_gather(&mine, all.data(), std::vector<int64_t>(n, 1), 1, DType::I64, false);
  return all;
}

inline std::vector<int64_t> chunk_sizes(int64_t total, int n) {
  const int64_t c = (total + n - 1) / n;
  std::vector<int64_t> sizes(n);
  for (int r = 0; r < n; ++r) sizes[r] = std::clamp<int64_t>(total - r * c, 0, c);
  return sizes;
}

inline int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace dtensor::comm
