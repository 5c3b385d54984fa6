// The user-level call a rank is making, for the messages of mismatched or stuck
// collectives: a library operation made of several collectives
// ("redistribute S(0)->R") or a public collective that first exchanges sizes
// ("all_gather"), and the part an internal call plays in it ("size exchange").
// Thread-local; the outermost user call and the innermost purpose win. A plain
// public collective sets nothing (its own descriptor says everything), so the
// common path costs nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dtensor/device.h"

namespace dtensor::comm {

class FlightRecorder;

// The flight record of the public call being made (flight_recorder.h), for a backend
// that completes calls later than they return (nccl: when the GPU has run them).
struct FlightRef {
  FlightRecorder* recorder = nullptr;
  int group = -1;
  uint64_t id = 0;
};

struct CallContext {
  std::string_view user_call;
  std::string_view purpose;
  // Where the buffers of the backend call being made lie (BufferDeviceScope): the
  // threads backend moves CUDA buffers with device copies and kernels.
  Device device = Device::cpu();
  FlightRef flight;  // set by begin_call, cleared when its record moves on
  static CallContext& current() {
    thread_local CallContext context;
    return context;
  }
};

// Names the user-level call for the scope's lifetime (the name must outlive it)
// unless an outer scope already did.
class UserCallScope {
 public:
  explicit UserCallScope(std::string_view name) : owner_(CallContext::current().user_call.empty()) {
    if (owner_) CallContext::current().user_call = name;
  }
  ~UserCallScope() {
    if (owner_) CallContext::current().user_call = {};
  }
  UserCallScope(const UserCallScope&) = delete;
  UserCallScope& operator=(const UserCallScope&) = delete;

 private:
  bool owner_;
};

// An internal call of a public collective: names both (e.g. "all_gather", "size exchange").
class InternalCallScope {
 public:
  InternalCallScope(std::string_view user_call, std::string_view purpose)
      : call_(user_call), previous_(CallContext::current().purpose) {
    CallContext::current().purpose = purpose;
  }
  ~InternalCallScope() { CallContext::current().purpose = previous_; }
  InternalCallScope(const InternalCallScope&) = delete;
  InternalCallScope& operator=(const InternalCallScope&) = delete;

 private:
  UserCallScope call_;
  std::string_view previous_;
};

// The buffers handed to the backend in this scope lie on `device` (the public
// collectives set it around the backend call; internal host exchanges stay CPU).
class BufferDeviceScope {
 public:
  explicit BufferDeviceScope(Device device) : previous_(CallContext::current().device) {
    CallContext::current().device = device;
  }
  ~BufferDeviceScope() { CallContext::current().device = previous_; }
  BufferDeviceScope(const BufferDeviceScope&) = delete;
  BufferDeviceScope& operator=(const BufferDeviceScope&) = delete;

 private:
  Device previous_;
};

}  // namespace dtensor::comm
