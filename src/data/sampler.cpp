// DistributedSampler: per-epoch permutation by counter-based randomness, cut into
// global batches and per-rank slices.
#include "dtensor/data.h"
#include "dtensor/random.h"
#include "util/check.h"

namespace dtensor {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t global_batch, int64_t dp_rank,
                                       int64_t dp_size, uint64_t seed, bool shuffle, int64_t grad_accum)
    : dataset_size_(dataset_size), global_batch_(global_batch), dp_rank_(dp_rank), dp_size_(dp_size),
      grad_accum_(grad_accum), seed_(seed), shuffle_(shuffle) {
  DT_CHECK_ARG(dp_size >= 1, "DistributedSampler", "expected dp_size >= 1, got ", dp_size);
  DT_CHECK_ARG(dp_rank >= 0 && dp_rank < dp_size, "DistributedSampler", "expected dp_rank in [0, ",
               dp_size, "), got ", dp_rank);
  DT_CHECK_ARG(grad_accum >= 1, "DistributedSampler", "expected grad_accum >= 1, got ", grad_accum);
  DT_CHECK_ARG(global_batch >= 1 && global_batch % (dp_size * grad_accum) == 0, "DistributedSampler",
               "global batch ", global_batch, " must be a positive multiple of dp_size ", dp_size,
               grad_accum > 1 ? detail::concat(" x grad_accum ", grad_accum) : std::string(),
               " (each data-parallel rank takes an equal slice)");
  DT_CHECK_ARG(dataset_size >= global_batch, "DistributedSampler", "dataset of ", dataset_size,
               " samples is smaller than one global batch of ", global_batch);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  DT_CHECK_ARG(epoch >= 0, "DistributedSampler", "expected epoch >= 0, got ", epoch);
  epoch_ = epoch;
}

std::vector<int64_t> DistributedSampler::permutation(int64_t epoch) const {
  DT_CHECK_ARG(epoch >= 0, "DistributedSampler", "expected epoch >= 0, got ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  for (int64_t i = 0; i < dataset_size_; ++i) order[static_cast<size_t>(i)] = i;
  if (!shuffle_) return order;
  // Fisher-Yates from the back: swap i with a uniform j in [0, i]. The epoch selects
  // the Philox stream, so each epoch has its own order and needs no previous one.
  for (int64_t i = dataset_size_ - 1; i > 0; --i) {
    const random::Philox4x32 r =
        random::philox4x32(seed_, static_cast<uint64_t>(i), static_cast<uint32_t>(epoch));
    const uint64_t bits = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    const int64_t j = static_cast<int64_t>(bits % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

const std::vector<int64_t>& DistributedSampler::cached_permutation(int64_t epoch) const {
  if (cached_epoch_ != epoch) {
    cached_order_ = permutation(epoch);
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

std::vector<int64_t> DistributedSampler::slice(int64_t epoch, int64_t step, int64_t micro,
                                               int64_t count) const {
  const std::vector<int64_t>& order = cached_permutation(epoch);
  const int64_t begin = step * global_batch_ + dp_rank_ * local_batch() + micro * micro_batch_size();
  return std::vector<int64_t>(order.begin() + begin, order.begin() + begin + count);
}

std::vector<int64_t> DistributedSampler::batch(int64_t step) const {
  DT_CHECK_ARG(step >= 0 && step < steps_per_epoch(), "DistributedSampler", "expected step in [0, ",
               steps_per_epoch(), ") of the epoch, got ", step);
  return slice(epoch_, step, 0, local_batch());
}

std::vector<int64_t> DistributedSampler::micro_batch(int64_t step, int64_t micro) const {
  DT_CHECK_ARG(step >= 0 && step < steps_per_epoch(), "DistributedSampler", "expected step in [0, ",
               steps_per_epoch(), ") of the epoch, got ", step);
  DT_CHECK_ARG(micro >= 0 && micro < grad_accum_, "DistributedSampler", "expected micro-batch in [0, ",
               grad_accum_, "), got ", micro);
  return slice(epoch_, step, micro, micro_batch_size());
}

std::vector<int64_t> DistributedSampler::batch_at(int64_t global_step) const {
  DT_CHECK_ARG(global_step >= 0, "DistributedSampler", "expected step >= 0, got ", global_step);
  return slice(global_step / steps_per_epoch(), global_step % steps_per_epoch(), 0, local_batch());
}

std::vector<int64_t> DistributedSampler::micro_batch_at(int64_t global_step, int64_t micro) const {
  DT_CHECK_ARG(global_step >= 0, "DistributedSampler", "expected step >= 0, got ", global_step);
  DT_CHECK_ARG(micro >= 0 && micro < grad_accum_, "DistributedSampler", "expected micro-batch in [0, ",
               grad_accum_, "), got ", micro);
  return slice(global_step / steps_per_epoch(), global_step % steps_per_epoch(), micro,
               micro_batch_size());
}

}  // namespace dtensor
