// Auto-parallel on paper: given a transformer, a cluster and a global batch, estimate
// each parallel configuration's memory per device and step time, and rank them.
//
//   ModelSpec model = ModelSpec::gpt(/*layers=*/96, /*hidden=*/12288, /*heads=*/96, /*seq=*/2048, /*vocab=*/51200);
//   ClusterSpec cluster = ClusterSpec::preset("h100", 1024);
//   PlanSearch found = search_plans(model, cluster, /*global_batch=*/1536);
//   for (const PlanEstimate& e : found.ranked) std::cout << e.to_string() << "\n";
//
// The estimates are the literature's analytical model, with its sources:
// - FLOPs of a decoder layer per token: 2 x its matrix parameters plus attention's
//   4 x seq x hidden (forward), x3 for training, +1 forward with full recomputation
//   (Narayanan et al., SC'21: F = 96 B s l h^2 (1 + s/6h + V/16lh) with recomputation).
// - Memory per device with mixed-precision Adam, 16 bytes per parameter split by ZeRO
//   stage: 0: 16, 1: 4 + 12/dp, 2: 2 + 14/dp, 3: 16/dp (Rajbhandari et al.; in FP32:
//   16, 8 + 12/dp, 4 + 16/dp, 16/dp: the shard the optimizer updates apart from the
//   gathered copy), plus a ZeRO-3 working set of two gathered layers and the layers
//   outside the blocks; activations per layer per micro-batch (MemorySpec; Megatron's:
//   s b h (10 + 24/t + 5 a s / (h t)) bytes, s b h (34/t + 5 a s / (h t)) with sequence
//   parallelism, 34/t with selective recomputation, 2 s b h with full (Korthikanti et
//   al., 2022)), times the micro-batches a schedule keeps in flight (1F1B: p on the
//   first stage; interleaved: p (1 + (p-1)/(p v)); GPipe: m); the peak at backward's
//   start, or its end where the gradients outweigh the activations.
// - Step time: the device's share of the FLOPs at its GEMM rate (peak x efficiency,
//   which falls for small GEMMs: an [m, k] x [k, n] product runs at
//   eff_max / (1 + d0 (1/m + 1/n + 1/k)), d0 = d_half / 3, each of a layer's products
//   at its own shape: q, k, v, the output projection, the MLP's, attention's per head);
//   the memory-bound ops (norms, activations, dropout, residuals, and softmax over the
//   scores without fused attention) as the bytes stored per layer (MemorySpec), moved
//   5 times (written and read in forward, read, written and read in backward; 7 with
//   recomputation) at the memory bandwidth; tensor-parallel all-reduces (or
//   reduce-scatter + all-gather) on the critical path; the pipeline bubble (p-1)/(v m)
//   of the compute; point-to-point sends; the data-parallel gradient reduction (and
//   ZeRO-1's parameter gather) overlapped chunk by chunk with the last round's backward
//   (forward), as Megatron-Core does; all under the alpha-beta model of
//   cost_model.h with intra-node (NVLink) or inter-node links; the optimizer reading
//   and writing its bytes. On a host (a measured profile) the ops' dispatch (dearer
//   under tensor parallelism), the optimizer's per-tensor work, data parallelism's
//   flat-buffer copies and FSDP's host cost per collective are charged too.
// A GPU preset's GEMM efficiency is fitted to one published run; the GEMM half dim, the
// memory-bound ops' 5 (7) moves and backward's 2/3 share were set while Megatron-LM's
// A100 table was in view. `dtensor-plan --validate` compares the model with published
// runs (bench/RESULTS.md: all within 12.4%).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor::parallel {

// How an implementation of the model uses memory: what it keeps from forward for
// backward, what backward holds at its peak, and whether gradients live across steps.
// In values per token of the training dtype (bytes_per_value; a 1-byte mask is half
// a 16-bit value) unless FP32 is said. The defaults are Megatron-LM's block as
// Korthikanti et al. count it (s b h (10 + 24/t + 5 a s/(h t)) bytes at 2 bytes per
// value); models::gpt_model_spec gives dtensor's GPT's, counted from its ops and
// checked against the allocator's peaks (bench/RESULTS.md).
struct MemorySpec {
  // Per layer and token, kept for backward without recomputation:
  double hidden = 5;        // of width hidden, whole on every tensor-parallel rank (split with sequence parallelism)
  double hidden_split = 4;  // of width hidden, split by tp (q, k, v, the attention's output)
  double ffn_split = 2;     // of width ffn, split by tp (the MLP's pre-activation and activation)
  double scores = 2.5;      // per head and key, without fused attention (softmax, dropout mask and output)
  double per_head = 0;      // per head, with fused attention (the softmax's log-sum-exp; FP32)
  double scalars = 0;       // FP32, whole on every tp rank (norm statistics; split with sequence parallelism)
  // Of `hidden`, those kept whole even with sequence parallelism (the all-gathered
  // inputs of the column-parallel layers, where backward does not gather them again).
  double sp_gathered = 0;
  // With full recomputation, per layer and token: the checkpointed input, of width hidden.
  double checkpointed_hidden = 1;
  // Outside the layers, per token: of width hidden (the embedding's output: whole on
  // every tp rank, split with sequence parallelism), FP32 scalars (the final norm's
  // statistics), and the FP32 logits the loss keeps (of width vocab, split by tp).
  double outside_hidden = 0, outside_scalars = 0, logits = 1;
  // What backward adds to the activations at its peak (the last block's MLP backward),
  // per token: of width ffn and of width hidden (split by tp), and whether the logits
  // (and the final norm's statistics) are freed by then. The gradients then alive are
  // the output layer's and the last block's MLP's (all of them when they persist).
  double backward_ffn = 0, backward_hidden = 0;
  bool backward_frees_logits = false;
  // What the loss's backward adds beside the kept logits, per token, in FP32 values of
  // width vocab, every activation still alive: with the vocabulary whole (the fused
  // loss: the logits' gradient), and split over tp (the vocab-parallel loss, a
  // composite of ops whose gradients overlap). A large vocabulary's peak.
  double loss_backward = 0, loss_backward_split = 0;
  // Per micro-batch in flight on a pipeline stage that sends on: values of width
  // hidden at the stage boundary (the output kept for backward, its send buffer).
  double pipeline_hidden = 0;
  // Per layer and token, what a deferred weight gradient keeps once the input gradient
  // is done (the zero-bubble schedule's W): the matrix products' output gradients, of
  // width hidden whole on every tp rank, of width hidden split by tp, and of width ffn
  // split by tp (per routed copy in a mixture of experts); and whether the layer's
  // activations stay with it (the autograd graph waiting for W holds them all) or only
  // the products' inputs, taken as part of them.
  double deferred_hidden = 0, deferred_split = 0, deferred_ffn = 0;
  bool deferred_keeps_activations = false;
  // A mixture-of-experts block (ModelSpec::experts > 0): `ffn_split` then counts per
  // routed copy of a token (top_k of them; once per token at the shared expert's width), and the layer keeps besides,
  // per routed copy, `moe_hidden` values of width hidden (the dispatched rows, the experts' output), and per token
  // `moe_router` FP32 values per expert (the router's logits and probabilities) and `moe_scalars` FP32 values (gates,
  // indices, positions), and `moe_ep_scalars` more under expert parallelism.
  double moe_hidden = 0, moe_router = 0, moe_scalars = 0, moe_ep_scalars = 0;
  // Context parallelism (ParallelPlan::cp > 1): values per local token of width hidden
  // (split by tp) kept besides (dtensor's ring attention: its output, an FP32
  // accumulator in heads-major order, copied into the tokens' order for the output
  // projection).
  double cp_split = 0;
  // With a 16-bit training dtype (ClusterSpec::bytes_per_value 2), how parameters are
  // kept. False: Megatron's mixed precision, 16-bit parameters and gradients and the
  // FP32 master in the optimizer (2 + 2 + 12 bytes). True: parameters, gradients and
  // the optimizer's state in FP32 (4 + 4 + 8) and a 16-bit copy to compute with, cast
  // at each use and kept for backward per micro-batch in flight (PyTorch's autocast,
  // nn::ComputeDtype), or under ZeRO gathered in 16 bits (FSDP's param_dtype: ZeRO-1/2
  // a whole copy beside the FP32 shard, ZeRO-3 its working set).
  bool fp32_parameters = false;
  // Gradients live across steps in a buffer (Megatron's contiguous main_grad). False:
  // dropped after each optimizer step (set to none) and made again in backward.
  bool gradients_persist = true;
  // What a ZeRO stage shards the dense parameters over: every data-parallel and
  // context-parallel rank (Megatron-Core's distributed optimizer, TorchTitan), or only
  // the data-parallel ranks that are not expert-parallel (dp / ep), the cp and ep ranks
  // holding replicas whose shards are all-reduced (dtensor's parallelize_gpt: FSDP
  // over its 'dp' mesh dim, as HSDP over the rest). The experts' ZeRO group is the
  // same without the ep ranks (dp x cp / ep, or dp / ep).
  bool zero_over_cp_and_ep = true;
};

// A decoder-only transformer (GPT, Llama).
struct ModelSpec {
  std::string name;
  int64_t layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  int64_t ffn_hidden = 0;  // 0: 4 x hidden
  int64_t kv_heads = 0;    // 0: heads (fewer: grouped-query attention)
  bool gated_mlp = false;  // SwiGLU: three ffn matrices instead of two
  bool tied_embeddings = false;
  bool linear_biases = false;      // the blocks' linear layers have biases (not the experts)
  bool fused_qkv = true;           // q, k and v in one GEMM (Megatron); false: three, each at its own shape
  int64_t learned_positions = 0;   // rows of a learned position table (0: rotary or none)
  int64_t experts = 0, top_k = 0;  // mixture of experts (0: dense)
  // A mixture of experts' capacity factor: an expert takes at most this multiple of its
  // balanced share of the routed tokens (GShard), which bounds the rows the busiest
  // expert-parallel rank receives; the estimate takes every expert full (an upper
  // bound, tight when routing is uneven). 0: dropless, taken as balanced (the busiest
  // rank can hold more).
  double capacity_factor = 0;
  // A shared expert of this hidden width (0: none): a dense MLP every token of a
  // mixture-of-experts block also goes through (DeepSeek-MoE, Qwen-MoE), split by tp as
  // a dense MLP is, replicated over ep.
  int64_t shared_expert_ffn = 0;
  // Fused attention (FlashAttention, cuDNN): the [s, s] scores are never stored. Off:
  // they are written and read in forward and backward (Megatron-LM in 2021).
  bool flash_attention = true;
  // Ops an implementation dispatches per micro-batch (forward and backward ones): per
  // block, and outside the blocks (embedding, head, loss). With the cluster's
  // op_seconds they cost host time that does not shrink with the batch (0: not costed).
  // train_gpt's GPT dispatches 70 per block (115 with experts) and 32 outside (counted
  // by recording a step).
  int64_t ops_per_layer = 0, ops_outside_layers = 0;
  // Parameter tensors (weights, biases, norms' scales and shifts) per block and outside
  // the blocks, each a step of the optimizer's at the cluster's
  // optimizer_tensor_seconds (0: not costed).
  int64_t tensors_per_layer = 0, tensors_outside_layers = 0;
  MemorySpec memory;  // the implementation's activations (default: Megatron-LM's)

  static ModelSpec gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab);
  // Llama-style: SwiGLU, grouped-query attention, untied embeddings.
  static ModelSpec llama(int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn_hidden,
                         int64_t seq, int64_t vocab);

  int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }
  int64_t parameters() const;               // all of them
  int64_t layer_parameters() const;         // one block's (all experts)
  int64_t layer_expert_parameters() const;  // of those, the experts' (split by expert parallelism; 0: dense)
  // Training FLOPs (forward + backward) of one sequence; with full recomputation the
  // layers' forward runs twice.
  double flops_per_sequence(bool full_recompute) const;
  void validate() const;  // throws std::invalid_argument naming what is wrong
};

// Devices and links. Bandwidths are per device, one direction, bytes/s; latencies per hop.
struct ClusterSpec {
  std::string name;
  int64_t devices = 1;
  int64_t devices_per_node = 1;
  double memory_bytes = 0;                        // per device, usable
  double peak_flops = 0;                          // dense, the training dtype
  double gemm_efficiency = 0.8;                   // of peak on large GEMMs
  double gemm_half_dim = 256;                     // a square GEMM of this size runs at half that rate
  double intra_bandwidth = 0, intra_latency = 0;  // within a node (NVLink, shared memory)
  double inter_bandwidth = 0, inter_latency = 0;  // across nodes (InfiniBand)
  double memory_bandwidth = 0;                    // HBM or DRAM, for the optimizer step
  // The host, for ZeRO-Offload (ParallelPlan::offload): the device-host link (PCIe),
  // the host memory's bandwidth (the optimizer steps there) and its bytes, each per
  // device (a node's host shared by its devices). 0: no host to offload to.
  double host_bandwidth = 0, host_memory_bandwidth = 0, host_memory_bytes = 0;
  // The host is the device's own memory (a CPU: offload moves bytes within it), so a
  // configuration fits when the device's and the host's bytes together do.
  bool host_is_device_memory = false;
  // Host time per dispatched op (ModelSpec::ops_per_layer), on the critical path when
  // kernels run on the host (a measured profile, machine_profile.h). 0 for the GPU
  // presets: launches queue behind the kernels.
  double op_seconds = 0;
  // The same under tensor parallelism (tp > 1): each op's sharding, its collectives'
  // host side and the ranks' waits for each other. 0: op_seconds.
  double tp_op_seconds = 0;
  // Host time of the optimizer step per parameter tensor (clipping's norm, the update,
  // its state: each tensor's own ops and kernels), on the critical path on the host. 0
  // for the GPU presets (fused multi-tensor kernels).
  double optimizer_tensor_seconds = 0;
  // Host time of one of FSDP's collectives beyond its bytes (a unit's hooks, the
  // collective's launch and wait, packing a small unit), on the critical path on the
  // host: ZeRO-1 and 2 gather each unit once a step, ZeRO-3 for every micro-batch's
  // forward and backward, and each reduce-scatter costs one more. 0 for the GPU presets.
  double fsdp_collective_seconds = 0;
  // The data-parallel collectives run beside compute (GPUs: copy engines and spare
  // SMs). False where the same cores do both (the CPU: the threads backend's copies and
  // MPI's shared memory run on the ranks' cores): every byte's time is exposed.
  bool overlap_communication = true;
  int64_t bytes_per_value = 2;  // the training dtype (2: BF16/FP16 with FP32 master)

  // "a100" (DGX A100: 8 per node, 80 GB, 312 TFLOP/s BF16, NVLink 300 GB/s, 8 x 200 Gb/s
  // HDR), "h100" and "h200" (DGX H100/H200: 989 TFLOP/s BF16, 80/141 GB, NVLink 450 GB/s,
  // 8 x 400 Gb/s NDR), "cpu" (this kind of machine: the threads backend's measured
  // model, FP32). `devices` in all.
  static ClusterSpec preset(std::string_view name, int64_t devices);
  static std::vector<std::string> preset_names();
  void validate() const;
};

enum class Recompute { None, Selective, Full };
// ZeroBubble: ZB-H1 (pipeline_schedule.h's zero_bubble), backward split into the input
// gradient and the deferred weight gradient; its memory walked from the schedule.
enum class PlanSchedule { GPipe, OneFOneB, Interleaved, ZeroBubble };

struct ParallelPlan {
  int64_t dp = 1, tp = 1, pp = 1;
  // Context parallel: each sequence split over cp ranks (ring attention); the devices
  // are dp x cp x tp x pp, and the gradients are reduced over dp x cp.
  int64_t cp = 1;
  // Expert parallel: each block's experts split over ep of the dp ranks (ep divides dp,
  // as Megatron-Core and DeepSpeed carve it), the tokens sent to their experts' ranks
  // by all-to-alls; the experts' gradients reduced over dp x cp / ep.
  int64_t ep = 1;
  int zero = 0;  // 0: DDP (or Megatron's replicated optimizer), 1-3: ZeRO stage over dp
  // HSDP (hybrid sharding, ZeRO++'s hpZ, Megatron's distributed optimizer instances):
  // ZeRO shards over groups of this many ranks, and the groups, replicas of each
  // other, all-reduce their reduced shards. 0: over the whole group (dp x cp, or
  // dtensor's dp / ep, MemorySpec::zero_over_cp_and_ep). Not with expert parallelism.
  int64_t zero_shard = 0;
  int64_t micro_batch = 1;    // sequences per micro-batch
  int64_t micro_batches = 1;  // per step and data-parallel rank (pipeline m, or accumulation)
  PlanSchedule schedule = PlanSchedule::OneFOneB;
  int64_t virtual_stages = 1;  // with Interleaved
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  // The loss on the logits as tensor parallelism leaves them, split over the vocabulary
  // (Megatron's vocab-parallel cross entropy, PyTorch's loss_parallel). False: they are
  // all-gathered whole onto every tp rank first, which holds them whole until backward.
  bool loss_parallel = true;
  // FP32 gradients beside 16-bit parameters (Megatron-Core's main_grad): 18 bytes per
  // parameter instead of 16, and a data-parallel reduction of FP32.
  bool fp32_gradients = false;
  // ZeRO-Offload (zero 2 or 3): the optimizer's state, the master shard and the
  // reduced gradients' shard on the host, where the optimizer steps; the device keeps
  // its shard of the parameters in the training dtype (stage 2: the gathered copy).
  bool offload = false;
  // With offload, the share of the parameters whose optimizer side is on the host
  // (Megatron-Core's --optimizer-offload-fraction; 0: none); the rest keep their
  // master, state and gradient shards on the device and step there. Taken as a
  // continuous share (dtensor offloads whole FSDP units, the blocks from the first, up
  // to the share).
  double offload_fraction = 1;
  // With offload of every parameter: ZeRO-Offload's one-step delayed update, the host's
  // optimizer step of step k running beside step k + 1's forward and backward (hidden
  // where the cluster overlaps; on a CPU the same cores do both), the host holding one
  // more step's gradient shards meanwhile.
  bool delayed_update = false;
  // FSDP's units (ZeRO 1-3): each block, or with fsdp_layer_units its attention and its
  // MLP each their own and the norms the block's (three collectives where one was).
  // ZeRO-3's gathered working set: `fsdp_prefetch` units gathered ahead of the one
  // computing, and whether a block's gathered parameters are freed after its forward
  // and gathered again for backward (false: kept, every block gathered at backward's
  // start and no second all-gather).
  bool fsdp_layer_units = false;
  int64_t fsdp_prefetch = 1;
  bool reshard_after_forward = true;
  std::string to_string() const;
};

struct PlanEstimate {
  ParallelPlan plan;
  // Bytes per device (the most loaded: the first pipeline stage).
  // param_bytes counts a separate FP32 shard (the master) beside gathered FP32
  // parameters under ZeRO-1/2 in FP32 training; grad_bytes all gradients kept.
  // transient_bytes: what backward adds at its peak (MemorySpec::backward_*).
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, activation_bytes = 0, working_set_bytes = 0,
         transient_bytes = 0;
  // On the host with offload: the master shard, the optimizer state and the gradients.
  double host_bytes = 0;
  // The peak: parameters, optimizer state and gathered working set, plus the larger of
  // backward's start (activations, transient, the gradients alive then) and its end
  // (every gradient).
  double memory_bytes = 0;
  // Seconds per step.
  // compute_seconds includes overhead_seconds, the ops' dispatch on the host.
  // cp_seconds: the ring's key/value passes; ep_seconds: the experts' all-to-alls;
  // offload_seconds: the device-host copies (the host's optimizer step is in
  // optimizer_seconds; with the delayed update, the part the next step does not hide).
  double compute_seconds = 0, overhead_seconds = 0, tp_seconds = 0, cp_seconds = 0, ep_seconds = 0, pp_seconds = 0,
         bubble_seconds = 0, dp_seconds = 0, offload_seconds = 0, optimizer_seconds = 0, step_seconds = 0;
  double model_flops_per_device = 0;     // per second, without recomputation (MFU's numerator)
  double hardware_flops_per_device = 0;  // per second, with it (Megatron's "TFLOP/s per GPU")
  double mfu = 0;
  double tokens_per_second = 0;
  std::string rejected;  // empty when feasible; else why not
  bool fits = true;      // false: rejected for memory alone (the estimate is complete)
  std::string to_string() const;
};

// One configuration's estimate; `rejected` says why it does not fit or is invalid.
PlanEstimate estimate_plan(const ModelSpec& model, const ClusterSpec& cluster, int64_t global_batch,
                           const ParallelPlan& plan);

struct PlanSearchOptions {
  int64_t max_micro_batch = 8;
  int64_t max_virtual_stages = 16;
  bool allow_zero3 = true;
  std::vector<Recompute> recompute{Recompute::None, Recompute::Selective, Recompute::Full};
  // False: configurations that do not fit in memory are ranked too (their `fits` is false).
  bool check_memory = true;
  bool fp32_gradients = false;  // every configuration's (ParallelPlan::fp32_gradients)
  bool loss_parallel = true;    // every configuration's (ParallelPlan::loss_parallel)
  // Every configuration's FSDP options and offload fraction (ParallelPlan's).
  bool fsdp_layer_units = false;
  int64_t fsdp_prefetch = 1;
  bool reshard_after_forward = true;
  double offload_fraction = 1;
  // Fix a degree (0: searched). A fixed pp may leave stages uneven (the heaviest sets
  // the pace); searched ones divide the layers, as Megatron requires. cp is searched up
  // to max_cp; ep over the divisors of dp and of the experts (1 for a dense model).
  int64_t dp = 0, tp = 0, pp = 0, cp = 0, ep = 0;
  int64_t max_cp = 8;
  // Fix the recipe: a ZeRO stage (-1: searched), sequence parallelism and offload (-1:
  // both).
  int zero = -1;
  int sequence_parallel = -1;
  int offload = -1;
  // HSDP's shard group (ParallelPlan::zero_shard): -1 searched over the divisors of
  // the ZeRO group, else fixed (0: the whole group).
  int64_t zero_shard = -1;
};

struct PlanSearch {
  std::vector<PlanEstimate> ranked;    // feasible, fastest first
  std::vector<PlanEstimate> rejected;  // with their reasons
};

// Every (dp, tp, pp, cp, ep, ZeRO stage and its shard group, offload, micro-batch,
// schedule, recompute, sequence parallel) whose degrees divide the devices, heads,
// layers, sequence, experts and batch.
PlanSearch search_plans(const ModelSpec& model, const ClusterSpec& cluster, int64_t global_batch,
                        const PlanSearchOptions& options = {});

// A published training run: its configuration and reported throughput.
struct PublishedRun {
  std::string source;
  ModelSpec model;
  ClusterSpec cluster;
  int64_t global_batch = 0;
  ParallelPlan plan;
  double tflops_per_device = 0;  // as published (hardware FLOPs when `hardware`, else model FLOPs)
  bool hardware = true;
  // What was not published is searched, the rest kept as `plan` has it:
  // `tuned_schedule` (schedule, virtual stages, micro-batch), `tuned_recipe` (ZeRO
  // stage, recomputation, sequence parallelism), `tuned_degrees` (dp, tp, pp). The run
  // is compared with the model's fastest such configuration that fits in memory (the
  // run was tuned; so is its stand-in), or if none fits, the fastest, marked so.
  bool tuned_schedule = false, tuned_recipe = false, tuned_degrees = false;
  bool tuned() const { return tuned_schedule || tuned_recipe || tuned_degrees; }
};
// The estimate a published run is compared with: its plan's, or, where it was tuned,
// the fastest configuration that fits with what was published.
PlanEstimate estimate_published(const PublishedRun& run);
std::vector<PublishedRun> published_runs();

}  // namespace dtensor::parallel
