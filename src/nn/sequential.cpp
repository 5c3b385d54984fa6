// nn::Sequential.
#include "dtensor/nn/sequential.h"

#include "dtensor/nn/checkpoint.h"
#include "util/check.h"

namespace dtensor::nn {

namespace {

std::string names_of(const std::vector<Sequential::Entry>& entries) {
  std::string out;
  for (const auto& [name, _] : entries) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

}  // namespace

void Sequential::check_new_name(const std::string& name) const {
  DT_CHECK_ARG(!name.empty() && name.front() != '.' && name.back() != '.', "Sequential",
               "expected a child name without leading or trailing dots, got '", name, "'");
  for (const auto& [existing, _] : entries_) {
    DT_CHECK_ARG(existing != name, "Sequential", "a child named '", name, "' exists already");
  }
  for (const std::string& existing : shared_) {
    DT_CHECK_ARG(existing != name, "Sequential", "a shared module named '", name, "' exists already");
  }
}

DistTensor Sequential::forward(const DistTensor& x) {
  DistTensor y = x;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Module& child = *entries_[i].second;
    y = checkpointed_[i] ? checkpoint(child, y) : child(y);
  }
  return y;
}

size_t Sequential::index_of(const std::string& name) const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].first == name) return i;
  }
  throw std::invalid_argument("[Sequential] no child named '" + name + "' (children: " + names_of(entries_) + ")");
}

std::shared_ptr<Sequential> Sequential::slice(size_t begin, size_t end) const {
  DT_CHECK_ARG(begin <= end && end <= entries_.size(), "Sequential", "slice [", begin, ", ", end, ") does not fit ",
               entries_.size(), " children");
  auto out = std::make_shared<Sequential>();
  for (size_t i = begin; i < end; ++i) out->append(entries_[i].first, entries_[i].second, checkpointed_[i]);
  return out;
}

}  // namespace dtensor::nn
