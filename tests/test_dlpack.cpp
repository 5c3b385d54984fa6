// DLPack interop: the ABI layout, round trips of every dtype and of strided views,
// zero copy in both directions, the producer's deleter called exactly once, the
// errors for what dtensor cannot hold, and an imported shard as a DistTensor's piece.
#include "dtensor/dlpack.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>

#include "test_helpers.h"

using namespace dtensor;
using dtensor::testing::reference_values;

namespace {

// The ABI on LP64 (Linux, macOS): the sizes and offsets a C consumer compiled
// against the official header sees.
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(sizeof(DLTensor) == 48 && offsetof(DLTensor, shape) == 24 && offsetof(DLTensor, byte_offset) == 40);
static_assert(sizeof(DLManagedTensor) == 64 && offsetof(DLManagedTensor, deleter) == 56);
static_assert(sizeof(DLManagedTensorVersioned) == 80 && offsetof(DLManagedTensorVersioned, flags) == 24 &&
              offsetof(DLManagedTensorVersioned, dl_tensor) == 32);

std::vector<double> values(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }

// A tensor made by another framework: its own buffer, shape and strides, and a
// deleter that counts its calls.
template <class Managed>
struct ProducerTensor {
  Managed managed{};
  std::vector<double> buffer;  // 8-byte aligned for every element type
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int* deletions = nullptr;
};

template <class Managed>
void count_and_delete(Managed* self) {
  auto* producer = static_cast<ProducerTensor<Managed>*>(self->manager_ctx);
  ++*producer->deletions;
  delete producer;
}

// float32 elements 0, 1, 2, ... laid out by `strides` (null: no strides array).
template <class Managed = DLManagedTensor>
Managed* make_producer(const Shape& shape, std::optional<Strides> strides, int* deletions,
                       DLDataType dtype = {kDLFloat, 32, 1}, DLDevice device = {kDLCPU, 0}) {
  auto* p = new ProducerTensor<Managed>();
  p->shape = shape;
  p->deletions = deletions;
  const Strides layout = strides ? *strides : contiguous_strides(shape);
  int64_t extent = 1;
  for (size_t d = 0; d < shape.size(); ++d) extent += (shape[d] - 1) * layout[d];
  p->buffer.assign(static_cast<size_t>(std::max<int64_t>(extent, 1)), 0.0);
  auto* f = reinterpret_cast<float*>(p->buffer.data());
  int64_t next = 0;
  dtensor::testing::for_each_index(shape, [&](const std::vector<int64_t>& i) {
    int64_t at = 0;
    for (size_t d = 0; d < i.size(); ++d) at += i[d] * layout[d];
    f[at] = static_cast<float>(next++);
  });
  DLTensor& dl = p->managed.dl_tensor;
  dl.data = p->buffer.data();
  dl.device = device;
  dl.ndim = static_cast<int32_t>(shape.size());
  dl.dtype = dtype;
  dl.shape = p->shape.empty() ? nullptr : p->shape.data();
  if (strides) {
    p->strides = *strides;
    dl.strides = p->strides.data();
  }
  p->managed.manager_ctx = p;
  p->managed.deleter = &count_and_delete<Managed>;
  if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) p->managed.version = {1, 1};
  return &p->managed;
}

Tensor sample(DType dtype, const Shape& shape) {
  if (dtype == DType::Bool) {
    std::vector<bool> v;
    for (int64_t i = 0; i < shape_numel(shape); ++i) v.push_back(i % 3 == 0);
    return Tensor::from_vector(v, shape);
  }
  return Tensor::arange(-5, static_cast<double>(shape_numel(shape) - 5), 1, dtype).reshape(shape);
}

const std::vector<DType> kAllDTypes{DType::F32, DType::F64, DType::BF16, DType::F16,
                                    DType::I64, DType::I32, DType::Bool};

}  // namespace

TEST(DLPackExport, DescribesEveryDTypeAndSharesTheMemory) {
  const std::vector<DLDataType> expected{{kDLFloat, 32, 1}, {kDLFloat, 64, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 16, 1},
                                         {kDLInt, 64, 1},   {kDLInt, 32, 1},   {kDLBool, 8, 1}};
  for (size_t k = 0; k < kAllDTypes.size(); ++k) {
    const Tensor t = sample(kAllDTypes[k], {3, 4});
    DLManagedTensor* m = to_dlpack(t);
    const DLTensor& dl = m->dl_tensor;
    EXPECT_EQ(dl.dtype.code, expected[k].code) << dtype_name(kAllDTypes[k]);
    EXPECT_EQ(dl.dtype.bits, expected[k].bits) << dtype_name(kAllDTypes[k]);
    EXPECT_EQ(dl.dtype.lanes, 1);
    EXPECT_EQ(dl.device.device_type, kDLCPU);
    EXPECT_EQ(dl.device.device_id, 0);
    ASSERT_EQ(dl.ndim, 2);
    EXPECT_EQ(std::vector<int64_t>(dl.shape, dl.shape + 2), (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(std::vector<int64_t>(dl.strides, dl.strides + 2), (std::vector<int64_t>{4, 1}));
    EXPECT_EQ(dl.data, t.data_ptr());
    EXPECT_EQ(dl.byte_offset, 0u);

    const Tensor back = from_dlpack(m);
    EXPECT_EQ(back.dtype(), kAllDTypes[k]);
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(back.data_ptr(), t.data_ptr()) << "zero copy";
    EXPECT_EQ(values(back), values(t)) << dtype_name(kAllDTypes[k]);
  }
}

TEST(DLPackExport, VersionedStructSaysVersionAndFlags) {
  for (DType dtype : kAllDTypes) {
    const Tensor t = sample(dtype, {5});
    DLManagedTensorVersioned* m = to_dlpack_versioned(t);
    EXPECT_EQ(m->version.major, 1u);
    EXPECT_EQ(m->version.minor, 1u);
    EXPECT_EQ(m->flags, 0u) << "writable, and not a copy";
    EXPECT_EQ(m->dl_tensor.data, t.data_ptr());
    const Tensor back = from_dlpack(m);
    EXPECT_EQ(back.dtype(), dtype);
    EXPECT_EQ(values(back), values(t)) << dtype_name(dtype);
  }
}

TEST(DLPackExport, ViewsKeepStridesAndPointAtTheFirstElement) {
  const Tensor base = sample(DType::F32, {6, 8});
  const std::vector<Tensor> views{base.t(),
                                  base.slice(1, 1, 7, 2),
                                  base.narrow(0, 2, 3),
                                  base.select(1, 5),
                                  base.slice(0, 1, 5).t().slice(1, 1, 4, 2),
                                  base.unsqueeze(0).expand({3, 6, 8})};
  for (const Tensor& v : views) {
    DLManagedTensor* m = to_dlpack(v);
    const DLTensor& dl = m->dl_tensor;
    EXPECT_EQ(std::vector<int64_t>(dl.strides, dl.strides + dl.ndim), v.strides());
    EXPECT_EQ(dl.data, v.data_ptr()) << "data is the first element, byte_offset 0";
    EXPECT_EQ(dl.byte_offset, 0u);
    const Tensor back = from_dlpack(m);
    EXPECT_EQ(back.shape(), v.shape());
    EXPECT_EQ(back.strides(), v.strides());
    EXPECT_EQ(values(back), reference_values(v));
  }
}

TEST(DLPackExport, KeepsTheStorageAliveUntilTheDeleter) {
  DLManagedTensor* m = nullptr;
  std::weak_ptr<Storage> storage;
  {
    const Tensor t = sample(DType::F64, {4, 4});
    storage = t.storage();
    m = to_dlpack(t.narrow(0, 1, 2));
  }
  ASSERT_FALSE(storage.expired()) << "the export holds the only reference";
  EXPECT_EQ(static_cast<const double*>(m->dl_tensor.data)[0], -1.0);  // element (1, 0) of -5, -4, ...
  m->deleter(m);
  EXPECT_TRUE(storage.expired());
}

TEST(DLPackExport, WritesThroughEitherSideAreSeenByTheOther) {
  Tensor t = Tensor::zeros({3, 4});
  Tensor view = from_dlpack(to_dlpack(t.t()));  // a foreign view of the transpose
  view.select(0, 1).fill_(7.0);                 // column 1 of t
  EXPECT_EQ(values(t.select(1, 1)), (std::vector<double>(3, 7.0)));
  t.select(0, 2).fill_(-1.0);  // row 2 of t: column 2 of the view
  EXPECT_EQ(values(view.select(1, 2)), (std::vector<double>(4, -1.0)));
}

TEST(DLPackExport, ZeroDimAndEmptyTensors) {
  const Tensor s = Tensor::scalar(2.5f);
  DLManagedTensor* m = to_dlpack(s);
  EXPECT_EQ(m->dl_tensor.ndim, 0);
  EXPECT_EQ(m->dl_tensor.shape, nullptr);
  EXPECT_EQ(m->dl_tensor.data, s.data_ptr());
  const Tensor back = from_dlpack(m);
  EXPECT_EQ(back.dim(), 0);
  EXPECT_EQ(back.item<float>(), 2.5f);

  const Tensor e = Tensor::zeros({0, 3}, DType::I32);
  DLManagedTensorVersioned* v = to_dlpack_versioned(e);
  EXPECT_EQ(v->dl_tensor.data, nullptr) << "DLPack asks for NULL data when there are no elements";
  EXPECT_EQ(std::vector<int64_t>(v->dl_tensor.shape, v->dl_tensor.shape + 2), (std::vector<int64_t>{0, 3}));
  const Tensor empty = from_dlpack(v);
  EXPECT_EQ(empty.shape(), (Shape{0, 3}));
  EXPECT_EQ(empty.dtype(), DType::I32);
  EXPECT_EQ(sum(empty).item<int64_t>(), 0);
  EXPECT_EQ(add(empty, 1.0).shape(), (Shape{0, 3}));
}

TEST(DLPackExport, UndefinedTensorIsRefused) {
  EXPECT_THROW_MSG(to_dlpack(Tensor()), std::invalid_argument, "[to_dlpack] expected a defined tensor");
  EXPECT_THROW_MSG(to_dlpack_versioned(Tensor()), std::invalid_argument, "[to_dlpack_versioned] expected a defined");
}

TEST(DLPackImport, DeleterRunsOnceWhenTheLastHandleDies) {
  int deletions = 0;
  {
    Tensor outer;
    {
      Tensor x = from_dlpack(make_producer({4, 3}, std::nullopt, &deletions));
      EXPECT_EQ(x.strides(), (Strides{3, 1})) << "NULL strides mean row-major";
      EXPECT_EQ(values(x.select(0, 1)), (std::vector<double>{3, 4, 5}));
      const Tensor copy = x;  // a second handle: the same storage, no second owner of the memory
      EXPECT_TRUE(copy.shares_storage(x));
      outer = x.t().slice(0, 1, 3);  // a view outlives x
      Tensor detached = x.clone();   // a copy holds nothing of the producer's
      EXPECT_FALSE(detached.shares_storage(x));
    }
    EXPECT_EQ(deletions, 0) << "a view is still alive";
    EXPECT_EQ(values(outer), (std::vector<double>{1, 4, 7, 10, 2, 5, 8, 11}));
  }
  EXPECT_EQ(deletions, 1);

  int versioned_deletions = 0;
  {
    Tensor y = from_dlpack(make_producer<DLManagedTensorVersioned>({2, 2}, Strides{1, 2}, &versioned_deletions));
    EXPECT_EQ(values(y), (std::vector<double>{0, 1, 2, 3}));
    EXPECT_FALSE(y.is_contiguous()) << "column-major, as given";
  }
  EXPECT_EQ(versioned_deletions, 1);
}

TEST(DLPackImport, StridedAndOffsetInputAndOpsOnIt) {
  int deletions = 0;
  {
    // Every other column of a 3 x 8 buffer, starting at column 1 through byte_offset.
    DLManagedTensor* m = make_producer({3, 8}, std::nullopt, &deletions);
    m->dl_tensor.byte_offset = sizeof(float);
    m->dl_tensor.shape[1] = 4;
    auto* strides = static_cast<ProducerTensor<DLManagedTensor>*>(m->manager_ctx);
    strides->strides = {8, 2};
    m->dl_tensor.strides = strides->strides.data();
    const MemoryStats before = memory_stats();
    Tensor x = from_dlpack(m);
    EXPECT_EQ(memory_stats().live_bytes, before.live_bytes) << "imported memory is not dtensor's";
    EXPECT_EQ(values(x), (std::vector<double>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
    EXPECT_EQ(values(matmul(x, Tensor::ones({4, 1}))), (std::vector<double>{16, 48, 80}));
    x.copy_(mul(x, 2.0));  // in place, into the producer's buffer
    EXPECT_EQ(static_cast<const float*>(m->dl_tensor.data)[3], 6.0f);
    EXPECT_EQ(static_cast<const float*>(m->dl_tensor.data)[2], 2.0f) << "a skipped column is untouched";
  }
  EXPECT_EQ(deletions, 1);
}

TEST(DLPackImport, HandMadeZeroDimAndEmptyTensors) {
  int deletions = 0;
  {
    Tensor s = from_dlpack(make_producer({}, std::nullopt, &deletions));
    EXPECT_EQ(s.dim(), 0);
    EXPECT_EQ(s.item<float>(), 0.0f);
    DLManagedTensorVersioned* m = make_producer<DLManagedTensorVersioned>({2, 0, 5}, std::nullopt, &deletions);
    m->dl_tensor.data = nullptr;  // as DLPack asks for empty tensors
    Tensor e = from_dlpack(m);
    EXPECT_EQ(e.shape(), (Shape{2, 0, 5}));
    EXPECT_EQ(e.numel(), 0);
    EXPECT_EQ(sum(e).item<float>(), 0.0f);
  }
  EXPECT_EQ(deletions, 2) << "the deleter runs for empty tensors too";
}

TEST(DLPackImport, ReleasingForeignStorageReturnsItOnce) {
  // FSDP frees and restores parameter storage; foreign memory goes back to its owner
  // on release and a block of dtensor's own replaces it on restore.
  int deletions = 0;
  Tensor x = from_dlpack(make_producer({4}, std::nullopt, &deletions));
  x.storage()->release_memory();
  EXPECT_EQ(deletions, 1);
  EXPECT_THROW_MSG(x.data_ptr(), std::runtime_error, "was released");
  x.storage()->restore_memory();
  x.fill_(3.0);
  EXPECT_EQ(values(x), (std::vector<double>(4, 3.0)));
  x = Tensor();
  EXPECT_EQ(deletions, 1);
}

TEST(DLPackImport, RefusesWhatDTensorCannotHoldAndLeavesOwnershipWithTheCaller) {
  struct Case {
    DLDataType dtype;
    DLDevice device;
    std::optional<Strides> strides;
    std::string fragment;
  };
  const DLDevice cpu{kDLCPU, 0};
  const std::vector<Case> cases{
      {{kDLComplex, 64, 1},
       cpu,
       std::nullopt,
       "[from_dlpack] unsupported dtype: expected float32, float64, float16, bfloat16, int64, int32 or bool8, got "
       "complex64"},
      {{kDLUInt, 16, 1}, cpu, std::nullopt, "got uint16"},
      {{kDLUInt, 8, 1}, cpu, std::nullopt, "got uint8"},
      {{kDLFloat8_e4m3fn, 8, 1}, cpu, std::nullopt, "got float8_e4m3fn_8"},
      {{kDLInt, 8, 1}, cpu, std::nullopt, "got int8"},
      {{kDLFloat, 32, 4},
       cpu,
       std::nullopt,
       "[from_dlpack] vector dtypes are not supported: expected lanes 1, got float32x4"},
      {{kDLFloat, 32, 1},
       {kDLROCM, 0},
       std::nullopt,
       "[from_dlpack] unsupported device: expected kDLCPU (1) or kDLCUDA (2), got kDLROCM (10)"},
      {{kDLFloat, 32, 1}, {kDLCUDAHost, 0}, std::nullopt, "got kDLCUDAHost (3)"},
      {{kDLFloat, 32, 1}, {kDLCUDA, -1}, std::nullopt, "expected a CUDA device id >= 0, got -1"},
      {{kDLFloat, 32, 1},
       cpu,
       Strides{-3, 1},
       "[from_dlpack] negative strides are not supported: expected strides >= 0, got [-3, 1]"},
  };
  for (const Case& c : cases) {
    int deletions = 0;
    DLManagedTensor* m = make_producer({2, 3}, std::nullopt, &deletions, c.dtype, c.device);
    if (c.strides) {
      auto* p = static_cast<ProducerTensor<DLManagedTensor>*>(m->manager_ctx);
      p->strides = *c.strides;
      m->dl_tensor.strides = p->strides.data();
    }
    EXPECT_THROW_MSG(from_dlpack(m), std::invalid_argument, c.fragment);
    EXPECT_EQ(deletions, 0) << c.fragment;
    m->deleter(m);  // still the caller's
    EXPECT_EQ(deletions, 1);
  }

  int deletions = 0;
  DLManagedTensor* misaligned = make_producer({2}, std::nullopt, &deletions);
  misaligned->dl_tensor.byte_offset = 2;
  EXPECT_THROW_MSG(from_dlpack(misaligned), std::invalid_argument,
                   "[from_dlpack] expected data + byte_offset aligned to the 4-byte element size");
  misaligned->deleter(misaligned);
  DLManagedTensor* no_data = make_producer({2}, std::nullopt, &deletions);
  no_data->dl_tensor.data = nullptr;
  EXPECT_THROW_MSG(from_dlpack(no_data), std::invalid_argument,
                   "[from_dlpack] expected data for a tensor of shape [2], got NULL");
  no_data->deleter(no_data);
  EXPECT_EQ(deletions, 2);

  EXPECT_THROW_MSG(from_dlpack(static_cast<DLManagedTensor*>(nullptr)), std::invalid_argument,
                   "[from_dlpack] expected a DLManagedTensor, got NULL");
  EXPECT_THROW_MSG(from_dlpack(static_cast<DLManagedTensorVersioned*>(nullptr)), std::invalid_argument,
                   "[from_dlpack] expected a DLManagedTensorVersioned, got NULL");
}

TEST(DLPackImport, VersionedRefusesAnotherMajorVersionAndReadOnlyTensors) {
  int deletions = 0;
  DLManagedTensorVersioned* future = make_producer<DLManagedTensorVersioned>({2}, std::nullopt, &deletions);
  future->version = {2, 0};
  EXPECT_THROW_MSG(from_dlpack(future), std::invalid_argument,
                   "[from_dlpack] expected DLPack major version 1, got 2.0; the caller still owns the tensor and must "
                   "call its deleter");
  future->deleter(future);

  DLManagedTensorVersioned* read_only = make_producer<DLManagedTensorVersioned>({2}, std::nullopt, &deletions);
  read_only->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  EXPECT_THROW_MSG(from_dlpack(read_only), std::invalid_argument,
                   "[from_dlpack] expected a writable tensor, got one flagged read-only");
  read_only->deleter(read_only);
  EXPECT_EQ(deletions, 2);

  // A newer minor version only adds enum values, and a copy is as good as any memory.
  DLManagedTensorVersioned* newer = make_producer<DLManagedTensorVersioned>({2}, std::nullopt, &deletions);
  newer->version = {1, 3};
  newer->flags = DLPACK_FLAG_BITMASK_IS_COPIED;
  EXPECT_EQ(values(from_dlpack(newer)), (std::vector<double>{0, 1}));
  EXPECT_EQ(deletions, 3);
}

TEST(DLPackImport, CudaTensorWithoutAGpuIsNotSupported) {
  if (cuda_is_available()) GTEST_SKIP() << "a GPU is present; DLPackCuda covers it";
  int deletions = 0;
  DLManagedTensor* m = make_producer({2}, std::nullopt, &deletions, {kDLFloat, 32, 1}, {kDLCUDA, 0});
  EXPECT_THROW_MSG(from_dlpack(m), std::runtime_error,
                   "[from_dlpack] a tensor on cuda:0 needs 1 visible GPU(s) and a build with DTENSOR_WITH_CUDA");
  m->deleter(m);
  EXPECT_EQ(deletions, 1);
}

TEST(DLPackCuda, RoundTripSharesDeviceMemory) {
  REQUIRE_GPU();
  Tensor t = sample(DType::F32, {4, 6}).to(Device::cuda(0));
  DLManagedTensorVersioned* m = to_dlpack_versioned(t.t());
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, 0);
  EXPECT_EQ(m->dl_tensor.data, t.data_ptr());
  Tensor back = from_dlpack(m);
  EXPECT_EQ(back.device(), Device::cuda(0));
  EXPECT_EQ(values(back), reference_values(t.t().to(Device::cpu())));
  back.select(0, 2).fill_(9.0);  // column 2 of t, written on the GPU through the import
  EXPECT_EQ(values(t.select(1, 2)), (std::vector<double>(4, 9.0)));
}

TEST(DLPackCuda, ImportedDeviceMemoryIsReleasedAfterQueuedWork) {
  REQUIRE_GPU();
  int deletions = 0;
  {
    // The producer here is dtensor itself: an export whose deleter is wrapped to count.
    static int* counter = nullptr;
    static void (*inner)(DLManagedTensor*) = nullptr;
    counter = &deletions;
    DLManagedTensor* m = to_dlpack(Tensor::ones({1024, 1024}, DType::F32, Device::cuda(0)));
    inner = m->deleter;
    m->deleter = [](DLManagedTensor* self) {
      ++*counter;
      inner(self);
    };
    Tensor x = from_dlpack(m);
    Tensor y = matmul(x, x);  // queued; x's memory must outlive it
    x = Tensor();
    EXPECT_EQ(deletions, 1);
    EXPECT_EQ(y.to(Device::cpu()).to_vector<float>()[0], 1024.0f);
  }
  EXPECT_EQ(deletions, 1);
}

TEST(DLPackDist, ImportedShardsBecomeADistTensor) {
  int deletions = 0;
  std::vector<std::vector<double>> gathered(2);
  std::vector<Shape> global_shapes(2);
  std::mutex mu;
  launch(2, [&](Group world) {
    DeviceMesh mesh(world, {2});
    int local_deletions = 0;
    {
      // Rank r's producer holds rows 3r .. 3r+2 of a 6 x 2 tensor: 6r + 0, 1, ...
      DLManagedTensor* m = make_producer({3, 2}, std::nullopt, &local_deletions);
      Tensor shard = from_dlpack(m);
      shard.copy_(add(shard, 6.0 * world.rank()));
      const DistTensor d = DistTensor::from_local(shard, mesh, {Shard(0)});
      global_shapes[static_cast<size_t>(world.rank())] = d.shape();
      gathered[static_cast<size_t>(world.rank())] = values(d.full_tensor());
    }
    std::lock_guard<std::mutex> lock(mu);
    deletions += local_deletions;
  });
  std::vector<double> expected(12);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<double>(i);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(global_shapes[r], (Shape{6, 2})) << "rank " << r;
    EXPECT_EQ(gathered[r], expected) << "rank " << r;
  }
  EXPECT_EQ(deletions, 2) << "each rank's producer freed once";
}
