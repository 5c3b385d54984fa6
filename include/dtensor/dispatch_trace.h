// DispatchTrace: the strategy decisions of DistTensor ops, recorded while alive.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtensor {

// Records, while alive, every strategy decision ops make on this rank (one line
// each: op, input layouts, chosen redistributions, output layout, cost). With
// DTENSOR_DEBUG=dispatch, rank 0 also prints each new decision to stderr.
class DispatchTrace {
 public:
  DispatchTrace();
  ~DispatchTrace();
  DispatchTrace(const DispatchTrace&) = delete;
  DispatchTrace& operator=(const DispatchTrace&) = delete;
  const std::vector<std::string>& decisions() const { return decisions_; }
  std::string to_string() const;
  void add(std::string line) { decisions_.push_back(std::move(line)); }

 private:
  std::vector<std::string> decisions_;
  DispatchTrace* previous_ = nullptr;
};

}  // namespace dtensor
