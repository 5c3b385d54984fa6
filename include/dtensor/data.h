// Data for training: a distributed sampler and token datasets for language models.
//
//   SyntheticLanguage data(/*vocab=*/64, /*seq_len=*/32, /*num_sequences=*/4096, /*seed=*/1);
//   DistributedSampler sampler(data.size(), /*global_batch=*/16, dp_rank, dp_size, /*seed=*/0);
//   for (int64_t step = 0; step < steps; ++step) {
//     TokenBatch batch = data.get_batch(sampler.batch_at(step));   // [B/dp, T] I64
//     ...
//   }
//
// Data-parallel ranks see disjoint contiguous slices of the same global batch, so the
// mean of their gradients is the gradient of the global batch: training on N ranks
// follows the same trajectory as on one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/tensor.h"

namespace dtensor {

// Which samples each data-parallel rank uses at each step.
//
// An epoch is a permutation of [0, dataset_size) (the identity without shuffle),
// cut into steps_per_epoch() = dataset_size / global_batch global batches (an
// incomplete last batch is dropped, so every step has the same size on every rank).
// Rank r takes the r-th of dp_size contiguous slices of each global batch. The
// permutation is a Fisher-Yates shuffle driven by Philox keyed by (seed, epoch):
// every rank computes the same order with no communication, and each epoch differs.
// One sampler per rank (it caches the current epoch's order; not shared across threads).
class DistributedSampler {
 public:
  // grad_accum splits each rank's slice into that many micro-batches (micro_batch()).
  // Throws when global_batch is not divisible by dp_size * grad_accum, when dp_rank is
  // outside [0, dp_size), or when the dataset is smaller than one global batch.
  DistributedSampler(int64_t dataset_size, int64_t global_batch, int64_t dp_rank, int64_t dp_size, uint64_t seed,
                     bool shuffle = true, int64_t grad_accum = 1);

  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  int64_t steps_per_epoch() const { return dataset_size_ / global_batch_; }
  int64_t local_batch() const { return global_batch_ / dp_size_; }  // per rank per step
  int64_t micro_batch_size() const { return local_batch() / grad_accum_; }
  int64_t dataset_size() const { return dataset_size_; }
  int64_t global_batch() const { return global_batch_; }
  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }

  // This rank's samples of step `step` of the current epoch, step in [0, steps_per_epoch).
  std::vector<int64_t> batch(int64_t step) const;
  // Micro-batch `micro` in [0, grad_accum) of batch(step).
  std::vector<int64_t> micro_batch(int64_t step, int64_t micro) const;
  // The same for a step counted from the start of training: epoch
  // global_step / steps_per_epoch(), independent of set_epoch (a restarted run resumes
  // the same order from the step number alone).
  std::vector<int64_t> batch_at(int64_t global_step) const;
  std::vector<int64_t> micro_batch_at(int64_t global_step, int64_t micro) const;

  // The whole order of `epoch` (the same on every rank).
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  std::vector<int64_t> slice(int64_t epoch, int64_t step, int64_t micro, int64_t count) const;
  const std::vector<int64_t>& cached_permutation(int64_t epoch) const;

  int64_t dataset_size_, global_batch_, dp_rank_, dp_size_, grad_accum_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

// Inputs and next-token targets, both [B, T] I64 (targets[b, t] = inputs[b, t + 1]
// within the underlying sequence).
struct TokenBatch {
  Tensor inputs;
  Tensor targets;
};

// A fixed collection of token sequences of length seq_len + 1.
class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual int64_t size() const = 0;  // number of samples
  virtual int64_t vocab_size() const = 0;
  virtual int64_t seq_len() const = 0;  // T
  // The samples at `indices` (each in [0, size())), in that order.
  TokenBatch get_batch(const std::vector<int64_t>& indices) const;

 protected:
  // Writes the seq_len + 1 tokens of sample `index` into out.
  virtual void sample(int64_t index, int64_t* out) const = 0;
  virtual const char* kind() const = 0;
};

// A built-in language: sequences from a fixed random first-order Markov chain.
//
// Every token has three successors (distinct tokens drawn from the seed) taken with
// probabilities 0.7, 0.2 and 0.1. The first token of a sequence is uniform. A model
// that has learnt the chain predicts each target from the current token alone, so
// the best achievable cross-entropy is the chain's entropy,
//   H = -(0.7 ln 0.7 + 0.2 ln 0.2 + 0.1 ln 0.1) = 0.8018 nats (optimal_loss()),
// against ln(vocab) for an untrained model (4.16 for vocab 64). A small GPT (even one
// layer) learns the bigram table within a few hundred AdamW steps. Samples are
// generated on demand from (seed, index): no storage, the same on every rank.
class SyntheticLanguage : public TokenDataset {
 public:
  SyntheticLanguage(int64_t vocab, int64_t seq_len, int64_t num_sequences, uint64_t seed);
  int64_t size() const override { return num_sequences_; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t seq_len() const override { return seq_len_; }
  double optimal_loss() const;
  // The successors of `token`, most likely first.
  std::vector<int64_t> successors(int64_t token) const;
  static constexpr int kSuccessors = 3;
  static constexpr double kProbabilities[kSuccessors] = {0.7, 0.2, 0.1};

 protected:
  void sample(int64_t index, int64_t* out) const override;
  const char* kind() const override { return "SyntheticLanguage"; }

 private:
  int64_t vocab_, seq_len_, num_sequences_;
  uint64_t seed_;
  std::vector<int64_t> successors_;  // vocab x kSuccessors
};

// Character-level text: the vocabulary is the distinct bytes of the file in byte
// order (multi-byte UTF-8 characters count as several tokens). Sample i is the
// window of seq_len + 1 bytes starting at byte i, so size() = bytes - seq_len.
class CharDataset : public TokenDataset {
 public:
  // Throws std::invalid_argument naming the path when it cannot be read, is empty, or
  // is shorter than seq_len + 1 bytes.
  static CharDataset from_file(const std::string& path, int64_t seq_len);
  static CharDataset from_text(std::string text, int64_t seq_len, const std::string& source = "<text>");
  int64_t size() const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(chars_.size()); }
  int64_t seq_len() const override { return seq_len_; }
  std::string decode(const std::vector<int64_t>& ids) const;
  std::string decode(const Tensor& ids) const;  // any shape, row-major
  // Throws naming the first character that is not in the vocabulary.
  std::vector<int64_t> encode(const std::string& text) const;
  const std::string& vocabulary() const { return chars_; }

 protected:
  void sample(int64_t index, int64_t* out) const override;
  const char* kind() const override { return "CharDataset"; }

 private:
  CharDataset() = default;
  std::string chars_;            // id -> byte
  std::vector<int16_t> to_id_;   // byte -> id, -1 when absent
  std::vector<int64_t> tokens_;  // the text as ids
  int64_t seq_len_ = 0;
};

}  // namespace dtensor
