// cuDNN's fused attention: the GPU-free decisions (cudnn_attention_plan.h).
#include "backend/cudnn_attention_plan.h"

#include <atomic>
#include <cstdlib>
#include <functional>
#include <stdexcept>

#include "util/check.h"

namespace dtensor::backend::cudnn {

AttentionEngine parse_attention_engine(const std::string& text) {
  if (text.empty() || text == "auto") return AttentionEngine::Auto;
  if (text == "cudnn") return AttentionEngine::Cudnn;
  if (text == "own") return AttentionEngine::Own;
  throw std::invalid_argument("[attention] DTENSOR_ATTENTION: expected auto, cudnn or own, got '" + text + "'");
}

namespace {
std::atomic<int> engine_set{-1};  // an AttentionEngine once read or set
}  // namespace

AttentionEngine attention_engine() {
  int engine = engine_set.load(std::memory_order_relaxed);
  if (engine < 0) {
    const char* env = std::getenv("DTENSOR_ATTENTION");
    int expected = -1;
    engine = static_cast<int>(parse_attention_engine(env ? env : ""));
    if (!engine_set.compare_exchange_strong(expected, engine)) engine = expected;
  }
  return static_cast<AttentionEngine>(engine);
}

void set_attention_engine(AttentionEngine engine) { engine_set.store(static_cast<int>(engine)); }

const char* attention_engine_name(AttentionEngine engine) {
  switch (engine) {
    case AttentionEngine::Auto: return "auto";
    case AttentionEngine::Cudnn: return "cudnn";
    case AttentionEngine::Own: return "own";
  }
  return "?";
}

std::optional<FoldedBatch> fold_batch(const AttentionBatch& batch, const std::vector<AttentionRows>& operands) {
  // The dims that count (size > 1), outermost first, each with every operand's stride.
  struct Dim {
    int64_t size;
    std::vector<int64_t> strides;
  };
  std::vector<Dim> dims;
  for (int d = 0; d < batch.dims; ++d) {
    if (batch.sizes[d] == 1) continue;
    Dim dim{batch.sizes[d], {}};
    for (const AttentionRows& rows : operands) dim.strides.push_back(rows.batch_strides[d]);
    // Merged into the dim before it where every operand steps over this one exactly.
    if (!dims.empty()) {
      Dim& outer = dims.back();
      bool merges = true;
      for (size_t o = 0; o < operands.size(); ++o) merges &= outer.strides[o] == dim.strides[o] * dim.size;
      if (merges) {
        outer.size *= dim.size;
        outer.strides = dim.strides;
        continue;
      }
    }
    dims.push_back(std::move(dim));
  }
  if (dims.size() > 2) return std::nullopt;
  FoldedBatch folded;
  folded.strides.assign(operands.size(), {0, 0});
  // One dim left is H (B = 1); none: B = H = 1. A size-1 dim's stride is any: the
  // next dim's extent keeps cuDNN's strides consistent.
  if (dims.size() == 2) {
    folded.b = dims[0].size;
    folded.h = dims[1].size;
    for (size_t o = 0; o < operands.size(); ++o) folded.strides[o] = {dims[0].strides[o], dims[1].strides[o]};
  } else if (dims.size() == 1) {
    folded.h = dims[0].size;
    for (size_t o = 0; o < operands.size(); ++o) {
      folded.strides[o] = {dims[0].strides[o] * dims[0].size, dims[0].strides[o]};
    }
  }
  return folded;
}

namespace {

// [B, H, rows, width] with the operand's folded batch strides, its row stride, unit
// stride along width. Size-1 dims get the stride of the extent inside them (cuDNN
// checks strides even where a dim has one element).
Dims4 operand_dims(const FoldedBatch& f, size_t o, int64_t rows, int64_t width, int64_t row_stride) {
  Dims4 t;
  t.dims = {f.b, f.h, rows, width};
  const int64_t rs = rows == 1 ? width : row_stride;
  const int64_t hs = f.h == 1 ? rows * rs : f.strides[o][1];
  const int64_t bs = f.b == 1 ? f.h * hs : f.strides[o][0];
  t.strides = {bs, hs, rs, 1};
  return t;
}

// Strides that are multiples of 8 elements and not 0 (a dim broadcast by a zero
// stride repeats rows the engines take as distinct) where the dim has more than one.
bool aligned_strides(const Dims4& t) {
  for (int d = 0; d < 3; ++d) {
    const int64_t stride = t.strides[static_cast<size_t>(d)];
    if (t.dims[static_cast<size_t>(d)] > 1 && (stride % 8 != 0 || stride == 0)) return false;
  }
  return true;
}

}  // namespace

AttentionDecision decide(const AttentionShape& s, DType dtype, const std::vector<AttentionRows>& rows, bool backward,
                         const AttentionTarget& target, int device) {
  auto refuse = [](std::string why) { return AttentionDecision{std::nullopt, std::move(why)}; };
  if (dtype != DType::BF16 && dtype != DType::F16) {
    return refuse(detail::concat("cuDNN's fused attention takes BF16 and F16, got ", dtype_name(dtype)));
  }
  if (target.sm < 80) {
    return refuse(detail::concat("cuDNN's fused attention needs compute capability 8.0 or newer, this GPU has ",
                                 target.sm / 10, ".", target.sm % 10));
  }
  if (s.queries < 1 || s.keys < 1) return refuse("no queries or no keys");
  const int64_t version = target.cudnn_version;
  if (version == 91000 || version == 91001) {
    return refuse("cuDNN 9.10.0 and 9.10.1 have known bugs in fused attention (cudnn-frontend refuses them too)");
  }
  if (backward && s.queries == 1 && s.keys == 1) {
    return refuse("cuDNN's fused attention backward does not take one query and one key");
  }
  if (!backward && s.causal && s.queries == 1 && version <= 90900) {
    return refuse(detail::concat("cuDNN ", version, " does not take a causal mask with one query (9.10 does)"));
  }
  if (backward && version <= 91500 && s.keys % 128 != 0) {
    return refuse(detail::concat("cuDNN ", version,
                                 "'s fused attention backward needs a key count that is a multiple of 128, got ",
                                 s.keys, " (9.16 takes any)"));
  }
  // 256-wide heads: Hopper (compute capability 9.x) from cuDNN 9.5.
  const bool wide = target.sm / 10 == 9 && version >= 90500;
  const int64_t most = wide ? 256 : 128;
  for (const auto& [name, d] : {std::pair{"head", s.head_dim}, std::pair{"value", s.value_dim}}) {
    if (d % 8 != 0 || d > most || d < 8) {
      return refuse(detail::concat("cuDNN's fused attention takes ", name, " dims that are multiples of 8 up to ", most,
                                   wide ? "" : " (256 needs compute capability 9.x and cuDNN 9.5)", ", got ", d));
    }
  }
  if (version < 90500 ? s.value_dim != s.head_dim : s.value_dim > s.head_dim) {
    return refuse(detail::concat("cuDNN ", version, " takes a value dim ", version < 90500 ? "equal to" : "at most",
                                 " the head dim, got ", s.value_dim, " and ", s.head_dim));
  }
  const size_t operands = backward ? 8 : 4;
  DT_CHECK_ARG(rows.size() == operands, "cudnn attention", "expected ", operands, " operands' rows, got ", rows.size());
  const std::optional<FoldedBatch> folded = fold_batch(s.batch, rows);
  if (!folded) {
    return refuse(detail::concat("the ", s.batch.dims,
                                 " batch dims do not fold into cuDNN's [B, H] (their strides do not nest)"));
  }
  AttentionKey key;
  key.b = folded->b;
  key.h = folded->h;
  key.queries = s.queries;
  key.keys = s.keys;
  key.head_dim = s.head_dim;
  key.value_dim = s.value_dim;
  key.dtype = dtype;
  key.causal = s.causal;
  key.backward = backward;
  key.device = device;
  AttentionTensors& t = key.tensors;
  // rows: q, k, v, o, then d_o, dq, dk, dv.
  t.q = operand_dims(*folded, 0, s.queries, s.head_dim, rows[0].row_stride);
  t.k = operand_dims(*folded, 1, s.keys, s.head_dim, rows[1].row_stride);
  t.v = operand_dims(*folded, 2, s.keys, s.value_dim, rows[2].row_stride);
  t.o = operand_dims(*folded, 3, s.queries, s.value_dim, rows[3].row_stride);
  t.stats.dims = {folded->b, folded->h, s.queries, 1};
  t.stats.strides = {folded->h * s.queries, s.queries, 1, 1};
  std::vector<const Dims4*> all = {&t.q, &t.k, &t.v, &t.o};
  if (backward) {
    t.d_o = operand_dims(*folded, 4, s.queries, s.value_dim, rows[4].row_stride);
    t.dq = operand_dims(*folded, 5, s.queries, s.head_dim, rows[5].row_stride);
    t.dk = operand_dims(*folded, 6, s.keys, s.head_dim, rows[6].row_stride);
    t.dv = operand_dims(*folded, 7, s.keys, s.value_dim, rows[7].row_stride);
    all.insert(all.end(), {&t.d_o, &t.dq, &t.dk, &t.dv});
  }
  for (const Dims4* d : all) {
    if (!aligned_strides(*d)) {
      return refuse(
          detail::concat("cuDNN's fused attention needs strides that are non-zero multiples of 8 "
                         "elements (16 bytes), got dims [",
                         d->dims[0], ", ", d->dims[1], ", ", d->dims[2], ", ", d->dims[3], "] strides [", d->strides[0],
                         ", ", d->strides[1], ", ", d->strides[2], ", 1]"));
    }
  }
  if (!target.pointers_aligned) return refuse("cuDNN's fused attention needs 16-byte aligned operands");
  return {key, ""};
}

std::string AttentionKey::to_string() const {
  return detail::concat(backward ? "bwd " : "fwd ", dtype_name(dtype), causal ? " causal" : "", " B", b, " H", h, " Sq",
                        queries, " Sk", keys, " D", head_dim, " Dv", value_dim, " on cuda:", device);
}

size_t AttentionKeyHash::operator()(const AttentionKey& key) const {
  size_t h = 0;
  auto mix = [&h](int64_t v) { h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (const Dims4* t : {&key.tensors.q, &key.tensors.k, &key.tensors.v, &key.tensors.o, &key.tensors.stats,
                         &key.tensors.d_o, &key.tensors.dq, &key.tensors.dk, &key.tensors.dv}) {
    for (int64_t v : t->dims) mix(v);
    for (int64_t v : t->strides) mix(v);
  }
  for (int64_t v :
       {key.b, key.h, key.queries, key.keys, key.head_dim, key.value_dim, static_cast<int64_t>(key.dtype),
        static_cast<int64_t>(key.causal), static_cast<int64_t>(key.backward), static_cast<int64_t>(key.device)}) {
    mix(v);
  }
  return h;
}

}  // namespace dtensor::backend::cudnn
