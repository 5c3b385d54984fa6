// Agreement of the ranks of a save or a load (exchange.h).
#include "checkpoint/exchange.h"

#include <cstring>
#include <stdexcept>

#include "dtensor/tensor.h"

namespace dtensor::checkpoint::detail {

Outcome Outcome::current_failure() {
  try {
    throw;
  } catch (const std::invalid_argument& e) {
    return {'A', e.what()};
  } catch (const std::exception& e) {
    return {'R', e.what()};
  } catch (...) {
    return {'R', "unknown exception"};
  }
}

std::vector<Outcome> exchange(const Group& group, const Outcome& mine) {
  if (group.size() == 1) return {mine};
  // The kind, then the text, as I64 words after a byte count (the collectives move
  // tensors; all_gather_list takes pieces of any length).
  const std::string bytes = mine.kind + mine.text;
  std::vector<int64_t> words(1 + (bytes.size() + 7) / 8, 0);
  words[0] = static_cast<int64_t>(bytes.size());
  std::memcpy(words.data() + 1, bytes.data(), bytes.size());
  const std::vector<Tensor> all = all_gather_list(group, Tensor::from_vector(words));
  std::vector<Outcome> out;
  out.reserve(all.size());
  for (const Tensor& t : all) {
    const std::vector<int64_t> w = t.to_vector<int64_t>();
    std::string theirs(static_cast<size_t>(w[0]), '\0');
    std::memcpy(theirs.data(), w.data() + 1, theirs.size());
    out.push_back({theirs.empty() ? 'R' : theirs[0], theirs.empty() ? "" : theirs.substr(1)});
  }
  return out;
}

void throw_first_failure(const std::vector<Outcome>& outcomes, int my_rank) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (!outcomes[r].failed()) continue;
    const std::string message =
        static_cast<int>(r) == my_rank ? outcomes[r].text : "rank " + std::to_string(r) + ": " + outcomes[r].text;
    if (outcomes[r].kind == 'A') throw std::invalid_argument(message);
    throw std::runtime_error(message);
  }
}

}  // namespace dtensor::checkpoint::detail
