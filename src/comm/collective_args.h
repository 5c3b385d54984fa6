// Helpers shared by the public collective functions (collectives.cpp,
// rooted_collectives.cpp, point_to_point.cpp): argument checks, contiguous
// buffers for the backend, and the Work that keeps tensors alive and copies
// results into non-contiguous outputs.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <numeric>
#include <utility>
#include <vector>

#include "comm/call_context.h"
#include "comm/comm_backend.h"
#include "comm/fault_injection.h"
#include "comm/flight_recorder.h"
#include "dtensor/comm_debug.h"
#include "dtensor/error.h"
#include "dtensor/group.h"
#include "util/check.h"

namespace dtensor::comm {

inline GroupImpl& backend_of(const Group& group, const char* op) {
  DT_CHECK_ARG(group.defined(), op, "expected a defined group, got an undefined one "
               "(split with a negative color returns one)");
  return *group.impl();
}

// Every user-level communication call starts here: counted (comm_debug.h), then the
// fault-injection point (fault_injection.h), then recorded (flight_recorder.h). The
// token completes the record when it goes out of scope after a synchronous call (or
// fails it when an exception leaves the call); an async call hands it to its Work.
[[nodiscard]] inline FlightToken begin_call(const char* op, const Group& group, int64_t bytes, FlightCall call = {}) {
  CommDebugMode::record(op, group, bytes);
  fault_point(op, group);
  GroupImpl& impl = *group.impl();
  if (!impl.flight_recorder() || impl.size() == 1) return {};
  call.op = op;
  return impl.flight_recorder()->record(impl, call);
}

// What the flight recorder keeps of a call with an input and an output.
inline FlightCall flight_call(const Tensor& input, const Tensor& output, bool async, int root = -1) {
  return {.dtype = input.defined() ? input.dtype() : output.dtype(),
          .in_count = input.defined() ? input.numel() : 0,
          .out_count = output.defined() ? output.numel() : 0,
          .root = root,
          .async = async};
}

inline void check_tensor(const Group& group, const Tensor& t, const char* op, const char* what) {
  DT_CHECK_ARG(t.defined(), op, "expected a defined ", what, " tensor, got an undefined one");
  DT_CHECK_SUPPORTED(t.device().is_cpu() || (t.device().is_cuda() && group.impl()->accepts_cuda_buffers()), op, "the ",
                     group.backend(), " backend needs CPU tensors, got ", what, " on ", t.device().to_string());
}

// Both tensors of one call on one device (no implicit copies between devices).
inline void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* a_name,
                              const char* b_name) {
  DT_CHECK_ARG(a.device() == b.device(), op, a_name, " is on ", a.device().to_string(), " but ", b_name, " is on ",
               b.device().to_string(), " (copy one with to(Device) first)");
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
  check_same_device(input, output, op, "input", "output");
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

// Whether the memory of `a` and `b` (any layouts) may overlap: their address ranges
// intersect. Conservative for interleaved views (a.slice(0, 0, n, 2) and
// a.slice(0, 1, n, 2) count as overlapping), which only costs a staging copy.
inline bool memory_overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto range = [](const Tensor& t) {
    int64_t lo = 0, hi = 0;  // in elements from data_ptr(), hi inclusive
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t reach = (t.size(d) - 1) * t.stride(d);
      (reach < 0 ? lo : hi) += reach;
    }
    const auto* base = static_cast<const std::byte*>(t.data_ptr());
    const auto esize = static_cast<int64_t>(dtype_size(t.dtype()));
    return std::pair{base + lo * esize, base + (hi + 1) * esize};
  };
  const auto [a_lo, a_hi] = range(a);
  const auto [b_lo, b_hi] = range(b);
  return a_lo < b_hi && b_lo < a_hi;
}

// dst <- src unless they are already the same memory.
inline void copy_into(const Tensor& dst, const Tensor& src) {
  if (dst.data_ptr() == src.data_ptr() && dst.is_contiguous() && src.is_contiguous()) return;
  Tensor handle = dst;  // a handle copy: copy_ writes the shared storage
  // Overlapping views (a transpose of the source, say): copy from a snapshot.
  handle.copy_(memory_overlaps(dst, src) ? src.clone() : src);
}

// Where a backend writes a result: the output itself when contiguous, else a
// temporary copied into it when the operation completes.
struct Output {
  Tensor user;
  Tensor buffer;
  bool needs_copy() const { return !user.is_contiguous(); }
};
inline Output writable(const Tensor& t) {
  return t.is_contiguous() ? Output{t, t} : Output{t, Tensor::empty(t.shape(), t.dtype(), t.device())};
}

// Keeps the tensors of an async call alive, copies results out once done, and
// tells the flight recorder how the call ended.
class FinishingWork final : public WorkImpl {
 public:
  FinishingWork(WorkPtr inner, std::vector<Tensor> keep, std::vector<Output> outs,
                std::vector<FlightToken> records = {})
      : inner_(std::move(inner)), keep_(std::move(keep)), outs_(std::move(outs)), records_(std::move(records)) {
    for (FlightToken& record : records_) record.started();
  }
  // Dropped before it completed: the backend keeps the tensors until it has.
  // The flight record follows the buffers: done when the backend lets go of them.
  ~FinishingWork() override {
    const bool running = inner_ && !finished_ && !inner_->is_completed();
    if (running && (!keep_.empty() || !records_.empty())) {
      auto buffers = std::make_shared<std::vector<Tensor>>(std::move(keep_));
      for (FlightToken& record : records_) record.dropped(buffers);
      inner_->retain(std::move(buffers));
    }
    for (FlightToken& record : records_) record.completed();
  }
  FinishingWork(const FinishingWork&) = delete;
  FinishingWork& operator=(const FinishingWork&) = delete;
  void wait() override {
    if (inner_) {
      try {
        inner_->wait();
      } catch (...) {
        for (FlightToken& record : records_) record.failed();
        throw;
      }
    }
    for (FlightToken& record : records_) record.completed();
    if (!finished_) {
      finished_ = true;
      for (Output& out : outs_) {
        if (out.user.defined() && out.needs_copy()) out.user.copy_(out.buffer);
      }
      keep_.clear();
    }
  }
  bool is_completed() override {
    const bool done = !inner_ || inner_->is_completed();
    if (done) {
      for (FlightToken& record : records_) record.completed();
    }
    return done;
  }
  void retain(std::shared_ptr<void> buffers) override {
    if (inner_) inner_->retain(std::move(buffers));
  }

 private:
  WorkPtr inner_;
  std::vector<Tensor> keep_;
  std::vector<Output> outs_;
  std::vector<FlightToken> records_;
  bool finished_ = false;
};

// A sync call completes here without allocating (its cost is compared with raw
// MPI's); an async one gets a Work that keeps `keep` alive until it is waited for,
// and the call's flight record.
inline Work finish(WorkPtr inner, std::initializer_list<Tensor> keep, Output out, bool async, FlightToken& record) {
  if (!async) {
    if (inner) inner->wait();
    if (out.user.defined() && out.needs_copy()) out.user.copy_(out.buffer);
    return Work();
  }
  std::vector<FlightToken> records;
  if (record) records.push_back(std::move(record));
  return Work(std::make_shared<FinishingWork>(std::move(inner), std::vector<Tensor>(keep),
                                              std::vector<Output>{std::move(out)}, std::move(records)));
}

// The buffers a backend reads and writes for one input and one output: the
// caller's tensors themselves when contiguous (no handle copies: a sync call
// should cost what the raw backend call costs), else contiguous stand-ins.
// Holds references to the caller's arguments: lives inside one collective call.
class CallBuffers {
 public:
  CallBuffers(const Tensor& input, const Tensor& output) : input_(input), output_(output), device_(input.device()) {
    if (!input.is_contiguous()) in_copy_ = input.contiguous();
    if (!output.is_contiguous()) out_copy_ = Tensor::empty(output.shape(), output.dtype(), output.device());
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
  // An output buffer that overlaps the input buffer anywhere but at `in_place` (the
  // input address at which the backend works in place, nullptr if it never does):
  // the backends read peers' inputs while writing outputs (threads) or forbid
  // aliased buffers (MPI), so the input is read from a snapshot instead.
  void stage_overlapping_input(const void* in_place) {
    // Both buffers are contiguous here (stand-ins are, and so are tensors used as
    // they are), so their byte ranges are simply [data, data + nbytes).
    const auto* in_data = static_cast<const std::byte*>(in().data_ptr());
    const auto* out_data = static_cast<const std::byte*>(out().data_ptr());
    if (in_data == in_place || in_data == nullptr || out_data == nullptr) return;
    if (in_data + in().nbytes() <= out_data || out_data + out().nbytes() <= in_data) return;
    in_copy_ = input_.clone();
  }
  // Sync: waits and copies a stand-in's result into the output. Async: a Work that
  // keeps the buffers alive and does that when waited for.
  // `record` (the call's flight record) goes to the async Work; a sync call's
  // completes in the caller's scope.
  Work finish(WorkPtr inner, bool async, FlightToken& record) const {
    if (!async) {
      if (inner) inner->wait();
      if (out_copy_.defined()) Tensor(output_).copy_(out_copy_);
      return Work();
    }
    return comm::finish(std::move(inner), {in(), out()}, Output{output_, out()}, true, record);
  }

 private:
  const Tensor& input_;
  const Tensor& output_;
  BufferDeviceScope device_;  // the backend call made in this object's lifetime sees the device
  Tensor in_copy_, out_copy_;
};

// Counts and records the call into `record`; on a group of size 1 also does its
// whole work (a copy) and returns true.
inline bool record_or_finish_alone(const Group& group, const char* op, const Tensor& input, const Tensor& output,
                                   bool async, FlightToken& record, int root = -1) {
  record = begin_call(op, group, static_cast<int64_t>(input.nbytes()), flight_call(input, output, async, root));
  if (group.size() != 1) return false;
  copy_into(output, input);
  return true;
}

inline int64_t product(const Shape& shape, int begin, int end) {
  int64_t p = 1;
  for (int i = begin; i < end; ++i) p *= shape[i];
  return p;
}

// Every rank's size of `t` along `d`, in rank order (not counted by CommDebugMode),
// for collectives whose per-rank sizes may differ. The exchange also carries what
// must agree (dtype, the elements before and after dim d), so ranks whose tensors
// cannot be concatenated all get std::invalid_argument before any data moves
// (MPI would truncate on some ranks and report success on others).
inline std::vector<int64_t> exchange_sizes(const Group& group, const char* op, const Tensor& t, int d) {
  const int n = group.size();
  constexpr int kFields = 4;
  const int64_t mine[kFields] = {t.size(d), static_cast<int64_t>(t.dtype()), product(t.shape(), 0, d),
                                 product(t.shape(), d + 1, static_cast<int>(t.dim()))};
  std::vector<int64_t> all(static_cast<size_t>(n) * kFields);
  {
    InternalCallScope scope(op, "size exchange");
    group.impl()->all_gather(mine, all.data(), std::vector<int64_t>(n, kFields), 1, DType::I64, false);
  }
  std::vector<int64_t> sizes(n);
  for (int r = 0; r < n; ++r) {
    const int64_t* theirs = all.data() + static_cast<size_t>(r) * kFields;
    sizes[r] = theirs[0];
    if (std::equal(theirs + 1, theirs + kFields, all.data() + 1)) continue;
    auto describe = [&](int rank) {
      const int64_t* f = all.data() + static_cast<size_t>(rank) * kFields;
      return detail::concat("rank ", rank, " has ", dtype_name(static_cast<DType>(f[1])), " with ", f[2],
                            " x ", f[3], " elements before x after dim ", d);
    };
    throw std::invalid_argument(detail::concat("[", op, "] the ranks' tensors do not fit together in group '",
                                               group.name(), "': ", describe(0), ", ", describe(r)));
  }
  return sizes;
}

inline std::vector<int64_t> chunk_sizes(int64_t total, int n) {
  const int64_t c = (total + n - 1) / n;
  std::vector<int64_t> sizes(n);
  for (int r = 0; r < n; ++r) sizes[r] = std::clamp<int64_t>(total - r * c, 0, c);
  return sizes;
}

inline int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace dtensor::comm
