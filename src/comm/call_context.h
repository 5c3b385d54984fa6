// The user-level call a rank is making, for the messages of mismatched or stuck
// collectives: a library operation made of several collectives
// ("redistribute S(0)->R") or a public collective that first exchanges sizes
// ("all_gather"), and the part an internal call plays in it ("size exchange").
// Thread-local; the outermost user call and the innermost purpose win. A plain
// public collective sets nothing (its own descriptor says everything), so the
// common path costs nothing.
#pragma once

#include <string>
#include <string_view>

namespace dtensor::comm {

struct CallContext {
  std::string_view user_call;
  std::string_view purpose;
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

}  // namespace dtensor::comm
