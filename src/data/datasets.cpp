// Token datasets: the synthetic Markov-chain language and character-level text.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "dtensor/data.h"
#include "dtensor/random.h"
#include "util/check.h"

namespace dtensor {

TokenBatch TokenDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t batch = static_cast<int64_t>(indices.size());
  const int64_t t = seq_len();
  std::vector<int64_t> inputs(static_cast<size_t>(batch * t)), targets(inputs.size());
  std::vector<int64_t> window(static_cast<size_t>(t + 1));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t index = indices[static_cast<size_t>(b)];
    DT_CHECK_ARG(index >= 0 && index < size(), kind(), "sample index ", index, " out of range [0, ",
                 size(), ")");
    sample(index, window.data());
    std::copy(window.begin(), window.end() - 1, inputs.begin() + b * t);
    std::copy(window.begin() + 1, window.end(), targets.begin() + b * t);
  }
  return {Tensor::from_vector(inputs, {batch, t}), Tensor::from_vector(targets, {batch, t})};
}

// ---- SyntheticLanguage ------------------------------------------------------------------

namespace {
// Separate Philox streams so that the chain and the sequences never share numbers.
constexpr uint32_t kChainStream = 1;
constexpr uint32_t kStartStream = 2;
constexpr uint32_t kStepStream = 3;
}  // namespace

SyntheticLanguage::SyntheticLanguage(int64_t vocab, int64_t seq_len, int64_t num_sequences, uint64_t seed)
    : vocab_(vocab), seq_len_(seq_len), num_sequences_(num_sequences), seed_(seed) {
  DT_CHECK_ARG(vocab > kSuccessors, "SyntheticLanguage", "expected vocab > ", kSuccessors,
               " (each token needs distinct successors), got ", vocab);
  DT_CHECK_ARG(seq_len >= 1, "SyntheticLanguage", "expected seq_len >= 1, got ", seq_len);
  DT_CHECK_ARG(num_sequences >= 1, "SyntheticLanguage", "expected num_sequences >= 1, got ", num_sequences);
  successors_.resize(static_cast<size_t>(vocab * kSuccessors));
  for (int64_t token = 0; token < vocab; ++token) {
    int64_t* next = &successors_[static_cast<size_t>(token * kSuccessors)];
    uint64_t draw = static_cast<uint64_t>(token) << 20;  // room for retries per token
    for (int k = 0; k < kSuccessors; ++k) {
      // Redraw until distinct, so the probabilities stay 0.7/0.2/0.1 as documented.
      while (true) {
        const auto r = random::philox4x32(seed, draw++, kChainStream);
        const int64_t candidate = static_cast<int64_t>(r[0] % static_cast<uint32_t>(vocab));
        if (std::find(next, next + k, candidate) == next + k) {
          next[k] = candidate;
          break;
        }
      }
    }
  }
}

double SyntheticLanguage::optimal_loss() const {
  double h = 0;
  for (double p : kProbabilities) h -= p * std::log(p);
  return h;
}

std::vector<int64_t> SyntheticLanguage::successors(int64_t token) const {
  DT_CHECK_ARG(token >= 0 && token < vocab_, "SyntheticLanguage", "token ", token, " out of range [0, ",
               vocab_, ")");
  const auto begin = successors_.begin() + token * kSuccessors;
  return std::vector<int64_t>(begin, begin + kSuccessors);
}

void SyntheticLanguage::sample(int64_t index, int64_t* out) const {
  const uint64_t base = static_cast<uint64_t>(index) * static_cast<uint64_t>(seq_len_ + 1);
  out[0] = static_cast<int64_t>(random::philox4x32(seed_, base, kStartStream)[0] %
                                static_cast<uint32_t>(vocab_));
  for (int64_t t = 1; t <= seq_len_; ++t) {
    const float u = random::uniform_from_bits(
        random::philox4x32(seed_, base + static_cast<uint64_t>(t), kStepStream)[0]);
    int k = 0;
    double cumulative = kProbabilities[0];
    while (k + 1 < kSuccessors && u >= cumulative) cumulative += kProbabilities[++k];
    out[t] = successors_[static_cast<size_t>(out[t - 1] * kSuccessors + k)];
  }
}

// ---- CharDataset ---------------------------------------------------------------------------

CharDataset CharDataset::from_file(const std::string& path, int64_t seq_len) {
  std::ifstream in(path, std::ios::binary);
  DT_CHECK_ARG(in.good(), "CharDataset", "cannot open data file \"", path, "\"");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DT_CHECK_ARG(!in.bad(), "CharDataset", "error reading data file \"", path, "\"");
  return from_text(std::move(text), seq_len, path);
}

CharDataset CharDataset::from_text(std::string text, int64_t seq_len, const std::string& source) {
  DT_CHECK_ARG(seq_len >= 1, "CharDataset", "expected seq_len >= 1, got ", seq_len);
  DT_CHECK_ARG(!text.empty(), "CharDataset", "data file \"", source, "\" is empty");
  DT_CHECK_ARG(static_cast<int64_t>(text.size()) > seq_len, "CharDataset", "data file \"", source,
               "\" has ", text.size(), " bytes, expected at least seq_len + 1 = ", seq_len + 1);
  CharDataset d;
  d.seq_len_ = seq_len;
  bool present[256] = {};
  for (char c : text) present[static_cast<unsigned char>(c)] = true;
  d.to_id_.assign(256, -1);
  for (int byte = 0; byte < 256; ++byte) {
    if (!present[byte]) continue;
    d.to_id_[static_cast<size_t>(byte)] = static_cast<int16_t>(d.chars_.size());
    d.chars_.push_back(static_cast<char>(byte));
  }
  d.tokens_.reserve(text.size());
  for (char c : text) d.tokens_.push_back(d.to_id_[static_cast<unsigned char>(c)]);
  return d;
}

int64_t CharDataset::size() const { return static_cast<int64_t>(tokens_.size()) - seq_len_; }

void CharDataset::sample(int64_t index, int64_t* out) const {
  std::copy(tokens_.begin() + index, tokens_.begin() + index + seq_len_ + 1, out);
}

std::string CharDataset::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    DT_CHECK_ARG(id >= 0 && id < vocab_size(), "CharDataset", "token id ", id, " out of range [0, ",
                 vocab_size(), ")");
    out.push_back(chars_[static_cast<size_t>(id)]);
  }
  return out;
}

std::string CharDataset::decode(const Tensor& ids) const {
  DT_CHECK_ARG(ids.dtype() == DType::I64 || ids.dtype() == DType::I32, "CharDataset",
               "expected integer token ids, got ", dtype_name(ids.dtype()));
  return decode(ids.to(DType::I64).to_vector<int64_t>());
}

std::vector<int64_t> CharDataset::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int16_t id = to_id_[static_cast<unsigned char>(text[i])];
    DT_CHECK_ARG(id >= 0, "CharDataset", "character ", static_cast<int>(static_cast<unsigned char>(text[i])),
                 " at position ", i, " is not in the vocabulary of ", vocab_size(), " characters");
    ids.push_back(id);
  }
  return ids;
}

}  // namespace dtensor
