// The row-major to column-major mapping of the cuBLASLt GEMM (backend/gemm_layout.h),
// checked on the CPU: the plan is run through a reference column-major strided-
// batched GEMM with BLAS semantics (op, ld, batch stride, exactly what cuBLASLt
// receives) and compared with the CPU's matmul, for contiguous, transposed,
// sliced and batch-broadcast operands; and the key of the plan cache.
#include "backend/gemm_layout.h"
#include "test_helpers.h"

using namespace dtensor;
using dtensor::backend::BlasOperand;
using dtensor::backend::GemmPlan;
using dtensor::backend::make_gemm_plan;

namespace {

// C (rows x cols, column-major) = op(A) (rows x inner) op(B) (inner x cols), batched.
void reference_blas(const GemmPlan& p, const double* a_ptr, const double* b_ptr, double* c) {
  const int64_t rows = p.n, cols = p.m, inner = p.k;
  auto elem = [](const double* base, const BlasOperand& op, int64_t i, int64_t j) {
    return op.transpose ? base[j + i * op.ld] : base[i + j * op.ld];
  };
  for (int64_t bt = 0; bt < p.batch; ++bt) {
    const double* A = a_ptr + bt * p.a.batch_stride;
    const double* B = b_ptr + bt * p.b.batch_stride;
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = 0; i < rows; ++i) {
        double s = 0;
        for (int64_t q = 0; q < inner; ++q) s += elem(A, p.a, i, q) * elem(B, p.b, q, j);
        c[bt * p.batch_stride_c + i + j * p.ldc] = s;
      }
    }
  }
}

// Runs a @ b ([B, m, k] @ [B, k, n] views of F64) through the plan.
void expect_plan_matches_matmul(const Tensor& a, const Tensor& b, bool expect_plan = true) {
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  GemmPlan plan;
  const bool ok = make_gemm_plan(batch, m, n, k, a.strides().data(), b.strides().data(), plan);
  ASSERT_EQ(ok, expect_plan);
  if (!ok) return;
  Tensor out = Tensor::empty({batch, m, n}, DType::F64);
  // The plan's operands are the views' own memory: pass their element-0 addresses.
  reference_blas(plan, static_cast<const double*>(b.data_ptr()), static_cast<const double*>(a.data_ptr()),
                 static_cast<double*>(out.data_ptr()));
  EXPECT_TRUE(allclose(out, matmul(a, b), 1e-12, 1e-12));
}

Tensor gaussian(const Shape& shape, uint64_t seed) { return Tensor::randn(shape, seed, DType::F64); }

}  // namespace

TEST(GemmLayout, ContiguousAndTransposedOperands) {
  const int64_t B = 3, m = 5, k = 4, n = 6;
  Tensor a = gaussian({B, m, k}, 1), b = gaussian({B, k, n}, 2);
  expect_plan_matches_matmul(a, b);
  Tensor at = gaussian({B, k, m}, 3).transpose(1, 2);  // columns contiguous: op T
  Tensor bt = gaussian({B, n, k}, 4).transpose(1, 2);
  expect_plan_matches_matmul(at, b);
  expect_plan_matches_matmul(a, bt);
  expect_plan_matches_matmul(at, bt);
}

TEST(GemmLayout, SlicedRowsBroadcastBatchesAndSizeOneDims) {
  // Rows of a wider matrix (ld > cols), a batch broadcast through stride 0.
  Tensor wide = gaussian({2, 5, 9}, 5).slice(2, 1, 5);  // [2, 5, 4], ld 9
  Tensor b = gaussian({1, 4, 3}, 6).expand({2, 4, 3});
  expect_plan_matches_matmul(wide, b);
  // Vectors: m == 1, n == 1, k == 1, where strides along size-1 dims are arbitrary.
  expect_plan_matches_matmul(gaussian({2, 1, 4}, 7), gaussian({2, 4, 1}, 8));
  expect_plan_matches_matmul(gaussian({1, 3, 1}, 9), gaussian({1, 1, 5}, 10));
  expect_plan_matches_matmul(gaussian({1, 7, 1}, 9).expand({1, 7, 1}), gaussian({1, 4, 1}, 11).transpose(1, 2));
}

TEST(GemmLayout, NeitherRowsNorColumnsContiguousNeedsACopy) {
  Tensor a = gaussian({1, 6, 8}, 12).slice(2, 0, 8, 2);  // column stride 2
  expect_plan_matches_matmul(a, gaussian({1, 4, 3}, 13), false);
}

TEST(GemmLayout, PointerAlignmentIsTheLargestPowerOfTwoUpTo256) {
  using dtensor::backend::pointer_alignment;
  alignas(512) static unsigned char buffer[1024];
  EXPECT_EQ(pointer_alignment(buffer), 256u);
  EXPECT_EQ(pointer_alignment(buffer + 256), 256u);
  EXPECT_EQ(pointer_alignment(buffer + 128), 128u);
  EXPECT_EQ(pointer_alignment(buffer + 2), 2u);
  EXPECT_EQ(pointer_alignment(buffer + 6), 2u);
  EXPECT_EQ(pointer_alignment(buffer + 12), 4u);
  EXPECT_EQ(pointer_alignment(buffer + 1), 1u);
}

TEST(GemmLayout, TheCacheKeyTellsApartEveryCallThatNeedsOtherDescriptors) {
  // The cuBLASLt plan cache reuses descriptors and an algorithm for equal keys: a
  // field missing from the key would run one call with another's algorithm.
  using dtensor::backend::gemm_key;
  using dtensor::backend::GemmKey;
  using dtensor::backend::GemmKeyHash;
  alignas(512) static unsigned char buffer[4096];
  const void* a = buffer;
  const void* b = buffer + 1024;
  const void* out = buffer + 2048;
  GemmPlan base;
  const int64_t a_strides[3] = {12, 4, 1}, b_strides[3] = {20, 5, 1};
  ASSERT_TRUE(make_gemm_plan(2, 3, 5, 4, a_strides, b_strides, base));
  const GemmKey key = gemm_key(base, 0, false, 0, a, b, out);
  EXPECT_TRUE(key == gemm_key(base, 0, false, 0, buffer + 256, buffer + 512, buffer + 768))
      << "pointers of the same alignment share a plan";
  std::vector<GemmKey> others;
  auto changed = [&](auto&& edit) {
    GemmPlan p = base;
    edit(p);
    others.push_back(gemm_key(p, 0, false, 0, a, b, out));
  };
  changed([](GemmPlan& p) { p.m += 1; });
  changed([](GemmPlan& p) { p.n += 1; });
  changed([](GemmPlan& p) { p.k += 1; });
  changed([](GemmPlan& p) { p.batch += 1; });
  changed([](GemmPlan& p) { p.a.transpose = !p.a.transpose; });
  changed([](GemmPlan& p) { p.a.ld += 1; });
  changed([](GemmPlan& p) { p.a.batch_stride = 0; });
  changed([](GemmPlan& p) { p.b.transpose = !p.b.transpose; });
  changed([](GemmPlan& p) { p.b.ld += 1; });
  changed([](GemmPlan& p) { p.b.batch_stride = 0; });
  changed([](GemmPlan& p) { p.ldc += 1; });
  changed([](GemmPlan& p) { p.batch_stride_c += 1; });
  others.push_back(gemm_key(base, 2, false, 0, a, b, out));  // dtype
  others.push_back(gemm_key(base, 0, true, 0, a, b, out));   // TF32
  others.push_back(gemm_key(base, 0, false, 1, a, b, out));  // device
  others.push_back(gemm_key(base, 0, false, 0, buffer + 2, b, out));
  others.push_back(gemm_key(base, 0, false, 0, a, buffer + 1028, out));
  others.push_back(gemm_key(base, 0, false, 0, a, b, buffer + 2056));
  others.push_back(gemm_key(base, 0, false, 0, a, b, out, buffer + 3072));                 // a bias epilogue
  others.push_back(gemm_key(base, 0, false, 0, a, b, out, buffer + 3074));                 // its alignment
  others.push_back(gemm_key(base, 0, false, 0, a, b, out, buffer + 3072, buffer + 3584));  // GELU_AUX_BIAS
  others.push_back(gemm_key(base, 0, false, 0, a, b, out, nullptr, buffer + 3584));        // GELU_AUX
  EXPECT_TRUE(gemm_key(base, 0, false, 0, a, b, out, buffer + 3072) ==
              gemm_key(base, 0, false, 0, a, b, out, buffer + 3584))
      << "bias vectors of the same alignment share a plan";
  EXPECT_FALSE(others[others.size() - 3] == others[others.size() - 4]);
  EXPECT_FALSE(others[others.size() - 1] == others[others.size() - 2]);
  EXPECT_FALSE(others[others.size() - 2] == others[others.size() - 4]) << "the GELU epilogue is not the bias one";
  const GemmKeyHash hash;
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_FALSE(others[i] == key) << "change " << i << " keeps the key";
    EXPECT_NE(hash(others[i]), hash(key)) << "change " << i << " keeps the hash";
  }
}
