// The distributed sampler's slicing and shuffling, and the token datasets.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "dtensor/data.h"
#include "test_helpers.h"

using namespace dtensor;

TEST(DistributedSampler, RanksTakeDisjointSlicesThatCoverEachGlobalBatch) {
  const int64_t size = 103, global = 12;
  for (int64_t dp : {1, 2, 3, 4}) {
    std::vector<DistributedSampler> ranks;
    for (int64_t r = 0; r < dp; ++r) ranks.emplace_back(size, global, r, dp, /*seed=*/9);
    const DistributedSampler& any = ranks[0];
    EXPECT_EQ(any.steps_per_epoch(), 8);  // 103 / 12, the incomplete batch dropped
    const std::vector<int64_t> order = any.permutation(0);
    std::set<int64_t> seen_in_epoch;
    for (int64_t step = 0; step < any.steps_per_epoch(); ++step) {
      std::vector<int64_t> global_batch;
      for (const DistributedSampler& s : ranks) {
        const std::vector<int64_t> mine = s.batch(step);
        EXPECT_EQ(static_cast<int64_t>(mine.size()), global / dp);
        global_batch.insert(global_batch.end(), mine.begin(), mine.end());
      }
      // Rank slices, concatenated in rank order, are exactly the step's global batch.
      EXPECT_EQ(global_batch, std::vector<int64_t>(order.begin() + step * global,
                                                   order.begin() + (step + 1) * global));
      for (int64_t i : global_batch) EXPECT_TRUE(seen_in_epoch.insert(i).second) << "sample " << i << " twice";
    }
  }
}

TEST(DistributedSampler, PermutationIsDeterministicAndChangesPerEpoch) {
  DistributedSampler a(50, 10, 0, 2, 7), b(50, 10, 1, 2, 7), other_seed(50, 10, 0, 2, 8);
  std::vector<int64_t> epoch0 = a.permutation(0);
  EXPECT_EQ(epoch0, b.permutation(0));  // every rank computes the same order
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_NE(epoch0, a.permutation(1));
  EXPECT_NE(epoch0, other_seed.permutation(0));
  std::vector<int64_t> identity(50);
  for (int64_t i = 0; i < 50; ++i) identity[static_cast<size_t>(i)] = i;
  EXPECT_NE(epoch0, identity);
  EXPECT_EQ(DistributedSampler(50, 10, 0, 1, 7, /*shuffle=*/false).permutation(3), identity);

  const std::vector<int64_t> first = a.batch(2);
  a.set_epoch(1);
  EXPECT_NE(a.batch(2), first);
  // batch_at counts steps across epochs, independent of set_epoch: step 5 + 2 is
  // step 2 of epoch 1.
  EXPECT_EQ(a.batch_at(7), a.batch(2));
  a.set_epoch(0);
  EXPECT_EQ(a.batch_at(2), first);
}

TEST(DistributedSampler, MicroBatchesSplitTheRankSlice) {
  DistributedSampler s(64, 16, 1, 2, 3, true, /*grad_accum=*/4);
  EXPECT_EQ(s.local_batch(), 8);
  EXPECT_EQ(s.micro_batch_size(), 2);
  std::vector<int64_t> joined;
  for (int64_t m = 0; m < 4; ++m) {
    const std::vector<int64_t> micro = s.micro_batch(1, m);
    joined.insert(joined.end(), micro.begin(), micro.end());
    EXPECT_EQ(s.micro_batch_at(1, m), micro);
  }
  EXPECT_EQ(joined, s.batch(1));
}

TEST(DistributedSampler, Errors) {
  EXPECT_THROW_MSG(DistributedSampler(100, 10, 0, 4, 0), std::invalid_argument,
                   "[DistributedSampler] global batch 10 must be a positive multiple of dp_size 4");
  EXPECT_THROW_MSG(DistributedSampler(100, 12, 0, 2, 0, true, 4), std::invalid_argument,
                   "global batch 12 must be a positive multiple of dp_size 2 x grad_accum 4");
  EXPECT_THROW_MSG(DistributedSampler(100, 8, 2, 2, 0), std::invalid_argument, "expected dp_rank in [0, 2), got 2");
  EXPECT_THROW_MSG(DistributedSampler(5, 8, 0, 2, 0), std::invalid_argument,
                   "dataset of 5 samples is smaller than one global batch of 8");
  DistributedSampler s(20, 4, 0, 2, 0);
  EXPECT_THROW_MSG(s.batch(5), std::invalid_argument, "expected step in [0, 5) of the epoch, got 5");
  EXPECT_THROW_MSG(s.micro_batch(0, 1), std::invalid_argument, "expected micro-batch in [0, 1), got 1");
}

TEST(SyntheticLanguage, DeterministicMarkovSequences) {
  SyntheticLanguage data(32, 16, 100, 5);
  EXPECT_EQ(data.size(), 100);
  EXPECT_EQ(data.vocab_size(), 32);
  const TokenBatch batch = data.get_batch({3, 0, 99});
  EXPECT_EQ(batch.inputs.shape(), (Shape{3, 16}));
  EXPECT_EQ(batch.targets.dtype(), DType::I64);
  const std::vector<int64_t> in = batch.inputs.to_vector<int64_t>(), target = batch.targets.to_vector<int64_t>();
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t t = 0; t < 16; ++t) {
      const size_t i = static_cast<size_t>(b * 16 + t);
      if (t + 1 < 16) {
        EXPECT_EQ(target[i], in[i + 1]);  // targets are the inputs shifted by one
      }
      const std::vector<int64_t> next = data.successors(in[i]);
      EXPECT_NE(std::find(next.begin(), next.end(), target[i]), next.end()) << "not a successor";
    }
  }
  // The same seed gives the same data; another seed another chain.
  const TokenBatch again = SyntheticLanguage(32, 16, 100, 5).get_batch({3, 0, 99});
  EXPECT_EQ(again.inputs.to_vector<int64_t>(), in);
  EXPECT_NE(SyntheticLanguage(32, 16, 100, 6).get_batch({3}).inputs.to_vector<int64_t>(),
            data.get_batch({3}).inputs.to_vector<int64_t>());
  EXPECT_NEAR(data.optimal_loss(), 0.8018, 1e-4);
  EXPECT_LT(data.optimal_loss(), std::log(32.0) / 4);
  EXPECT_THROW_MSG(data.get_batch({100}), std::invalid_argument, "sample index 100 out of range [0, 100)");
}

TEST(SyntheticLanguage, TransitionFrequenciesMatchTheStatedProbabilities) {
  SyntheticLanguage data(16, 64, 200, 1);
  std::vector<int64_t> all(200);
  for (int64_t i = 0; i < 200; ++i) all[static_cast<size_t>(i)] = i;
  const TokenBatch batch = data.get_batch(all);
  const std::vector<int64_t> in = batch.inputs.to_vector<int64_t>(), target = batch.targets.to_vector<int64_t>();
  double counts[3] = {0, 0, 0};
  for (size_t i = 0; i < in.size(); ++i) {
    const std::vector<int64_t> next = data.successors(in[i]);
    counts[std::find(next.begin(), next.end(), target[i]) - next.begin()] += 1;
  }
  const double n = static_cast<double>(in.size());  // 12800 transitions
  EXPECT_NEAR(counts[0] / n, 0.7, 0.02);
  EXPECT_NEAR(counts[1] / n, 0.2, 0.02);
  EXPECT_NEAR(counts[2] / n, 0.1, 0.02);
}

TEST(CharDataset, FromFileWindowsVocabularyAndDecode) {
  const std::string path = ::testing::TempDir() + "dtensor_char_dataset_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(path);
    out << "hello world";
  }
  const CharDataset data = CharDataset::from_file(path, 4);
  std::remove(path.c_str());
  EXPECT_EQ(data.vocabulary(), " dehlorw");  // distinct bytes in byte order
  EXPECT_EQ(data.vocab_size(), 8);
  EXPECT_EQ(data.size(), 7);  // 11 bytes, windows of 5
  const TokenBatch batch = data.get_batch({0, 6});
  EXPECT_EQ(data.decode(batch.inputs.select(0, 0)), "hell");
  EXPECT_EQ(data.decode(batch.targets.select(0, 0)), "ello");
  EXPECT_EQ(data.decode(batch.inputs.select(0, 1)), "worl");
  EXPECT_EQ(data.decode(batch.targets.select(0, 1)), "orld");
  EXPECT_EQ(data.decode(data.encode("low")), "low");
  EXPECT_THROW_MSG(data.encode("hex"), std::invalid_argument, "character 120 at position 2 is not in the vocabulary");
}

TEST(CharDataset, MissingEmptyAndShortFilesNameThePath) {
  EXPECT_THROW_MSG(CharDataset::from_file("/nonexistent/input.txt", 8), std::invalid_argument,
                   "[CharDataset] cannot open data file \"/nonexistent/input.txt\"");
  const std::string path = ::testing::TempDir() + "dtensor_char_empty_" + std::to_string(::getpid()) + ".txt";
  { std::ofstream out(path); }
  EXPECT_THROW_MSG(CharDataset::from_file(path, 8), std::invalid_argument, "\"" + path + "\" is empty");
  { std::ofstream out(path); out << "abc"; }
  EXPECT_THROW_MSG(CharDataset::from_file(path, 8), std::invalid_argument,
                   "has 3 bytes, expected at least seq_len + 1 = 9");
  std::remove(path.c_str());
}
