// User ops with their own sharding rules (sharding_rule.h): rule parsing, input
// checks, dispatch through the einsum routine, the backward record, the registry.
#include <map>
#include <mutex>

#include "dtensor/sharding_rule.h"
#include "ops/op_helpers.h"
#include "util/check.h"

namespace dtensor {
namespace {

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

ShardingRule ShardingRule::parse(std::string_view spec) {
  auto fail = [&](size_t pos, const std::string& what) {
    throw std::invalid_argument("[ShardingRule] " + what + " at position " + std::to_string(pos) + " of '" +
                                std::string(spec) + "' (expected e.g. \"mk,kn->mn\")");
  };
  const size_t arrow = spec.find("->");
  if (arrow == std::string_view::npos) fail(spec.size(), "no \"->\"");
  ShardingRule rule;
  std::string current;
  size_t start = 0;
  for (size_t i = 0; i <= arrow; ++i) {
    const char c = i < arrow ? spec[i] : ',';
    if (c == ' ') continue;
    if (c == ',') {
      if (current.empty()) fail(start, "an empty operand");
      rule.inputs.push_back(current);
      current.clear();
      start = i + 1;
    } else if (is_letter(c) || c == '_') {
      current += c;
    } else {
      fail(i, std::string("'") + c + "' is neither a letter nor '_'");
    }
  }
  for (size_t i = arrow + 2; i < spec.size(); ++i) {
    const char c = spec[i];
    if (c == ' ') continue;
    if (!is_letter(c) && c != '_') fail(i, std::string("'") + c + "' is neither a letter nor '_'");
    rule.output += c;
  }
  return rule;
}

std::string ShardingRule::to_string() const {
  std::string out;
  for (size_t j = 0; j < inputs.size(); ++j) out += (j ? "," : "") + inputs[j];
  return out + "->" + output;
}

DistTensor CustomOp::operator()(const std::vector<DistTensor>& inputs) const {
  const char* op = name.c_str();
  DT_CHECK_ARG(!name.empty() && forward, "CustomOp", "expected a name and a forward kernel");
  DT_CHECK_ARG(inputs.size() == rule.inputs.size(), op, "expected ", rule.inputs.size(), " inputs (rule '",
               rule.to_string(), "'), got ", inputs.size());
  dispatch::common_mesh(inputs, op);
  std::map<char, int64_t> sizes;  // letter -> size, the same wherever it appears
  std::vector<Shape> shapes;
  for (size_t j = 0; j < inputs.size(); ++j) {
    const std::string& letters = rule.inputs[j];
    DT_CHECK_ARG(inputs[j].dim() == static_cast<int64_t>(letters.size()), op, "input ", j, " has shape ",
                 inputs[j].shape(), ", the rule '", rule.to_string(), "' gives it ", letters.size(), " dims");
    for (size_t d = 0; d < letters.size(); ++d) {
      if (letters[d] == '_') continue;
      auto [it, fresh] = sizes.emplace(letters[d], inputs[j].size(static_cast<int64_t>(d)));
      DT_CHECK_ARG(fresh || it->second == inputs[j].size(static_cast<int64_t>(d)), op, "letter '", letters[d],
                   "' has size ", it->second, " in one input and ", inputs[j].size(static_cast<int64_t>(d)),
                   " in input ", j, " (rule '", rule.to_string(), "')");
    }
    shapes.push_back(inputs[j].shape());
  }
  Shape out_shape;
  if (output_shape) {
    out_shape = output_shape(shapes);
  } else {
    for (char c : rule.output) {
      DT_CHECK_ARG(c == '_' || sizes.count(c), op, "output letter '", c, "' appears in no input; pass output_shape");
      out_shape.push_back(c == '_' ? 1 : sizes.at(c));
    }
  }
  DT_CHECK_ARG(out_shape.size() == rule.output.size(), op, "output_shape gave ", out_shape, ", the rule '",
               rule.to_string(), "' has ", rule.output.size(), " output dims");
  DistTensor out = ops::run_einsum_lazy(op, {}, inputs, [this] { return rule; }, out_shape, forward);
  if (!backward || !autograd::needs_grad(inputs)) return out;
  std::vector<DistTensor> saved;
  for (const DistTensor& t : inputs) saved.push_back(t.detach());
  const size_t count = inputs.size();
  return ops::with_grad(out, name, inputs, [fn = backward, saved, count, op_name = name](const std::vector<DistTensor>& g) {
    std::vector<DistTensor> grads = fn(g[0], saved);
    DT_CHECK_ARG(grads.size() == count, op_name.c_str(), "backward returned ", grads.size(), " gradients for ",
                 count, " inputs");
    return grads;
  });
}

namespace {
std::mutex registry_mutex;
std::map<std::string, CustomOp, std::less<>>& registry() {
  static std::map<std::string, CustomOp, std::less<>> ops;
  return ops;
}
}  // namespace

void register_op(CustomOp op) {
  DT_CHECK_ARG(!op.name.empty() && op.forward, "register_op", "expected a name and a forward kernel");
  std::lock_guard<std::mutex> lock(registry_mutex);
  const std::string name = op.name;
  DT_CHECK_ARG(registry().emplace(name, std::move(op)).second, "register_op", "an op named '", name,
               "' is registered already");
}

DistTensor call_op(std::string_view name, const std::vector<DistTensor>& inputs) {
  const CustomOp* op = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registry().find(name);
    if (it == registry().end()) {
      std::string names;
      for (const auto& [n, _] : registry()) names += (names.empty() ? "" : ", ") + n;
      throw std::invalid_argument("[call_op] no op named '" + std::string(name) + "' (registered: " +
                                  (names.empty() ? std::string("none") : names) + ")");
    }
    op = &it->second;  // entries are never removed: the pointer stays valid
  }
  return (*op)(inputs);
}

}  // namespace dtensor
