// Distributed checkpoint speed: save and load GB/s per rank against writing and
// reading the same bytes with plain sequential I/O in the same run, and a whole GPT
// training state (ZeRO-3 on dp=2) saved and loaded, for the PyTorch DCP peer
// (bench/peers/torch_dcp_peer.py) to be compared with.
//
//   bench_checkpoint [--mib 512] [--ranks 2] [--rounds 3] [--dir /tmp]      bytes vs plain I/O
//   bench_checkpoint --gpt [--dim 768 --heads 12 --layers 6 --vocab 8192] [--rounds 3]  the GPT state
//
// Bytes mode: each rank holds --mib / ranks MiB of F32 in 16 tensors, Shard(0) over the
// ranks. Per round, alternating: plain write (each rank write()s its bytes to a new file,
// fsyncs it and removes the previous round's) then checkpoint::save over the previous
// checkpoint (same bytes, same fsyncs, plus the header, checksums and manifest); plain read of each rank's file, then
// checkpoint::load of the same layout (checksums verified; then again unstaged, straight into the targets), then a
// resharding load (S(0) -> S(1): every rank reads a column block from every file). Before each read the files are
// dropped from the page cache (posix_fadvise DONTNEED), so reads come from the disk for both. The time of a step is the
// slowest rank's; GB/s per rank = bytes per rank / time. The figures are the median over rounds (and the best).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"

using namespace dtensor;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t mib = 512;
  int ranks = 2;
  int rounds = 3;
  std::string dir = "/tmp";
  bool gpt = false;
  int64_t dim = 768, layers = 6, vocab = 8192, heads = 12;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_checkpoint: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mib") {
      o.mib = std::stoll(next());
    } else if (a == "--ranks") {
      o.ranks = std::stoi(next());
    } else if (a == "--rounds") {
      o.rounds = std::stoi(next());
    } else if (a == "--dir") {
      o.dir = next();
    } else if (a == "--gpt") {
      o.gpt = true;
    } else if (a == "--dim") {
      o.dim = std::stoll(next());
    } else if (a == "--layers") {
      o.layers = std::stoll(next());
    } else if (a == "--heads") {
      o.heads = std::stoll(next());
    } else if (a == "--vocab") {
      o.vocab = std::stoll(next());
    } else {
      std::fprintf(stderr, "bench_checkpoint: unknown flag %s (see the header comment)\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Evicts a file's pages from the page cache (they are clean after fsync).
void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_tree(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) drop_cache(e.path().string());
}

void plain_write(const std::string& path, const std::vector<Tensor>& pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (const Tensor& t : pieces) {
    const char* p = static_cast<const char*>(t.data_ptr());
    size_t left = t.nbytes();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n <= 0) std::abort();
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  ::fsync(fd);
  ::close(fd);
}

void plain_read(const std::string& path, std::vector<Tensor>& into) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  off_t offset = 0;
  for (Tensor& t : into) {
    char* p = static_cast<char*>(t.data_ptr());
    size_t left = t.nbytes();
    while (left > 0) {
      const ssize_t n = ::pread(fd, p, left, offset);
      if (n <= 0) std::abort();
      p += n;
      offset += n;
      left -= static_cast<size_t>(n);
    }
  }
  ::close(fd);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The slowest rank's seconds of fn (every rank calls it; barriers around it).
template <class F>
double timed(const Group& world, F&& fn) {
  barrier(world);
  const auto start = Clock::now();
  fn();
  const double mine = std::chrono::duration<double>(Clock::now() - start).count();
  return all_reduce(world, Tensor::scalar(mine), ReduceOp::Max).item<double>();
}

void bench_bytes(const Options& o) {
  constexpr int kTensors = 16;
  const int64_t per_rank = o.mib * (1 << 20) / o.ranks;
  const int64_t cols = 1024;
  // Rows per tensor so that each rank holds per_rank / kTensors bytes of it.
  const int64_t rows = per_rank / kTensors / (cols * 4) * o.ranks;
  const std::string root = o.dir + "/dtensor_bench_checkpoint_" + std::to_string(::getpid());
  fs::create_directories(root);
  std::vector<double> write_s, save_s, read_s, load_s, direct_s, reshard_s;
  double bytes_per_rank = 0;
  launch(o.ranks, [&](Group world) {
    DeviceMesh mesh(world, {o.ranks});
    checkpoint::StateDict state, same, resharded;
    std::vector<Tensor> pieces, read_back;
    for (int i = 0; i < kTensors; ++i) {
      const std::string name = "layer" + std::to_string(i) + ".weight";
      const DistTensor t = rand({rows, cols}, mesh, {Shard(0)}, 100 + i);
      state[name] = t;
      same[name] = zeros({rows, cols}, mesh, {Shard(0)});
      resharded[name] = zeros({rows, cols}, mesh, {Shard(1)});
      pieces.push_back(t.to_local());
      read_back.push_back(Tensor::empty(t.to_local().shape()));
    }
    if (world.rank() == 0) {
      int64_t b = 0;
      for (const Tensor& p : pieces) b += static_cast<int64_t>(p.nbytes());
      bytes_per_rank = static_cast<double>(b);
    }
    const std::string ckpt = root + "/ckpt";
    for (int round = 0; round < o.rounds; ++round) {
      // A new file each round, the previous one removed after it, as a checkpoint
      // replaces the previous one (overwriting a file in place reuses its blocks, which
      // on this machine's virtual disk is 2-3x faster, and no atomic save can do).
      const std::string plain = root + "/plain-" + std::to_string(round) + "-" + std::to_string(world.rank()) + ".bin";
      const double w = timed(world, [&] {
        plain_write(plain, pieces);
        if (round > 0) {
          fs::remove(root + "/plain-" + std::to_string(round - 1) + "-" + std::to_string(world.rank()) + ".bin");
        }
      });
      const double s = timed(world, [&] { checkpoint::save(ckpt, state, world, {.overwrite = true}); });
      if (world.rank() == 0) drop_tree(root), drop_tree(ckpt);
      barrier(world);
      const double r = timed(world, [&] { plain_read(plain, read_back); });
      if (world.rank() == 0) drop_tree(ckpt);
      barrier(world);
      const double l = timed(world, [&] { checkpoint::load(ckpt, same, world); });
      if (world.rank() == 0) drop_tree(ckpt);
      barrier(world);
      const double d = timed(world, [&] { checkpoint::load(ckpt, same, world, {.staged = false}); });
      if (world.rank() == 0) drop_tree(ckpt);
      barrier(world);
      const double x = timed(world, [&] { checkpoint::load(ckpt, resharded, world); });
      if (world.rank() == 0) {
        write_s.push_back(w);
        save_s.push_back(s);
        read_s.push_back(r);
        load_s.push_back(l);
        direct_s.push_back(d);
        reshard_s.push_back(x);
      }
    }
  });
  fs::remove_all(root);
  const auto gbps = [&](double seconds) { return bytes_per_rank / seconds / 1e9; };
  std::printf("checkpoint bytes: %d ranks, %.0f MiB per rank in %d tensors, %d rounds (median; best)\n", o.ranks,
              bytes_per_rank / (1 << 20), kTensors, o.rounds);
  std::printf("  %-34s %8.3f GB/s per rank (%.3f)\n", "plain write + fsync", gbps(median(write_s)),
              gbps(*std::min_element(write_s.begin(), write_s.end())));
  std::printf("  %-34s %8.3f GB/s per rank (%.3f)  = %.0f%% of plain\n", "checkpoint::save", gbps(median(save_s)),
              gbps(*std::min_element(save_s.begin(), save_s.end())), 100 * median(write_s) / median(save_s));
  std::printf("  %-34s %8.3f GB/s per rank (%.3f)\n", "plain read (cold)", gbps(median(read_s)),
              gbps(*std::min_element(read_s.begin(), read_s.end())));
  std::printf("  %-34s %8.3f GB/s per rank (%.3f)  = %.0f%% of plain\n", "checkpoint::load, same layout",
              gbps(median(load_s)), gbps(*std::min_element(load_s.begin(), load_s.end())),
              100 * median(read_s) / median(load_s));
  std::printf("  %-34s %8.3f GB/s per rank (%.3f)  = %.0f%% of plain\n", "checkpoint::load, same, unstaged",
              gbps(median(direct_s)), gbps(*std::min_element(direct_s.begin(), direct_s.end())),
              100 * median(read_s) / median(direct_s));
  std::printf("  %-34s %8.3f GB/s per rank (%.3f)  = %.0f%% of plain\n", "checkpoint::load, S(0) -> S(1)",
              gbps(median(reshard_s)), gbps(*std::min_element(reshard_s.begin(), reshard_s.end())),
              100 * median(read_s) / median(reshard_s));
}

// The train_gpt model under ZeRO-3 on dp=2 after one AdamW step: its whole TrainState
// saved and loaded (the peer: torch_dcp_peer.py, FSDP2 + torch.distributed.checkpoint).
void bench_gpt(const Options& o) {
  models::GPTConfig config;
  config.vocab = o.vocab;
  config.dim = o.dim;
  config.layers = o.layers;
  config.heads = o.heads;
  config.block_size = 64;
  const std::string root = o.dir + "/dtensor_bench_checkpoint_gpt_" + std::to_string(::getpid());
  std::vector<double> save_s, load_s, stall_s, async_total_s;
  int64_t parameters = 0, bytes = 0;
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2}, {"dp"});
    models::GPT model(mesh, config, 1);
    for (auto& [name, m] : model.named_modules()) {
      if (dynamic_cast<nn::TransformerBlock*>(m)) parallel::fully_shard(*m, mesh);
    }
    parallel::FSDPModule root_module = parallel::fully_shard(model, mesh);
    AdamW optimizer(model.parameters(), 1e-3);
    const Shape shape{2, 16};
    const DistTensor ids = DistTensor::from_local(Tensor::zeros({1, 16}, DType::I64), mesh, {Shard(0)}, shape);
    model.loss(ids, ids).backward();
    optimizer.step();
    checkpoint::TrainState state{.modules = {&model}, .optimizer = &optimizer, .step = 1};
    for (int round = 0; round < o.rounds; ++round) {
      const double s = timed(world, [&] { checkpoint::save(root, state, world, {.overwrite = true}); });
      if (world.rank() == 0) drop_tree(root);
      barrier(world);
      const double l = timed(world, [&] { checkpoint::load(root, state, world); });
      if (world.rank() == 0) {
        save_s.push_back(s);
        load_s.push_back(l);
      }
    }
    // The same save asynchronously: the stall (until save() returns) and the whole.
    checkpoint::AsyncSaver saver(world);
    for (int round = 0; round < o.rounds; ++round) {
      const auto start = Clock::now();
      const double stall =
          timed(world, [&] { saver.save(root, checkpoint::train_state_dict(state), {.overwrite = true}); });
      saver.wait();
      const double total = std::chrono::duration<double>(Clock::now() - start).count();
      if (world.rank() == 0) {
        stall_s.push_back(stall);
        async_total_s.push_back(total);
      }
    }
    if (world.rank() == 0) {
      parameters = model.num_parameters();
      for (const auto& e : fs::directory_iterator(root)) bytes += static_cast<int64_t>(e.file_size());
    }
  });
  fs::remove_all(root);
  std::printf(
      "checkpoint GPT state: dim %lld, %lld layers, vocab %lld, %lld parameters, ZeRO-3 dp=2, AdamW state; "
      "%.1f MiB on disk; %d rounds (median; best)\n",
      static_cast<long long>(o.dim), static_cast<long long>(o.layers), static_cast<long long>(o.vocab),
      static_cast<long long>(parameters), bytes / 1048576.0, o.rounds);
  std::printf("  save %.1f ms (%.1f), load %.1f ms (%.1f)\n", 1e3 * median(save_s),
              1e3 * *std::min_element(save_s.begin(), save_s.end()), 1e3 * median(load_s),
              1e3 * *std::min_element(load_s.begin(), load_s.end()));
  std::printf("  async save: the step stalls %.1f ms (%.1f), the save ends after %.1f ms (%.1f)\n",
              1e3 * median(stall_s), 1e3 * *std::min_element(stall_s.begin(), stall_s.end()),
              1e3 * median(async_total_s), 1e3 * *std::min_element(async_total_s.begin(), async_total_s.end()));
  std::printf(
      "{\"peer\": \"dtensor\", \"save_ms\": %.2f, \"load_ms\": %.2f, \"async_stall_ms\": %.2f, \"bytes\": %lld}\n",
      1e3 * median(save_s), 1e3 * median(load_s), 1e3 * median(stall_s), static_cast<long long>(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.gpt) {
    bench_gpt(o);
  } else {
    bench_bytes(o);
  }
  return 0;
}
