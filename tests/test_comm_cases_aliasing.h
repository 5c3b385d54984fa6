// Cases of test_comm_cases.h in which an `_into` output overlaps its input
// (included inside namespace comm_cases, after test_comm_cases_impl.h). Every
// collective must give what it gives with separate buffers: in place where the
// backend supports it, through a staged copy of the input otherwise.
#pragma once

// The sum over ranks of small_value(rank, first + i), for i < count.
inline std::vector<double> summed(int n, int64_t first, int64_t count) {
  std::vector<double> want(count);
  for (int64_t i = 0; i < count; ++i) {
    want[i] = expected_reduce(DType::F32, ReduceOp::Sum, n, [&](int rank) { return small_value(rank, first + i); });
  }
  return want;
}

// small_value(s, first + i) for i < count of every rank s, in rank order.
inline std::vector<double> concatenated(int n, int64_t first, int64_t count) {
  std::vector<double> want;
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < count; ++i) want.push_back(small_value(s, first + i));
  }
  return want;
}

inline Tensor mine(const Group& g, int64_t count) {
  return make(DType::F32, {count}, [&](int64_t i) { return small_value(g.rank(), i); });
}

inline void case_overlapping_buffers(const Group& g) {
  const int n = g.size(), r = g.rank();
  const int64_t k = 5;
  // all_reduce in place, and into the same memory shifted by one element.
  Tensor same = mine(g, k);
  all_reduce_into(g, same, same);
  COMM_CHECK_EQ(values(same), summed(n, 0, k));
  Tensor shifted = mine(g, k + 1);
  all_reduce_into(g, shifted.narrow(0, 0, k), shifted.narrow(0, 1, k));
  COMM_CHECK_EQ(values(shifted.narrow(0, 1, k)), summed(n, 0, k));

  // Async, in place on even ranks and out of place on odd ones (Open MPI's
  // non-blocking all-reduce needs every rank to agree on that; the backend makes it so).
  Tensor async_in = mine(g, 4096);
  Tensor async_out = r % 2 == 0 ? async_in : Tensor::empty({4096});
  all_reduce_async(g, async_in, async_out).wait();
  COMM_CHECK_EQ(values(async_out), summed(n, 0, 4096));

  // all_gather from this rank's block of the output (in place) and from its first block.
  Tensor gathered = Tensor::empty({n * k});
  gathered.narrow(0, r * k, k).copy_(mine(g, k));
  all_gather_into(g, gathered.narrow(0, r * k, k), gathered);
  COMM_CHECK_EQ(values(gathered), concatenated(n, 0, k));
  Tensor first_block = Tensor::empty({n * k});
  first_block.narrow(0, 0, k).copy_(mine(g, k));
  all_gather_into(g, first_block.narrow(0, 0, k), first_block);
  COMM_CHECK_EQ(values(first_block), concatenated(n, 0, k));
  // Along dim 1, the input being the first column block of the output.
  Tensor rows = Tensor::empty({2, n * k});
  rows.narrow(1, 0, k).copy_(mine(g, 2 * k).view({2, k}));
  all_gather_into(g, rows.narrow(1, 0, k), rows, 1);
  std::vector<double> want_rows;
  for (int64_t a = 0; a < 2; ++a) {
    for (double v : concatenated(n, a * k, k)) want_rows.push_back(v);
  }
  COMM_CHECK_EQ(values(rows), want_rows);

  // reduce_scatter into the first piece of its own input.
  Tensor scattered = mine(g, n * k);
  reduce_scatter_into(g, scattered, scattered.narrow(0, 0, k));
  COMM_CHECK_EQ(values(scattered.narrow(0, 0, k)), summed(n, r * k, k));

  // all_to_all in place, without and with split sizes.
  for (bool given : {false, true}) {
    Tensor x = mine(g, n * k);
    const std::vector<int64_t> splits = given ? std::vector<int64_t>(n, k) : std::vector<int64_t>{};
    all_to_all_into(g, x, x, splits, splits);
    COMM_CHECK_EQ(values(x), concatenated(n, r * k, k));
  }

  // gather and scatter where the root's input and output overlap.
  const int root = n - 1;
  const std::vector<int64_t> sizes(n, k);
  Tensor pile = Tensor::empty({n * k});
  Tensor contribution = r == root ? pile.narrow(0, 0, k) : Tensor::empty({k});
  contribution.copy_(mine(g, k));
  gather_async(g, contribution, pile, root, sizes).wait();
  if (r == root) COMM_CHECK_EQ(values(pile), concatenated(n, 0, k));
  Tensor source = mine(g, n * k);
  Tensor piece = r == root ? source.narrow(0, 0, k) : Tensor::empty({k});
  scatter(g, source, piece, root);
  std::vector<double> want_piece;
  for (int64_t i = 0; i < k; ++i) want_piece.push_back(small_value(root, r * k + i));
  COMM_CHECK_EQ(values(piece), want_piece);
}
