// The case_* functions of test_comm_cases.h (included inside namespace comm_cases).
#pragma once

inline double small_value(int rank, int64_t i) { return static_cast<double>((rank * 13 + i) % 50); }

inline void check_all_reduce(const Group& g, DType dt, ReduceOp op, int64_t count) {
  const int n = g.size(), r = g.rank();
  auto input = [&](int rank, int64_t i) {
    return dt == DType::Bool ? bool_input(rank, i) : input_value(rank, i, op);
  };
  Tensor in = make(dt, {count}, [&](int64_t i) { return input(r, i); });
  std::vector<double> want(count);
  for (int64_t i = 0; i < count; ++i) {
    want[i] = expected_reduce(dt, op, n, [&](int rank) { return input(rank, i); });
  }
  const std::vector<double> before = values(in);
  COMM_CHECK_EQ(values(all_reduce(g, in, op)), want);
  COMM_CHECK_EQ(values(in), before);  // out of place leaves the input alone
  all_reduce_(g, in, op);
  COMM_CHECK_EQ(values(in), want);
  Tensor again = make(dt, {count}, [&](int64_t i) { return input(r, i); });
  Tensor out = Tensor::empty({count}, dt);
  Work w = all_reduce_async(g, again, out, op);
  w.wait();
  COMM_CHECK_EQ(w.is_completed(), true);
  COMM_CHECK_EQ(values(out), want);
}

inline void case_all_reduce(const Group& g) {
  for (DType dt : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      check_all_reduce(g, dt, op, 37);
    }
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
    check_all_reduce(g, DType::Bool, op, 10);
  }
  check_all_reduce(g, DType::F32, ReduceOp::Sum, 0);
  // In place on a non-contiguous view: the result lands in the viewed storage.
  Tensor base = make(DType::F32, {6, 2}, [&](int64_t i) { return input_value(g.rank(), i, ReduceOp::Sum); });
  all_reduce_(g, base.t(), ReduceOp::Sum);
  std::vector<double> want(12);
  for (int64_t i = 0; i < 12; ++i) {
    want[i] = expected_reduce(DType::F32, ReduceOp::Sum, g.size(),
                              [&](int rank) { return input_value(rank, i, ReduceOp::Sum); });
  }
  COMM_CHECK_EQ(values(base), want);
  // Into a transposed view of its own contiguous input: the result must come from
  // the intact input, then land transposed.
  Tensor square = make(DType::F32, {2, 2}, [&](int64_t i) { return input_value(g.rank(), i, ReduceOp::Sum); });
  std::vector<double> want_t(4);
  for (int64_t i = 0; i < 4; ++i) {
    want_t[(i % 2) * 2 + i / 2] = expected_reduce(DType::F32, ReduceOp::Sum, g.size(),
                                                  [&](int rank) { return input_value(rank, i, ReduceOp::Sum); });
  }
  all_reduce_into(g, square, square.t(), ReduceOp::Sum);
  COMM_CHECK_EQ(values(square), want_t);
  // Avg on integers is the caller's mistake, reported before any communication.
  bool rejected = false;
  try {
    all_reduce(g, make(DType::I32, {3}, [](int64_t) { return 1.0; }), ReduceOp::Avg);
  } catch (const std::invalid_argument& e) {
    rejected = std::string(e.what()).find("[all_reduce]") == 0;
  }
  COMM_CHECK_EQ(rejected, true);
}

// Many of the reduction kernel's blocks per rank (and odd, so ranks' chunks are uneven).
inline void case_all_reduce_large(const Group& g) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
    check_all_reduce(g, DType::F32, op, 50001);
    check_all_reduce(g, DType::BF16, op, 70001);
  }
  check_all_reduce(g, DType::F64, ReduceOp::Min, 20000);
  check_all_reduce(g, DType::I64, ReduceOp::Product, 20000);
  // Even ranks reduce in place, odd ranks into a new tensor: a rank that writes
  // peers' outputs must have read every input of that chunk first.
  const int64_t count = 30001;
  auto input = [&](int rank, int64_t i) { return input_value(rank, i, ReduceOp::Sum); };
  std::vector<double> want(count);
  for (int64_t i = 0; i < count; ++i) {
    want[i] = expected_reduce(DType::F32, ReduceOp::Sum, g.size(), [&](int rank) { return input(rank, i); });
  }
  Tensor mixed = make(DType::F32, {count}, [&](int64_t i) { return input(g.rank(), i); });
  if (g.rank() % 2 == 0) {
    all_reduce_(g, mixed, ReduceOp::Sum);
  } else {
    mixed = all_reduce(g, mixed, ReduceOp::Sum);
  }
  COMM_CHECK_EQ(values(mixed), want);
}

inline void case_all_gather(const Group& g) {
  const int n = g.size(), r = g.rank();
  std::vector<int64_t> sizes(n);
  int64_t total = 0;
  for (int k = 0; k < n; ++k) total += (sizes[k] = uneven_size(k));
  std::vector<DType> dtypes = kAllDTypes;
  dtypes.push_back(DType::Bool);
  for (DType dt : dtypes) {
    auto value = [&](int rank, int64_t i) {
      return dt == DType::Bool ? bool_input(rank, i) : small_value(rank, i);
    };
    // Along dim 0, sizes exchanged: rows of every rank, in rank order.
    Tensor in = make(dt, {sizes[r], 3}, [&](int64_t i) { return value(r, i); });
    std::vector<double> want;
    for (int k = 0; k < n; ++k) {
      for (int64_t i = 0; i < sizes[k] * 3; ++i) want.push_back(rounded(dt, value(k, i)));
    }
    Tensor out = all_gather(g, in, 0);
    COMM_CHECK_EQ(out.shape(), (Shape{total, 3}));
    COMM_CHECK_EQ(values(out), want);
    // Along dim 1 of [2, s_r, 2] with sizes given: blocks interleave within rows.
    Tensor in1 = make(dt, {2, sizes[r], 2}, [&](int64_t i) { return value(r, i); });
    std::vector<double> want1;
    for (int64_t a = 0; a < 2; ++a) {
      for (int k = 0; k < n; ++k) {
        for (int64_t j = 0; j < sizes[k] * 2; ++j) want1.push_back(rounded(dt, value(k, a * sizes[k] * 2 + j)));
      }
    }
    COMM_CHECK_EQ(values(all_gather(g, in1, 1, sizes)), want1);
  }
  // List form: every rank's own shape.
  Tensor mine = make(DType::F32, {r % 2 + 1, r + 1}, [&](int64_t i) { return small_value(r, i); });
  std::vector<Tensor> all = all_gather_list(g, mine);
  COMM_CHECK_EQ(static_cast<int>(all.size()), n);
  for (int k = 0; k < n; ++k) {
    COMM_CHECK_EQ(all[k].shape(), (Shape{k % 2 + 1, k + 1}));
    std::vector<double> want;
    for (int64_t i = 0; i < (k % 2 + 1) * (k + 1); ++i) want.push_back(small_value(k, i));
    COMM_CHECK_EQ(values(all[k]), want);
  }
  // Async into a given output (even sizes).
  Tensor in = make(DType::F64, {2, 3}, [&](int64_t i) { return small_value(r, i); });
  Tensor out = Tensor::empty({2, 3 * n}, DType::F64);
  all_gather_async(g, in, out, 1).wait();
  std::vector<double> want;
  for (int64_t a = 0; a < 2; ++a) {
    for (int k = 0; k < n; ++k) {
      for (int64_t j = 0; j < 3; ++j) want.push_back(small_value(k, a * 3 + j));
    }
  }
  COMM_CHECK_EQ(values(out), want);
}

inline void case_reduce_scatter(const Group& g) {
  const int n = g.size(), r = g.rank();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32, DType::F64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg, ReduceOp::Product}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;
      // Chunk rule on n*3+1 rows: uneven, as DTensor shards are.
      const int64_t rows = n * 3 + 1, c = (rows + n - 1) / n;
      const int64_t start = std::min(rows, r * c), len = std::min(rows, start + c) - start;
      Tensor in = make(dt, {rows, 2}, [&](int64_t i) { return input_value(r, i, op); });
      Tensor out = reduce_scatter(g, in, op);
      COMM_CHECK_EQ(out.shape(), (Shape{len, 2}));
      std::vector<double> want;
      for (int64_t i = start * 2; i < (start + len) * 2; ++i) {
        want.push_back(expected_reduce(dt, op, n, [&](int k) { return input_value(k, i, op); }));
      }
      COMM_CHECK_EQ(values(out), want);
    }
  }
  // Along dim 1 with given sizes, and async into a given output.
  std::vector<int64_t> sizes(n);
  int64_t total = 0;
  for (int k = 0; k < n; ++k) total += (sizes[k] = uneven_size(k));
  int64_t offset = 0;
  for (int k = 0; k < r; ++k) offset += sizes[k];
  Tensor in = make(DType::F32, {3, total}, [&](int64_t i) { return input_value(r, i, ReduceOp::Sum); });
  Tensor out = Tensor::empty({3, sizes[r]}, DType::F32);
  Work w = reduce_scatter_async(g, in, out, ReduceOp::Sum, 1, sizes);
  w.wait();
  std::vector<double> want;
  for (int64_t a = 0; a < 3; ++a) {
    for (int64_t j = 0; j < sizes[r]; ++j) {
      const int64_t i = a * total + offset + j;
      want.push_back(expected_reduce(DType::F32, ReduceOp::Sum, n,
                                     [&](int k) { return input_value(k, i, ReduceOp::Sum); }));
    }
  }
  COMM_CHECK_EQ(values(out), want);
}

inline void case_all_to_all(const Group& g) {
  const int n = g.size(), r = g.rank();
  // Equal splits: block s of my output is block r of rank s's input.
  for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::Bool}) {
    auto value = [&](int rank, int64_t i) {
      return dt == DType::Bool ? bool_input(rank, i) : small_value(rank, i);
    };
    Tensor in = make(dt, {2 * n, 3}, [&](int64_t i) { return value(r, i); });
    std::vector<double> want;
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < 6; ++i) want.push_back(value(s, r * 6 + i));
    }
    COMM_CHECK_EQ(values(all_to_all(g, in)), want);
  }
  // Unequal: rank a sends (a + b) % 3 rows to rank b.
  auto rows = [](int a, int b) { return static_cast<int64_t>((a + b) % 3); };
  std::vector<int64_t> send(n), recv(n);
  int64_t send_total = 0, recv_total = 0;
  for (int s = 0; s < n; ++s) {
    send_total += (send[s] = rows(r, s));
    recv_total += (recv[s] = rows(s, r));
  }
  Tensor in = make(DType::F32, {send_total, 2}, [&](int64_t i) { return small_value(r, i); });
  std::vector<double> want;
  for (int s = 0; s < n; ++s) {
    int64_t first = 0;  // first row rank s sends to me
    for (int k = 0; k < r; ++k) first += rows(s, k);
    for (int64_t i = first * 2; i < (first + rows(s, r)) * 2; ++i) want.push_back(small_value(s, i));
  }
  COMM_CHECK_EQ(values(all_to_all(g, in, {}, send)), want);  // output splits exchanged
  COMM_CHECK_EQ(values(all_to_all(g, in, recv, send)), want);
  Tensor out = Tensor::empty({recv_total, 2}, DType::F32);
  all_to_all_async(g, in, out, recv, send).wait();
  COMM_CHECK_EQ(values(out), want);
}

inline void case_broadcast(const Group& g) {
  const int n = g.size(), r = g.rank();
  for (int root = 0; root < n; ++root) {
    for (DType dt : {DType::F32, DType::F16, DType::I32}) {
      Tensor t = make(dt, {5}, [&](int64_t i) { return r == root ? small_value(root, i) : -1.0; });
      std::vector<double> want;
      for (int64_t i = 0; i < 5; ++i) want.push_back(small_value(root, i));
      broadcast_(g, t, root);
      COMM_CHECK_EQ(values(t), want);
      Tensor src = make(dt, {5}, [&](int64_t i) { return r == root ? small_value(root, i) : -1.0; });
      COMM_CHECK_EQ(values(broadcast(g, src, root)), want);
      Tensor a = make(dt, {5}, [&](int64_t i) { return r == root ? small_value(root, i) : -1.0; });
      broadcast_async(g, a, root).wait();
      COMM_CHECK_EQ(values(a), want);
    }
  }
}

inline void case_gather_scatter(const Group& g) {
  const int n = g.size(), r = g.rank();
  std::vector<int64_t> sizes(n);
  int64_t total = 0;
  for (int k = 0; k < n; ++k) total += (sizes[k] = uneven_size(k));
  const int root = n - 1;
  Tensor in = make(DType::F32, {sizes[r], 2}, [&](int64_t i) { return small_value(r, i); });
  Tensor gathered = gather(g, in, root);
  std::vector<double> want;
  for (int k = 0; k < n; ++k) {
    for (int64_t i = 0; i < sizes[k] * 2; ++i) want.push_back(small_value(k, i));
  }
  COMM_CHECK_EQ(gathered.defined(), r == root);
  if (r == root) COMM_CHECK_EQ(values(gathered), want);
  // Scatter from rank 0: row block r of its input.
  Tensor source = r == 0 ? make(DType::F32, {total, 2}, [&](int64_t i) { return 2.0 * (i % 40); }) : Tensor();
  Tensor piece = Tensor::empty({sizes[r], 2}, DType::F32);
  scatter(g, source, piece, 0);
  int64_t offset = 0;
  for (int k = 0; k < r; ++k) offset += sizes[k];
  std::vector<double> mine;
  for (int64_t i = offset * 2; i < (offset + sizes[r]) * 2; ++i) mine.push_back(2.0 * (i % 40));
  COMM_CHECK_EQ(values(piece), mine);
  // Async forms with the sizes given.
  Tensor out = r == root ? Tensor::empty({total, 2}, DType::F32) : Tensor();
  gather_async(g, in, out, root, sizes).wait();
  if (r == root) COMM_CHECK_EQ(values(out), want);
  Tensor piece2 = Tensor::empty({sizes[r], 2}, DType::F32);
  scatter_async(g, source, piece2, 0, sizes).wait();
  COMM_CHECK_EQ(values(piece2), mine);
}

inline void case_point_to_point(const Group& g) {
  const int n = g.size(), r = g.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto msg = [](int from, int tag) {
    return [=](int64_t i) { return static_cast<double>(from * 10 + tag + i); };
  };
  // Ring: post the send, receive, then complete the send.
  Work sent = send_async(g, make(DType::I64, {4}, msg(r, 7)), right, 7);
  Tensor got = Tensor::empty({4}, DType::I64);
  recv(g, got, left, 7);
  sent.wait();
  COMM_CHECK_EQ(values(got), values(make(DType::I64, {4}, msg(left, 7))));
  // A batch whose receives come first, both directions: no deadlock.
  Tensor from_left = Tensor::empty({3}, DType::F32), from_right = Tensor::empty({3}, DType::F32);
  batch_send_recv(g, {P2POp::recv(from_left, left, 1), P2POp::recv(from_right, right, 2),
                      P2POp::send(make(DType::F32, {3}, msg(r, 1)), right, 1),
                      P2POp::send(make(DType::F32, {3}, msg(r, 2)), left, 2)});
  COMM_CHECK_EQ(values(from_left), values(make(DType::F32, {3}, msg(left, 1))));
  COMM_CHECK_EQ(values(from_right), values(make(DType::F32, {3}, msg(right, 2))));
  // Tags select messages: receive tag 6 before tag 5, into a non-contiguous view.
  Work s5 = send_async(g, make(DType::F32, {2, 3}, msg(r, 5)), right, 5);
  Work s6 = send_async(g, make(DType::F32, {2, 3}, msg(r, 6)), right, 6);
  Tensor base = Tensor::zeros({3, 2}, DType::F32);
  recv(g, base.t(), left, 6);
  Tensor five = Tensor::empty({2, 3}, DType::F32);
  recv(g, five, left, 5);
  s5.wait();
  s6.wait();
  COMM_CHECK_EQ(values(base.t()), values(make(DType::F32, {2, 3}, msg(left, 6))));
  COMM_CHECK_EQ(values(five), values(make(DType::F32, {2, 3}, msg(left, 5))));
  barrier(g);
  barrier_async(g).wait();
}

inline void case_split(const Group& g) {
  const int n = g.size(), r = g.rank();
  // Two colors; key -rank reverses the order within each.
  Group sub = g.split(r % 2, -r);
  std::vector<int> members;
  for (int k = n - 1; k >= 0; --k) {
    if (k % 2 == r % 2) members.push_back(k);
  }
  COMM_CHECK_EQ(sub.size(), static_cast<int>(members.size()));
  COMM_CHECK_EQ(members[sub.rank()], r);
  COMM_CHECK_EQ(sub.backend(), g.backend());
  // Both sub-groups at once, running different collectives.
  if (r % 2 == 0) {
    Tensor t = make(DType::F32, {4}, [&](int64_t i) { return r + i; });
    double sum_ranks = 0;
    for (int k : members) sum_ranks += k;
    std::vector<double> want;
    for (int64_t i = 0; i < 4; ++i) want.push_back(sum_ranks + static_cast<double>(members.size()) * i);
    COMM_CHECK_EQ(values(all_reduce(sub, t)), want);
  } else {
    Tensor t = make(DType::I32, {2}, [&](int64_t i) { return r * 2 + i; });
    std::vector<double> want;
    for (int k : members) {
      for (int64_t i = 0; i < 2; ++i) want.push_back(k * 2 + i);
    }
    COMM_CHECK_EQ(values(all_gather(sub, t)), want);
  }
  // A negative color joins nothing; the others still form a group.
  Group rest = g.split(r == 0 ? -1 : 0);
  COMM_CHECK_EQ(rest.defined(), r != 0);
  if (rest.defined()) {
    COMM_CHECK_EQ(rest.size(), n - 1);
    COMM_CHECK_EQ(rest.rank(), r - 1);
    COMM_CHECK_EQ(values(all_reduce(rest, make(DType::F64, {1}, [](int64_t) { return 1.0; }))),
                  std::vector<double>{static_cast<double>(n - 1)});
  }
  // Split of a split.
  Group quarter = sub.split(sub.rank() % 2);
  barrier(quarter);
  COMM_CHECK_EQ(quarter.size(), (sub.size() + 1 - sub.rank() % 2) / 2);
}

inline void case_comm_debug(const Group& g) {
  Tensor t = make(DType::F32, {8}, [](int64_t i) { return static_cast<double>(i); });
  CommDebugMode mode;
  all_reduce(g, t);
  all_reduce_(g, t);
  all_gather(g, t);  // its size exchange is not counted
  {
    CommDebugMode inner;
    barrier(g);
    COMM_CHECK_EQ(inner.count("barrier"), int64_t{1});
    COMM_CHECK_EQ(inner.total_count(), int64_t{1});
  }
  COMM_CHECK_EQ(mode.count("all_reduce"), int64_t{2});
  COMM_CHECK_EQ(mode.count("all_reduce", g), int64_t{2});
  COMM_CHECK_EQ(mode.count("all_gather"), int64_t{1});
  COMM_CHECK_EQ(mode.count("barrier"), int64_t{1});
  COMM_CHECK_EQ(mode.bytes("all_reduce"), int64_t{64});
  COMM_CHECK_EQ(mode.total_count(), int64_t{4});
  mode.reset();
  COMM_CHECK_EQ(mode.total_count(), int64_t{0});
}

// The strided exchange of redistribution (comm/block_all_to_all.h): rank r holds
// [d_r, E, 2] (d_r uneven, some 0) and sends the j-th chunk along dim 1 (uneven
// chunks e_j) to rank j; it receives [sum d, e_r, 2] stacked along dim 0. Pieces are
// column blocks on the sending side and row blocks on the receiving side.
inline void case_all_to_all_blocks(const Group& g) {
  const int n = g.size(), r = g.rank();
  std::vector<int64_t> d_sizes(n), e_sizes(n);
  int64_t rows = 0, cols = 0;
  for (int k = 0; k < n; ++k) {
    rows += (d_sizes[k] = uneven_size(k));
    cols += (e_sizes[k] = uneven_size(k + 1) + 1);
  }
  auto value = [&](int rank, int64_t i) { return small_value(rank, i); };
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I64}) {
    Tensor in = make(dt, {d_sizes[r], cols, 2}, [&](int64_t i) { return value(r, i); });
    Tensor out = Tensor::empty({rows, e_sizes[r], 2}, dt);
    CommDebugMode counter;
    comm::all_to_all_blocks(g, in, comm::blocks_along(in, 1, e_sizes), out,
                            comm::blocks_along(out, 0, d_sizes));
    COMM_CHECK_EQ(counter.count("all_to_all"), static_cast<int64_t>(1));
    std::vector<double> want;
    int64_t col0 = 0;
    for (int k = 0; k < r; ++k) col0 += e_sizes[k];
    for (int s = 0; s < n; ++s) {
      for (int64_t a = 0; a < d_sizes[s]; ++a) {
        for (int64_t c = 0; c < e_sizes[r]; ++c) {
          for (int64_t z = 0; z < 2; ++z) want.push_back(rounded(dt, value(s, (a * cols + col0 + c) * 2 + z)));
        }
      }
    }
    COMM_CHECK_EQ(values(out), want);

    // Strided on both sides: [2, d_r, E] cut along dim 2, stacked along dim 1.
    Tensor in2 = make(dt, {2, d_sizes[r], cols}, [&](int64_t i) { return value(r, i); });
    Tensor out2 = Tensor::empty({2, rows, e_sizes[r]}, dt);
    comm::all_to_all_blocks(g, in2, comm::blocks_along(in2, 2, e_sizes), out2,
                            comm::blocks_along(out2, 1, d_sizes));
    std::vector<double> want2;
    for (int64_t o = 0; o < 2; ++o) {
      for (int s = 0; s < n; ++s) {
        for (int64_t a = 0; a < d_sizes[s]; ++a) {
          for (int64_t c = 0; c < e_sizes[r]; ++c) {
            want2.push_back(rounded(dt, value(s, (o * d_sizes[s] + a) * cols + col0 + c)));
          }
        }
      }
    }
    COMM_CHECK_EQ(values(out2), want2);
  }
}
