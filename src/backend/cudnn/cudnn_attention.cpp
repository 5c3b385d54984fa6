// cuDNN's fused attention through its backend API (cudnn_attention.h).
//
// The graphs are the ones cudnn-frontend 1.x lowers scaled-dot-product attention to
// for cuDNN 9.x with a causal mask (its "composite" SDPA; the single-op SDPA
// descriptor of 9.19 has no mask), which cuDNN's heuristics map onto its fused
// flash-attention engines:
//   forward   S = Q K^T; S *= scale; [mask: row >= col, else -inf]; M = max_row S;
//             E = exp(S - M); Z = sum_row E; stats = M + log Z; P = E / Z (16-bit);
//             O = P V
//   backward  D = sum_row(dO * O); S = Q K^T * scale - stats; [mask]; P = exp S;
//             dV = P^T dO; dS = P (dO V^T - D) * scale; dK = dS^T Q; dQ = dS K
//             (dQ through an FP32 accumulator in the workspace, as the frontend does)
// K (and V in the backward) enter the products transposed by their strides alone.
// Every score-sized tensor is virtual: nothing [Sq, Sk] reaches memory.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <atomic>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_runtime.h"
#include "backend/cudnn_attention.h"
#include "util/check.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // the graph's and plan's handle: optional since 9.8

namespace dtensor::backend::cudnn {
namespace {

// A cuDNN call that fails while a graph is built: the graph is refused (the own
// kernels run the call) with this reason.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_build(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw Refused(detail::concat(what, " failed: ", cudnnGetErrorString(status)));
  }
}

void check_run(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw std::runtime_error(detail::concat("[attention] cuDNN ", what, " failed: ", cudnnGetErrorString(status)));
  }
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc(cudnnBackendDescriptorType_t type, const char* what) : what_(what) {
    check_build(cudnnBackendCreateDescriptor(type, &d_), what);
  }
  Desc(Desc&& other) noexcept : d_(other.d_), what_(other.what_) { other.d_ = nullptr; }
  Desc& operator=(Desc&&) = delete;
  Desc(const Desc&) = delete;
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }

  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* value) {
    check_build(cudnnBackendSetAttribute(d_, name, type, count, value), what_);
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& value) {
    cudnnBackendDescriptor_t v = value.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  Desc& set_int(cudnnBackendAttributeName_t name, int64_t value) { return set(name, CUDNN_TYPE_INT64, 1, &value); }
  Desc& set_type(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
  }
  Desc& finalize() {
    check_build(cudnnBackendFinalize(d_), what_);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  const char* what_;
};

// Unique ids of the graphs' tensors that the variant pack names.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kGradOut,
  kGradQ,
  kGradK,
  kGradV,
  kOne,
  kRowSum,    // backward: sum_row(dO * O), FP32, in the workspace
  kGradQAcc,  // backward: dQ's FP32 accumulator, in the workspace
  kVirtual = 100,
};

// A graph under construction: its descriptors (kept for the plan's lifetime) and
// the next virtual tensor id.
class Builder {
 public:
  explicit Builder(cudnnDataType_t io) : io_(io) {}

  // A tensor [dims] with `strides`; `virt`: never in memory; `by_value`: a host scalar.
  const Desc& tensor(int64_t uid, cudnnDataType_t type, const Dims4& t, bool virt = false, bool by_value = false) {
    Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "cuDNN tensor descriptor");
    d.set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data())
        .set_int(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
        .set_int(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    const bool yes = true;
    if (virt) d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    if (by_value) d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    d.finalize();
    return keep(std::move(d));
  }
  const Desc& virt(cudnnDataType_t type, const Dims4& t) { return tensor(next_virtual_++, type, t, true); }
  const Desc& scalar(int64_t uid) {
    Dims4 one;
    one.dims = {1, 1, 1, 1};
    one.strides = {1, 1, 1, 1};
    return tensor(uid, CUDNN_DATA_FLOAT, one, false, true);
  }

  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc m(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "cuDNN matmul descriptor");
    m.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "cuDNN matmul operation");
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m)
        .finalize();
    keep(std::move(m));
    add_op(std::move(op));
  }

  // y = mode(x [, b [, t]]); `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, const Desc* t = nullptr, int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "cuDNN pointwise descriptor");
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, precision);
    if (axis >= 0) pw.set_int(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "cuDNN pointwise operation");
    const float one = 1.0f;
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.finalize();
    keep(std::move(pw));
    add_op(std::move(op));
  }

  // A new virtual FP32 tensor of `shape` holding mode(x [, b]).
  const Desc& apply(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Dims4& shape) {
    const Desc& y = virt(CUDNN_DATA_FLOAT, shape);
    pointwise(mode, x, b, y);
    return y;
  }
  // A new virtual FP32 tensor of `shape` holding reduce(x).
  const Desc& reduced(cudnnReduceTensorOp_t how, const Desc& x, const Dims4& shape) {
    const Desc& y = virt(CUDNN_DATA_FLOAT, shape);
    reduce(how, x, y);
    return y;
  }
  // A new virtual FP32 tensor of `shape` holding a b.
  const Desc& product(const Desc& a, const Desc& b, const Dims4& shape) {
    const Desc& c = virt(CUDNN_DATA_FLOAT, shape);
    matmul(a, b, c);
    return c;
  }

  // y = reduce(x) over the dims where y has size 1.
  void reduce(cudnnReduceTensorOp_t how, const Desc& x, const Desc& y) {
    Desc r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "cuDNN reduction descriptor");
    r.set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
        .set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how)
        .finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "cuDNN reduction operation");
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .finalize();
    keep(std::move(r));
    add_op(std::move(op));
  }

  // y: x's data seen through other dims and strides (a transpose, no copy).
  void reshape(const Desc& x, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "cuDNN reshape operation");
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y).finalize();
    add_op(std::move(op));
  }

  // The causal mask, top-left aligned (key j kept for query i when j <= i): scores
  // where kept, -inf elsewhere.
  const Desc& causal_mask(const Desc& scores, const Dims4& shape, const Desc& neg_inf) {
    const Desc& row = virt(CUDNN_DATA_INT32, shape);
    const Desc& col = virt(CUDNN_DATA_INT32, shape);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, row, CUDNN_DATA_FLOAT, nullptr, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, col, CUDNN_DATA_FLOAT, nullptr, 3);
    const Desc& keep_it = virt(CUDNN_DATA_BOOLEAN, shape);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep_it, CUDNN_DATA_BOOLEAN);
    const Desc& masked = virt(CUDNN_DATA_FLOAT, shape);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, &neg_inf, masked, CUDNN_DATA_FLOAT, &keep_it);
    return masked;
  }

  cudnnDataType_t io() const { return io_; }
  std::deque<Desc> take_descriptors() { return std::move(kept_); }
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

 private:
  const Desc& keep(Desc d) {
    kept_.push_back(std::move(d));  // a deque: references stay valid as it grows
    return kept_.back();
  }
  void add_op(Desc op) { ops_.push_back(keep(std::move(op)).get()); }

  cudnnDataType_t io_;
  int64_t next_virtual_ = kVirtual;
  std::deque<Desc> kept_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// Dense [b, h, rows, cols].
Dims4 dense(int64_t b, int64_t h, int64_t rows, int64_t cols) {
  Dims4 t;
  t.dims = {b, h, rows, cols};
  t.strides = {h * rows * cols, rows * cols, cols, 1};
  return t;
}

// t with its last two dims swapped (the same memory seen transposed).
Dims4 transposed(const Dims4& t) {
  Dims4 out = t;
  std::swap(out.dims[2], out.dims[3]);
  std::swap(out.strides[2], out.strides[3]);
  return out;
}

void build_forward(Builder& g, const AttentionKey& key) {
  const AttentionTensors& t = key.tensors;
  const cudnnDataType_t io = g.io();
  const Desc& q = g.tensor(kQ, io, t.q);
  const Desc& kt = g.tensor(kK, io, transposed(t.k));
  const Desc& v = g.tensor(kV, io, t.v);
  const Desc& o = g.tensor(kO, io, t.o);
  const Desc& stats = g.tensor(kStats, CUDNN_DATA_FLOAT, t.stats);
  const Desc& scale = g.scalar(kScale);
  const Dims4 scores = dense(key.b, key.h, key.queries, key.keys), rows = dense(key.b, key.h, key.queries, 1);
  const Desc& scaled = g.apply(CUDNN_POINTWISE_MUL, g.product(q, kt, scores), &scale, scores);
  const Desc& masked = key.causal ? g.causal_mask(scaled, scores, g.scalar(kNegInf)) : scaled;
  const Desc& m = g.reduced(CUDNN_REDUCE_TENSOR_MAX, masked, rows);
  const Desc& e = g.apply(CUDNN_POINTWISE_EXP, g.apply(CUDNN_POINTWISE_SUB, masked, &m, scores), nullptr, scores);
  const Desc& z = g.reduced(CUDNN_REDUCE_TENSOR_ADD, e, rows);
  g.pointwise(CUDNN_POINTWISE_ADD, m, &g.apply(CUDNN_POINTWISE_LOG, z, nullptr, rows), stats);
  // The probabilities enter the second product in the operands' dtype.
  const Desc& p = g.virt(io, scores);
  g.pointwise(CUDNN_POINTWISE_DIV, e, &z, p);
  g.matmul(p, v, o);
}

void build_backward(Builder& g, const AttentionKey& key) {
  const AttentionTensors& t = key.tensors;
  const cudnnDataType_t io = g.io();
  const Desc& q = g.tensor(kQ, io, t.q);
  const Desc& kt = g.tensor(kK, io, transposed(t.k));
  const Desc& vt = g.tensor(kV, io, transposed(t.v));
  const Desc& o = g.tensor(kO, io, t.o);
  const Desc& d_o = g.tensor(kGradOut, io, t.d_o);
  const Desc& stats = g.tensor(kStats, CUDNN_DATA_FLOAT, t.stats);
  const Desc& dq = g.tensor(kGradQ, io, t.dq);
  const Desc& dk = g.tensor(kGradK, io, t.dk);
  const Desc& dv = g.tensor(kGradV, io, t.dv);
  const Desc& scale = g.scalar(kScale);
  const Desc& one = g.scalar(kOne);
  const Dims4 scores = dense(key.b, key.h, key.queries, key.keys), rows = dense(key.b, key.h, key.queries, 1);
  // D = sum_row(dO * O), kept in the workspace for the engine's two passes.
  const Desc& prod = g.apply(CUDNN_POINTWISE_MUL, d_o, &o, dense(key.b, key.h, key.queries, key.value_dim));
  const Desc& row_sum = g.tensor(kRowSum, CUDNN_DATA_FLOAT, rows);
  g.pointwise(CUDNN_POINTWISE_MUL, g.reduced(CUDNN_REDUCE_TENSOR_ADD, prod, rows), &one, row_sum);
  // P = exp(Q K^T * scale - stats), masked.
  const Desc& scaled = g.apply(CUDNN_POINTWISE_MUL, g.product(q, kt, scores), &scale, scores);
  const Desc& shifted = g.apply(CUDNN_POINTWISE_SUB, scaled, &stats, scores);
  const Desc& masked = key.causal ? g.causal_mask(shifted, scores, g.scalar(kNegInf)) : shifted;
  const Desc& p = g.apply(CUDNN_POINTWISE_EXP, masked, nullptr, scores);
  // dV = P^T dO.
  const Desc& pt = g.virt(io, transposed(scores));
  g.reshape(p, pt);
  g.matmul(pt, d_o, dv);
  // dS = P (dO V^T - D) * scale.
  const Desc& centred = g.apply(CUDNN_POINTWISE_SUB, g.product(d_o, vt, scores), &row_sum, scores);
  const Desc& ds = g.apply(CUDNN_POINTWISE_MUL, g.apply(CUDNN_POINTWISE_MUL, centred, &p, scores), &scale, scores);
  // dK = dS^T Q.
  const Desc& dst = g.virt(io, transposed(scores));
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);
  // dQ = dS K, accumulated in FP32 in the workspace, then stored.
  const Desc& k = g.virt(CUDNN_DATA_FLOAT, t.k);  // as cudnn-frontend leaves it (its intermediate type)
  g.reshape(kt, k);
  const Desc& dq_acc = g.tensor(kGradQAcc, CUDNN_DATA_FLOAT, dense(key.b, key.h, key.queries, key.head_dim));
  g.matmul(ds, k, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, dq);
}

// The calling thread's cuDNN handle of `device`. Never destroyed (as PyTorch's):
// at exit the CUDA runtime may already be gone.
cudnnHandle_t handle_for(int device) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  backend::cuda::current_stream(device);  // makes `device` current, as the run on it will
  cudnnHandle_t h = nullptr;
  check_run(cudnnCreate(&h), "cudnnCreate");  // an error (out of memory), not a refusal to cache
  return handles.emplace(device, h).first->second;
}

// A built graph: its plan (and the descriptors it was built from), the workspace
// it needs beyond the backward's own FP32 buffers.
struct Graph {
  std::deque<Desc> descriptors;
  std::unique_ptr<Desc> plan;
  cudnnHandle_t handle = nullptr;
  int64_t engine_workspace = 0;
  int64_t grad_q_acc_bytes = 0, row_sum_bytes = 0;  // backward: [accumulator | row sums | engine's]
  bool backward = false, causal = false;
};

int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

std::unique_ptr<Graph> build(const AttentionKey& key) {
  auto graph = std::make_unique<Graph>();
  graph->handle = handle_for(key.device);
  graph->backward = key.backward;
  graph->causal = key.causal;
  Builder g(key.dtype == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF);
  if (key.backward) {
    build_backward(g, key);
    graph->grad_q_acc_bytes = round_up(key.b * key.h * key.queries * key.head_dim * 4);
    graph->row_sum_bytes = round_up(key.b * key.h * key.queries * 4);
  } else {
    build_forward(g, key);
  }
  Desc op_graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "cuDNN operation graph");
  const std::vector<cudnnBackendDescriptor_t>& ops = g.ops();
  op_graph
      .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()), ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &graph->handle)
      .finalize();
  // The heuristics' engine configurations, best first; the first whose plan
  // finalizes runs the graph.
  Desc heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "cuDNN engine heuristics");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)
      .finalize();
  int64_t count = 0;
  check_build(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       0, &count, nullptr),
              "cuDNN engine heuristics (count)");
  if (count <= 0) throw Refused("cuDNN's heuristics return no engine for this graph");
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "cuDNN engine configuration");
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  check_build(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       count, &returned, raw.data()),
              "cuDNN engine heuristics");
  std::string last = "no engine configuration";
  for (int64_t i = 0; i < returned && !graph->plan; ++i) {
    auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "cuDNN execution plan");
    cudnnBackendDescriptor_t config = configs[static_cast<size_t>(i)].get();
    const cudnnStatus_t set = cudnnBackendSetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    const cudnnStatus_t handle_set =
        cudnnBackendSetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &graph->handle);
    const cudnnStatus_t done = set == CUDNN_STATUS_SUCCESS && handle_set == CUDNN_STATUS_SUCCESS
                                   ? cudnnBackendFinalize(plan->get())
                                   : (set != CUDNN_STATUS_SUCCESS ? set : handle_set);
    if (done == CUDNN_STATUS_SUCCESS) {
      graph->plan = std::move(plan);
    } else {
      last = cudnnGetErrorString(done);
    }
  }
  if (!graph->plan) {
    throw Refused(detail::concat("none of the ", returned, " engines cuDNN's heuristics name builds (", last, ")"));
  }
  int64_t elements = 0;
  check_build(cudnnBackendGetAttribute(graph->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                       1, &elements, &graph->engine_workspace),
              "cuDNN plan workspace size");
  graph->descriptors = g.take_descriptors();
  graph->descriptors.push_back(std::move(op_graph));
  graph->descriptors.push_back(std::move(heuristics));
  for (Desc& c : configs) graph->descriptors.push_back(std::move(c));
  return graph;
}

std::atomic<int64_t> run_count{0};
constexpr size_t kMaxGraphsPerThread = 256;

// What the mask puts where a key is hidden: -inf, or the lowest float before cuDNN
// 9.10 (as cudnn-frontend).
float masked_value() {
  return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
}

// Graphs and refusals per thread and key (a plan is tied to its thread's handle).
struct Entry {
  std::unique_ptr<Graph> graph;
  std::string refusal;
};

void execute(const Graph& graph, std::vector<int64_t> uids, std::vector<void*> pointers, void* workspace,
             void* stream) {
  check_run(cudnnSetStream(graph.handle, static_cast<cudaStream_t>(stream)), "cudnnSetStream");
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "cuDNN variant pack");
  void* engine_workspace = static_cast<char*>(workspace) + graph.grad_q_acc_bytes + graph.row_sum_bytes;
  try {
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
             pointers.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &engine_workspace)
        .finalize();
  } catch (const Refused& e) {
    throw std::runtime_error(std::string("[attention] ") + e.what());
  }
  check_run(cudnnBackendExecute(graph.handle, graph.plan->get(), pack.get()), "execute");
  run_count.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

bool compiled() { return true; }
int64_t runs() { return run_count.load(std::memory_order_relaxed); }

std::string version() {
  const size_t v = cudnnGetVersion();  // major * 10000 + minor * 100 + patch from 9.0
  return detail::concat(v / 10000, ".", v / 100 % 100, ".", v % 100);
}

AttentionTarget target(int device) {
  AttentionTarget t;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  t.sm = major * 10 + minor;
  t.cudnn_version = static_cast<int64_t>(cudnnGetVersion());
  return t;
}

Prepared prepare(const AttentionKey& key) {
  thread_local std::unordered_map<AttentionKey, Entry, AttentionKeyHash> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    // Bounded: shapes that keep changing (variable sequence lengths) rebuild rather
    // than grow the cache without end.
    if (cache.size() >= kMaxGraphsPerThread) cache.clear();
    Entry entry;
    try {
      entry.graph = build(key);
    } catch (const Refused& e) {
      entry.refusal = e.what();
    }
    it = cache.emplace(key, std::move(entry)).first;
  }
  const Entry& e = it->second;
  if (!e.graph) return {nullptr, 0, e.refusal};
  return {e.graph.get(), e.graph->grad_q_acc_bytes + e.graph->row_sum_bytes + e.graph->engine_workspace, ""};
}

void run_forward(const Prepared& prepared, const void* q, const void* k, const void* v, void* out, float* stats,
                 float scale, void* workspace, void* stream) {
  const auto& graph = *static_cast<const Graph*>(prepared.graph);
  DT_CHECK_ARG(!graph.backward, "attention", "a backward graph given to the forward");
  float neg_inf = masked_value();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> pointers = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, stats, &scale};
  if (graph.causal) {  // the pack names the graph's tensors only
    uids.push_back(kNegInf);
    pointers.push_back(&neg_inf);
  }
  execute(graph, std::move(uids), std::move(pointers), workspace, stream);
}

void run_backward(const Prepared& prepared, const void* q, const void* k, const void* v, const void* out,
                  const void* grad_out, const float* stats, void* grad_q, void* grad_k, void* grad_v, float scale,
                  void* workspace, void* stream) {
  const auto& graph = *static_cast<const Graph*>(prepared.graph);
  DT_CHECK_ARG(graph.backward, "attention_backward", "a forward graph given to the backward");
  char* base = static_cast<char*>(workspace);
  void* acc = base;
  void* row_sum = base + graph.grad_q_acc_bytes;
  // Before 9.6 the accumulator must start at zero (the frontend clears it there too).
  if (cudnnGetVersion() < 90600) {
    const cudaError_t e =
        cudaMemsetAsync(acc, 0, static_cast<size_t>(graph.grad_q_acc_bytes), static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      throw std::runtime_error(detail::concat("[attention_backward] cudaMemsetAsync failed: ", cudaGetErrorString(e)));
    }
  }
  float one = 1.0f, neg_inf = masked_value();
  std::vector<int64_t> uids = {kQ,     kK,     kV,     kO,   kGradOut, kStats,   kGradQ,
                               kGradK, kGradV, kScale, kOne, kRowSum,  kGradQAcc};
  std::vector<void*> pointers = {const_cast<void*>(q),
                                 const_cast<void*>(k),
                                 const_cast<void*>(v),
                                 const_cast<void*>(out),
                                 const_cast<void*>(grad_out),
                                 const_cast<float*>(stats),
                                 grad_q,
                                 grad_k,
                                 grad_v,
                                 &scale,
                                 &one,
                                 row_sum,
                                 acc};
  if (graph.causal) {
    uids.push_back(kNegInf);
    pointers.push_back(&neg_inf);
  }
  execute(graph, std::move(uids), std::move(pointers), workspace, stream);
}

}  // namespace dtensor::backend::cudnn
