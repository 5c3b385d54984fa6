// The CPU backend's machinery: every GEMM engine of this build against a double
// reference (all transposes, leading dims wider than the matrices, beta 0 and 1,
// BF16 where an engine has a native path), matmul's engine choice (deterministic
// results, the choice reported), the per-rank thread pool (coverage, exceptions,
// nesting, the core budget under launch) and the CPU description.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/parallel.h"
#include "dtensor/dtensor.h"

namespace dtensor::backend::cpu {
namespace {

// op(A)[i, p] of a row-major A with leading dim ld.
double at(const std::vector<float>& x, bool trans, int64_t ld, int64_t row, int64_t col) {
  return trans ? x[static_cast<size_t>(col * ld + row)] : x[static_cast<size_t>(row * ld + col)];
}

TEST(GemmEngines, EveryEngineMatchesADoubleReference) {
  const int64_t m = 37, n = 29, k = 41;
  for (const auto& engine : gemm_engines()) {
    SCOPED_TRACE(engine->describe());
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          // Leading dims wider than the rows they hold: strided views.
          const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
          std::vector<float> a(static_cast<size_t>((ta ? k : m) * lda)), b(static_cast<size_t>((tb ? n : k) * ldb));
          std::vector<float> c(static_cast<size_t>(m * ldc));
          for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
          for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.23f * static_cast<float>(i));
          for (size_t i = 0; i < c.size(); ++i) c[i] = 0.5f - 0.01f * static_cast<float>(i % 17);
          const std::vector<float> c0 = c;
          engine->sgemm(GemmArgs{ta, tb, m, n, k, lda, ldb, ldc, beta}, a.data(), b.data(), c.data());
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double want = beta * c0[static_cast<size_t>(i * ldc + j)];
              for (int64_t p = 0; p < k; ++p) want += at(a, ta, lda, i, p) * at(b, tb, ldb, p, j);
              ASSERT_NEAR(c[static_cast<size_t>(i * ldc + j)], want, 1e-4) << ta << tb << beta << " " << i << "," << j;
            }
            // The padding between rows of C is not written.
            for (int64_t j = n; j < ldc; ++j) {
              ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], c0[static_cast<size_t>(i * ldc + j)]);
            }
          }
          if (engine->native_bf16()) {
            std::vector<uint16_t> ah(a.size()), bh(b.size());
            for (size_t i = 0; i < a.size(); ++i) ah[i] = float_to_bf16_bits(a[i]);
            for (size_t i = 0; i < b.size(); ++i) bh[i] = float_to_bf16_bits(b[i]);
            std::vector<float> ch = c0;
            engine->bf16gemm(GemmArgs{ta, tb, m, n, k, lda, ldb, ldc, beta}, ah.data(), bh.data(), ch.data());
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double want = beta * c0[static_cast<size_t>(i * ldc + j)];
                for (int64_t p = 0; p < k; ++p) {
                  const int64_t ia = ta ? p * lda + i : i * lda + p, ib = tb ? j * ldb + p : p * ldb + j;
                  want += static_cast<double>(bf16_bits_to_float(ah[static_cast<size_t>(ia)])) *
                          bf16_bits_to_float(bh[static_cast<size_t>(ib)]);
                }
                ASSERT_NEAR(ch[static_cast<size_t>(i * ldc + j)], want, 1e-3) << "bf16 " << ta << tb << beta;
              }
            }
          }
        }
      }
    }
  }
}

TEST(GemmEngines, RepeatedMatmulGivesTheSameBitsAndReportsItsRoute) {
  // Large enough to be tuned (>= 2^18 multiply-adds): the first call measures every
  // route on scratch output, yet its result equals every later call's.
  const Tensor a = Tensor::randn({130, 96}, 1), b = Tensor::randn({96, 70}, 2).t().contiguous().t();
  const Tensor first = matmul(a, b);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(allclose(matmul(a, b), first, 0, 0)) << "call " << i;
  bool reported = false;
  for (const std::string& line : dtensor::cpu::gemm_choices())
    reported = reported || line.find("130x70x96") != std::string::npos;
  EXPECT_TRUE(reported);
  EXPECT_NE(dtensor::cpu::summary().find("OpenBLAS"), std::string::npos);
}

// Shapes that differ a little (a mixture of experts' rows per expert change every step)
// share one measurement: sizes above 64 are tuned by quarter octaves. A shape outside
// the first's quarter octave is measured on its own.
TEST(GemmEngines, NearbyShapesShareOneTuning) {
  const Tensor b = Tensor::randn({96, 200}, 2);
  const std::vector<int64_t> near = {531, 560, 600, 640};
  std::vector<Tensor> want;  // the F64 references first: their GEMMs are tuned too
  for (int64_t rows : near) want.push_back(matmul(Tensor::randn({rows, 96}, 1).to(DType::F64), b.to(DType::F64)));
  auto lines = [] { return dtensor::cpu::gemm_choices().size(); };
  (void)matmul(Tensor::randn({530, 96}, 1), b);  // 512 < 530 <= 640
  const size_t measured = lines();
  for (size_t i = 0; i < near.size(); ++i) {
    const Tensor got = matmul(Tensor::randn({near[i], 96}, 1), b);
    EXPECT_TRUE(allclose(got, want[i].to(DType::F32), 1e-4, 1e-4)) << near[i];
    EXPECT_EQ(lines(), measured) << near[i] << " rows share the measurement of 530";
  }
  (void)matmul(Tensor::randn({641, 96}, 1), b);
  EXPECT_EQ(lines(), measured + 1);
}

// Sums over leading dims (bias gradients) take a column-parallel path; it must agree
// with a double reference and, bit for bit, with the general path on a strided copy.
TEST(Reductions, LeadingDimSumsMatchReferenceAndGeneralPath) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = Tensor::randn({37, 3, 70}, 4).to(dtype);
    const std::vector<double> v = x.to(DType::F64).to_vector<double>();
    std::vector<double> want(70, 0.0);
    for (size_t i = 0; i < v.size(); ++i) want[i % 70] += v[i];
    const Tensor s = sum(x, {0, 1});
    const std::vector<double> got = s.to(DType::F64).to_vector<double>();
    // BF16 rounds the sum once: half an ulp of 8 bits.
    for (size_t j = 0; j < 70; ++j) {
      EXPECT_NEAR(got[j], want[j], dtype == DType::BF16 ? std::abs(want[j]) / 256 + 1e-3 : 1e-4) << j;
    }
    // The same values through a layout that takes the general loop.
    const Tensor strided = x.transpose(0, 2).contiguous().transpose(0, 2);
    ASSERT_FALSE(strided.is_contiguous());
    EXPECT_TRUE(allclose(sum(strided, {0, 1}), s, 0, 0));
    EXPECT_TRUE(allclose(mean(strided, {0, 1}), mean(x, {0, 1}), 0, 0));
  }
}

TEST(ThreadPool, CoversEveryIndexOnceAndRethrows) {
  for (int64_t n : {0, 1, 7, 1000, 100000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    parallel_for(n, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << i;
    // Chunks are the fixed split of parallel_chunks, in order.
    const int chunks = parallel_chunks(n, 16);
    std::vector<int64_t> begins(static_cast<size_t>(chunks), -1);
    parallel_chunks_for(n, 16, [&](int c, int64_t b, int64_t) { begins[static_cast<size_t>(c)] = b; });
    for (int c = 0; c < chunks && n > 0; ++c) EXPECT_EQ(begins[static_cast<size_t>(c)], c * n / chunks);
  }
  EXPECT_THROW(parallel_run(8,
                            [](int t) {
                              if (t == 5) throw std::runtime_error("task 5");
                            }),
               std::runtime_error);
  // Nested regions run inline on the task's thread.
  std::atomic<int> inner{0};
  parallel_run(4, [&](int) { parallel_run(3, [&](int) { inner++; }); });
  EXPECT_EQ(inner.load(), 12);
}

TEST(ThreadPool, RanksShareTheCoresAndTimersCountTasks) {
  if (std::getenv("DTENSOR_NUM_THREADS")) GTEST_SKIP() << "DTENSOR_NUM_THREADS fixes the budget";
  const int cores = usable_cores();
  launch(2, [&](Group) { EXPECT_EQ(rank_threads(), std::max(1, cores / 2)); });
  EXPECT_EQ(rank_threads(), cores);  // restored after launch
  const CpuTimer timer;
  std::atomic<double> sink{0};
  parallel_run(4, [&](int) {
    double x = 0;
    for (int i = 0; i < 2000000; ++i) x += std::sqrt(static_cast<double>(i));
    sink = sink + x;
  });
  EXPECT_GT(timer.seconds(), 0.0);
}

}  // namespace
}  // namespace dtensor::backend::cpu
