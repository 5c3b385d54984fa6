// cuDNN's fused attention (internal): the decisions that need no GPU, compiled in
// every build and tested on the CPU (test_cudnn_attention): how an attention call of
// the kernel table (attention_plan.h: any number of batch dims, each operand with its
// own strides) maps onto cuDNN's 4-D [B, H, S, D] tensors, whether cuDNN's fused
// flash attention takes the call (and why not), the key its graphs are cached
// under, and DTENSOR_ATTENTION. The graphs themselves: cudnn/cudnn_attention.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/attention_plan.h"
#include "dtensor/dtype.h"

namespace dtensor::backend::cudnn {

// DTENSOR_ATTENTION: which attention runs CUDA tensors. Auto (the default): cuDNN
// where it takes the call, else the own kernels (the reason said once); Cudnn: a
// call cuDNN refuses is an error naming the reason; Own: the own kernels.
enum class AttentionEngine : uint8_t { Auto, Cudnn, Own };
// "auto", "cudnn", "own" (std::invalid_argument naming DTENSOR_ATTENTION otherwise).
AttentionEngine parse_attention_engine(const std::string& text);
// DTENSOR_ATTENTION, read at the first call (unset or empty: Auto), or what
// set_attention_engine set since (the tests and gpu_bench run both in one process).
AttentionEngine attention_engine();
void set_attention_engine(AttentionEngine engine);
const char* attention_engine_name(AttentionEngine engine);

// A cuDNN tensor of attention: dims and strides in elements, [B, H, S, D].
struct Dims4 {
  std::array<int64_t, 4> dims{}, strides{};
  bool operator==(const Dims4&) const = default;
};

// The batch dims of an attention call folded into cuDNN's two, B and H: dims of
// size 1 are dropped, and neighbours merge where every operand steps over the inner
// one exactly (stride[i] == stride[i + 1] * size[i + 1]), so that entry
// e = b * H + h of the kernel table's row-major order is the same element everywhere.
// nullopt where more than two dims remain. `operands` are the operands' rows in one
// order; the result's strides follow it.
struct FoldedBatch {
  int64_t b = 1, h = 1;
  std::vector<std::array<int64_t, 2>> strides;  // per operand: {stride of b, stride of h}
};
std::optional<FoldedBatch> fold_batch(const AttentionBatch& batch, const std::vector<AttentionRows>& operands);

// The operands of a forward (q, k, v, o; stats [B, H, Sq, 1] F32 contiguous, the
// kernel table's lse) and of a backward (also d_o, dq, dk, dv), as cuDNN tensors.
struct AttentionTensors {
  Dims4 q, k, v, o, stats;
  Dims4 d_o, dq, dk, dv;  // backward only
  bool operator==(const AttentionTensors&) const = default;
};

// What a call needs from the device and the library besides its shape.
struct AttentionTarget {
  int sm = 0;                    // compute capability x 10 (90 for an H100/H200)
  int64_t cudnn_version = 0;     // cudnnGetVersion(): 91900 for 9.19.0
  bool pointers_aligned = true;  // every operand's address a multiple of 16 bytes
};

// One call as cuDNN sees it: dims, strides, dtype, mask and direction. The cache key
// of its graph (the scale is a by-value scalar, not part of the graph).
struct AttentionKey {
  AttentionTensors tensors;
  int64_t b = 1, h = 1, queries = 0, keys = 0, head_dim = 0, value_dim = 0;
  DType dtype = DType::BF16;
  bool causal = false, backward = false;
  int device = 0;
  bool operator==(const AttentionKey&) const = default;
  std::string to_string() const;  // "fwd bf16 causal B2 H16 Sq2048 Sk2048 D128 Dv128"
};
struct AttentionKeyHash {
  size_t operator()(const AttentionKey& key) const;
};

// The call's key, or the reason cuDNN's fused attention does not take it (the
// decision the own kernels fall back on), as cudnn-frontend's checks for cuDNN 9:
// BF16 or F16 operands; compute capability 8.0 or newer; head and value dims
// multiples of 8, at most 128 (256 on compute capability 9.x with cuDNN 9.5 or
// newer, the backward too there); the value dim equal to the head dim below cuDNN 9.5
// (newer: at most the head dim); rows of unit stride whose other strides are non-zero
// multiples of 8 elements (16 bytes) and 16-byte aligned addresses; the batch dims
// folding into [B, H]; at least one query and one key; not cuDNN 9.10.0/9.10.1; a
// backward not of one query and one key, and up to cuDNN 9.15 of a key count that is
// a multiple of 128; a causal forward of one query from cuDNN 9.10.
// `rows`: q, k, v, o and, for a backward, d_o, dq, dk, dv.
struct AttentionDecision {
  std::optional<AttentionKey> key;
  std::string refusal;  // empty where key is set
};
AttentionDecision decide(const AttentionShape& shape, DType dtype, const std::vector<AttentionRows>& rows,
                         bool backward, const AttentionTarget& target, int device);

}  // namespace dtensor::backend::cudnn
