// Placements: the chunk rule, nested shard blocks, string form and parser, validation.
// Pure arithmetic: no ranks are started.
#include <gtest/gtest.h>

#include <random>

#include "dtensor/placement.h"
#include "mesh/mesh_index.h"
#include "test_helpers.h"

namespace dtensor {
namespace {

TEST(ChunkRule, WorkedExample) {
  // 5 rows on 4 ranks: c = 2 -> 2, 2, 1, 0 (the PyTorch/DESIGN example).
  EXPECT_EQ(chunk_sizes(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(chunk_range(5, 4, 2), (Range{4, 1}));
  EXPECT_EQ(chunk_range(5, 4, 3), (Range{5, 0}));
  // 1 element on 4 ranks: the trailing three pieces are empty at the end.
  EXPECT_EQ(chunk_sizes(1, 4), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(chunk_sizes(0, 3), (std::vector<int64_t>{0, 0, 0}));
  // 10 on 4: c = 3 -> 3, 3, 3, 1 (not the 3, 3, 2, 2 of a balanced split).
  EXPECT_EQ(chunk_sizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
}

TEST(ChunkRule, PiecesTileTheRangeInOrder) {
  for (int64_t n = 0; n <= 40; ++n) {
    for (int64_t k = 1; k <= 9; ++k) {
      const int64_t c = (n + k - 1) / k;
      int64_t expected_offset = 0;
      bool seen_short = false;
      for (int64_t r = 0; r < k; ++r) {
        const Range piece = chunk_range(n, k, r);
        ASSERT_EQ(piece.offset, expected_offset) << "n=" << n << " k=" << k << " r=" << r;
        ASSERT_GE(piece.length, 0);
        ASSERT_LE(piece.length, c);
        // Full pieces first, then at most one short non-empty piece, then empty ones.
        if (seen_short) ASSERT_EQ(piece.length, 0) << "n=" << n << " k=" << k << " r=" << r;
        if (piece.length < c) seen_short = true;
        expected_offset = piece.end();
      }
      ASSERT_EQ(expected_offset, n) << "n=" << n << " k=" << k;
    }
  }
}

TEST(ChunkRule, AgreesWithTensorChunk) {
  // Tensor::chunk is an independent implementation of the same rule.
  for (int64_t n = 0; n <= 25; ++n) {
    const Tensor t = Tensor::arange(n);
    for (int64_t k = 1; k <= 7; ++k) {
      const auto pieces = t.chunk(k);
      const auto sizes = chunk_sizes(n, k);
      ASSERT_EQ(pieces.size(), sizes.size());
      for (int64_t r = 0; r < k; ++r) {
        ASSERT_EQ(pieces[r].size(0), sizes[r]) << "n=" << n << " k=" << k << " r=" << r;
      }
    }
  }
}

TEST(ChunkRule, RejectsBadArguments) {
  EXPECT_THROW_MSG(chunk_range(5, 0, 0), std::invalid_argument, "[chunk_range]");
  EXPECT_THROW_MSG(chunk_range(5, 2, 2), std::invalid_argument, "index 2");
  EXPECT_THROW_MSG(chunk_range(-1, 2, 0), std::invalid_argument, "size -1");
}

// ---- nested blocks ---------------------------------------------------------------------

using mesh_index::coordinate_of;

TEST(LocalBlock, NestedShardsFollowTheOrder) {
  const Shape mesh{2, 2};
  // Default: mesh dim 0 outermost. 8 rows: (i, j) holds rows [4i + 2j, +2).
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      EXPECT_EQ(local_block({8, 3}, mesh, {Shard(0), Shard(0)}, {i, j}),
                (std::vector<Range>{{4 * i + 2 * j, 2}, {0, 3}}));
      // order=1 on mesh dim 0 makes mesh dim 1 outermost (FSDP over TP).
      EXPECT_EQ(local_block({8, 3}, mesh, {Shard(0, 1), Shard(0, 0)}, {i, j}),
                (std::vector<Range>{{4 * j + 2 * i, 2}, {0, 3}}));
    }
  }
  // Uneven: 7 rows -> outer pieces 4 and 3, inner pieces 2,2 and 2,1.
  EXPECT_EQ(local_block({7}, mesh, {Shard(0), Shard(0)}, {1, 0}), (std::vector<Range>{{4, 2}}));
  EXPECT_EQ(local_block({7}, mesh, {Shard(0), Shard(0)}, {1, 1}), (std::vector<Range>{{6, 1}}));
  // Negative dims and different tensor dims on each mesh dim.
  EXPECT_EQ(local_block({7, 5}, mesh, {Shard(0), Shard(-1)}, {1, 1}),
            (std::vector<Range>{{4, 3}, {3, 2}}));
  EXPECT_EQ(local_shape({7, 5}, mesh, {Partial(), Shard(1)}, {1, 1}), (Shape{7, 2}));
}

TEST(LocalBlock, ShardNestingSortsByOrderThenMeshDim) {
  const Placements p{Shard(1, 2), Shard(0), Shard(1, 0), Replicate(), Shard(1, 0)};
  const auto nesting = shard_nesting(p, 3);
  ASSERT_EQ(nesting.size(), 3u);
  EXPECT_EQ(nesting[0], (std::vector<int>{1}));
  EXPECT_EQ(nesting[1], (std::vector<int>{2, 4, 0}));
  EXPECT_TRUE(nesting[2].empty());
}

// Every element of the global tensor is held by exactly (replication factor) mesh
// coordinates: the product of the sizes of the mesh dims that do not shard.
TEST(LocalBlock, RandomLayoutsTileTheTensorOncePerReplica) {
  const std::vector<Shape> meshes{{1}, {3}, {5}, {2, 2}, {2, 3}, {1, 4}, {2, 2, 2}, {3, 1, 2}};
  std::mt19937 rng(1234);
  for (const Shape& mesh : meshes) {
    for (int trial = 0; trial < 60; ++trial) {
      const int64_t ndim = 1 + static_cast<int64_t>(rng() % 3);
      Shape shape(ndim);
      for (auto& s : shape) s = static_cast<int64_t>(rng() % 10);  // 0..9: empty and uneven
      Placements placements;
      int64_t replicas = 1;
      for (size_t m = 0; m < mesh.size(); ++m) {
        switch (rng() % 4) {
          case 0: placements.push_back(Replicate()); replicas *= mesh[m]; break;
          case 1: placements.push_back(Partial()); replicas *= mesh[m]; break;
          default: {
            const auto d = static_cast<int64_t>(rng() % ndim);
            placements.push_back(Shard(rng() % 2 ? d : d - ndim, static_cast<int>(rng() % 3)));
          }
        }
      }
      std::vector<int64_t> holders(static_cast<size_t>(shape_numel(shape)), 0);
      const Strides strides = contiguous_strides(shape);
      for (int64_t r = 0; r < shape_numel(mesh); ++r) {
        const auto block = local_block(shape, mesh, placements, coordinate_of(r, mesh));
        Shape lengths;
        for (int64_t d = 0; d < ndim; ++d) {
          ASSERT_GE(block[d].offset, 0);
          ASSERT_LE(block[d].end(), shape[d]);
          lengths.push_back(block[d].length);
        }
        ASSERT_EQ(local_shape(shape, mesh, placements, coordinate_of(r, mesh)), lengths);
        testing::for_each_index(lengths, [&](const std::vector<int64_t>& i) {
          int64_t flat = 0;
          for (int64_t d = 0; d < ndim; ++d) flat += (block[d].offset + i[d]) * strides[d];
          ++holders[flat];
        });
      }
      for (size_t e = 0; e < holders.size(); ++e) {
        ASSERT_EQ(holders[e], replicas) << "element " << e << " of " << shape_to_string(shape)
                                        << " under " << placements_to_string(placements)
                                        << " on mesh " << shape_to_string(mesh);
      }
    }
  }
}

// ---- strings -------------------------------------------------------------------------------

TEST(PlacementString, ToString) {
  EXPECT_EQ(Replicate().to_string(), "R");
  EXPECT_EQ(Shard(0).to_string(), "S(0)");
  EXPECT_EQ(Shard(-1).to_string(), "S(-1)");
  EXPECT_EQ(Shard(0, 1).to_string(), "S(0,order=1)");
  EXPECT_EQ(Partial().to_string(), "P(sum)");
  EXPECT_EQ(Partial(ReduceOp::Avg).to_string(), "P(avg)");
  EXPECT_EQ(Partial(ReduceOp::Max).to_string(), "P(max)");
  EXPECT_EQ(Partial(ReduceOp::Min).to_string(), "P(min)");
  EXPECT_EQ(placements_to_string({Shard(0), Replicate()}), "S(0),R");
  EXPECT_EQ(placements_to_string({}), "");
}

TEST(PlacementString, ParseAcceptsVariants) {
  EXPECT_EQ(parse_placements("S(0),R"), (Placements{Shard(0), Replicate()}));
  EXPECT_EQ(parse_placements("  s( 1 ) ,  r "), (Placements{Shard(1), Replicate()}));
  EXPECT_EQ(parse_placements("P"), (Placements{Partial(ReduceOp::Sum)}));
  EXPECT_EQ(parse_placements("p(MAX),P(Min),p(avg)"),
            (Placements{Partial(ReduceOp::Max), Partial(ReduceOp::Min), Partial(ReduceOp::Avg)}));
  EXPECT_EQ(parse_placements("Shard(-1), Replicate(), Partial(sum)"),
            (Placements{Shard(-1), Replicate(), Partial()}));
  EXPECT_EQ(parse_placements("S(0, order = 1),S(0,2)"), (Placements{Shard(0, 1), Shard(0, 2)}));
  EXPECT_EQ(parse_placements(""), Placements{});
}

TEST(PlacementString, RandomRoundTrips) {
  std::mt19937 rng(7);
  const std::vector<Placement> pool{Replicate(), Shard(0), Shard(2), Shard(-1), Shard(1, 1),
                                    Shard(-2, 3), Partial(), Partial(ReduceOp::Avg),
                                    Partial(ReduceOp::Max), Partial(ReduceOp::Min)};
  for (int trial = 0; trial < 200; ++trial) {
    Placements p(1 + rng() % 4);
    for (auto& x : p) x = pool[rng() % pool.size()];
    const std::string text = placements_to_string(p);
    EXPECT_EQ(parse_placements(text), p) << text;
  }
}

TEST(PlacementString, ParseErrorsNameThePosition) {
  EXPECT_THROW_MSG(parse_placements("S(0),X"), std::invalid_argument,
                   "[parse_placements] in 'S(0),X' at position 5: expected R, S(dim) or P(op), got 'X'");
  EXPECT_THROW_MSG(parse_placements("S("), std::invalid_argument,
                   "at position 2: expected a shard dim, got end of text");
  EXPECT_THROW_MSG(parse_placements("S(a)"), std::invalid_argument, "at position 2: expected a shard dim, got 'a'");
  EXPECT_THROW_MSG(parse_placements("S(0"), std::invalid_argument, "expected ')', got end of text");
  EXPECT_THROW_MSG(parse_placements("P(prod)"), std::invalid_argument,
                   "at position 2: expected a reduce op (sum, avg, max or min), got 'prod'");
  EXPECT_THROW_MSG(parse_placements("R,,R"), std::invalid_argument, "at position 2: expected R, S(dim) or P(op), got ','");
  EXPECT_THROW_MSG(parse_placements("R R"), std::invalid_argument, "at position 2: expected ',' or end of text, got 'R'");
  EXPECT_THROW_MSG(parse_placements("S(0,size=1)"), std::invalid_argument, "expected 'order='");
  EXPECT_THROW_MSG(parse_placements("R,"), std::invalid_argument, "got end of text");
}

// ---- validation ------------------------------------------------------------------------------

TEST(ValidatePlacements, NormalizesAndAcceptsGoodLists) {
  EXPECT_EQ(validate_placements({Shard(-1), Replicate()}, 2, 3, "op"), (Placements{Shard(2), Replicate()}));
  EXPECT_EQ(validate_placements({Partial(), Partial(ReduceOp::Avg)}, 2, 1, "op").size(), 2u);
  EXPECT_EQ(validate_placements({Partial(ReduceOp::Max), Partial(ReduceOp::Max)}, 2, 1, "op").size(), 2u);
  EXPECT_EQ(Shard(-2).normalized(2), Shard(0));
  EXPECT_EQ(Shard(-1, 3).normalized(4), Shard(3, 3));
  EXPECT_EQ(Partial().normalized(0), Partial());
}

TEST(ValidatePlacements, ClearErrors) {
  EXPECT_THROW_MSG(validate_placements({Shard(0)}, 2, 2, "distribute"), std::invalid_argument,
                   "[distribute] expected 2 placements (one per mesh dim), got 1: 'S(0)'");
  EXPECT_THROW_MSG(validate_placements({Shard(2), Replicate()}, 2, 2, "distribute"), std::invalid_argument,
                   "[distribute] S(2) on mesh dim 0 is out of range for a tensor of 2 dims: expected a "
                   "shard dim in [-2, 1]");
  EXPECT_THROW_MSG(validate_placements({Replicate(), Shard(-3)}, 2, 2, "op"), std::invalid_argument,
                   "S(-3) on mesh dim 1");
  EXPECT_THROW_MSG(validate_placements({Shard(0)}, 1, 0, "op"), std::invalid_argument,
                   "tensor of 0 dims");
  EXPECT_THROW_MSG(validate_placements({Partial(ReduceOp::Max), Partial()}, 2, 1, "distribute"),
                   std::invalid_argument, "[distribute] Partial ops cannot be mixed across mesh dims");
  EXPECT_THROW_MSG(validate_placements({Partial(ReduceOp::Min), Partial(ReduceOp::Avg)}, 2, 1, "op"),
                   std::invalid_argument, "'P(min),P(avg)'");
  EXPECT_THROW_MSG(Partial(ReduceOp::Product), std::invalid_argument, "[Partial] expected a reduce op");
  EXPECT_THROW_MSG(Shard(3).normalized(2), std::invalid_argument, "[Placement::normalized] S(3)");
}

}  // namespace
}  // namespace dtensor
