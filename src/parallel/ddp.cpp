// DDP buckets, hooks and the overlapped all-reduces.
#include "dtensor/parallel/ddp.h"

#include <algorithm>
#include <map>

#include "dtensor/autograd.h"
#include "dtensor/tensor_ops.h"
#include "dtensor/trace.h"
#include "parallel/flat_layout.h"
#include "util/check.h"

namespace dtensor::parallel {

struct DistributedDataParallel::State {
  struct Bucket {
    std::vector<size_t> params;  // indices into `params`
    size_t ready = 0;
    bool launched = false;
    Tensor buffer;               // packed local gradients in flight
    std::vector<size_t> packed;  // params whose gradients are in `buffer`
    detail::FlatLayout layout;   // where each is in `buffer`
    std::vector<int> dims;       // the mesh dims its gradients are summed over
    const DeviceMesh* mesh = nullptr;  // their sub-mesh (its group runs the all-reduce)
    Work work;
  };
  std::vector<DistTensor> params;
  std::vector<size_t> bucket_of;
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  int dp_dim = 0;
  std::vector<int> reduce_dims;  // dp_dim, then the token dims
  // Per set of reduced dims (a parameter sharded over a token dim, an expert weight
  // over ep, is not summed over it), their sub-mesh.
  std::map<std::vector<int>, DeviceMesh> reduce_meshes;
  size_t outstanding = 0;  // gradients not yet ready in this backward
};

DistributedDataParallel::DistributedDataParallel(nn::Module& module, DDPOptions options)
    : module_(module), options_(std::move(options)), state_(std::make_shared<State>()) {
  state_->params = module_.parameters();
  DT_CHECK_ARG(!state_->params.empty(), "DistributedDataParallel", "the module has no parameters");
  const DeviceMesh& mesh = state_->params[0].mesh();
  state_->dp_dim = options_.dp_dim.empty() ? 0 : mesh.dim_index(options_.dp_dim);
  state_->reduce_dims = {state_->dp_dim};
  std::vector<std::string> reduce_names{mesh.names()[static_cast<size_t>(state_->dp_dim)]};
  for (const std::string& name : options_.token_dims) {
    const int d = mesh.dim_index(name);
    DT_CHECK_ARG(std::find(state_->reduce_dims.begin(), state_->reduce_dims.end(), d) == state_->reduce_dims.end(),
                 "DistributedDataParallel", "token dim '", name, "' is named twice or is the data-parallel dim");
    state_->reduce_dims.push_back(d);
    reduce_names.push_back(name);
  }
  // Refused orders: a second DDP, and DDP over the dim a fully_shard already
  // synchronises (its gradients come out sharded there; DDP would do nothing).
  const std::string dp_name = mesh.names()[static_cast<size_t>(state_->dp_dim)];
  auto refuse = [&](const nn::Module& m) {
    for (const std::string& w : m.parallel_wrappers()) {
      const std::string path = m.path();
      const bool fsdp_here = w == "fully_shard over " + dp_name;
      DT_CHECK_ARG(w.rfind("DistributedDataParallel", 0) != 0 && !fsdp_here, "DistributedDataParallel",
                   path.empty() ? std::string("the root module") : "module '" + path + "'", " is already wrapped by ",
                   w,
                   fsdp_here ? "; FSDP synchronises its gradients over that dim already: use DDP over another "
                               "mesh dim (dp_dim), or no DDP"
                             : "; one DistributedDataParallel per model");
    }
  };
  for (const nn::Module* m = &module_; m; m = m->parent()) refuse(*m);
  for (auto& [name, m] : module_.named_modules()) refuse(*m);
  for (const DistTensor& p : state_->params) {
    DT_CHECK_ARG(p.mesh() == mesh, "DistributedDataParallel", "parameters live on different meshes");
    DT_CHECK_ARG(!p.placements()[state_->dp_dim].is_partial(), "DistributedDataParallel",
                 "expected parameters replicated or sharded over the data-parallel dim, got ",
                 placements_to_string(p.placements()));
    for (size_t i = 1; i < state_->reduce_dims.size(); ++i) {
      DT_CHECK_ARG(!p.placements()[state_->reduce_dims[i]].is_partial(), "DistributedDataParallel",
                   "expected parameters replicated or sharded over token dim '", options_.token_dims[i - 1], "', got ",
                   placements_to_string(p.placements()));
    }
  }
  // The dims each parameter's gradient is summed over: dp and the token dims it is
  // not sharded on. Sub-meshes built in parameter order, the same on every rank.
  std::vector<std::vector<int>> dims_of(state_->params.size());
  for (size_t k = 0; k < state_->params.size(); ++k) {
    // dp always (only gradients Partial there are reduced at all).
    for (int d : state_->reduce_dims) {
      if (d == state_->dp_dim || !state_->params[k].placements()[d].is_shard()) dims_of[k].push_back(d);
    }
    if (state_->reduce_meshes.count(dims_of[k])) continue;
    std::vector<std::string> names;
    for (int d : dims_of[k]) names.push_back(mesh.names()[static_cast<size_t>(d)]);
    state_->reduce_meshes.emplace(dims_of[k], names.size() == 1 ? mesh[names[0]] : mesh.slice(names));
  }
  // Buckets in reverse registration order: backward produces the last layers'
  // gradients first.
  const double cap = options_.bucket_cap_mb * 1024 * 1024;
  state_->bucket_of.resize(state_->params.size());
  double filled = cap;
  for (size_t k = state_->params.size(); k-- > 0;) {
    const double bytes = static_cast<double>(state_->params[k].to_local().nbytes());
    const bool other_dims = !state_->buckets.empty() && state_->buckets.back().dims != dims_of[k];
    if ((filled + bytes > cap || other_dims) && !(state_->buckets.size() && state_->buckets.back().params.empty())) {
      state_->buckets.emplace_back();
      filled = 0;
    }
    State::Bucket& bucket = state_->buckets.back();
    bucket.dims = dims_of[k];
    const auto found = state_->reduce_meshes.find(dims_of[k]);  // built above
    bucket.mesh = &found->second;
    state_->buckets.back().params.push_back(k);
    state_->bucket_of[k] = state_->buckets.size() - 1;
    filled += bytes;
  }
  stats_.buckets = static_cast<int64_t>(state_->buckets.size());
  module_.add_parallel_wrapper("DistributedDataParallel over " + mesh.names()[static_cast<size_t>(state_->dp_dim)]);
  state_->ready.assign(state_->params.size(), false);
  state_->outstanding = state_->params.size();
  std::weak_ptr<State> weak = state_;
  for (size_t k = 0; k < state_->params.size(); ++k) {
    register_grad_ready_hook(state_->params[k], [this, weak, k](const DistTensor&) {
      if (weak.lock()) on_gradient_ready(k);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  // Hooks hold a weak reference and do nothing once the state is gone.
  state_.reset();
}

int64_t DistributedDataParallel::num_buckets() const { return static_cast<int64_t>(state_->buckets.size()); }

void DistributedDataParallel::on_gradient_ready(size_t k) {
  if (!sync_ || state_->ready[k]) return;
  state_->ready[k] = true;
  --state_->outstanding;
  State::Bucket& bucket = state_->buckets[state_->bucket_of[k]];
  if (++bucket.ready == bucket.params.size()) launch(state_->bucket_of[k]);
}

void DistributedDataParallel::launch(size_t b) {
  State::Bucket& bucket = state_->buckets[b];
  bucket.launched = true;
  const int dp = state_->dp_dim;
  // Only Partial gradients need the reduction; a Replicate one is already whole.
  bucket.packed.clear();
  std::vector<Shape> shapes;
  std::vector<Tensor> grads;
  for (size_t k : bucket.params) {
    DistTensor g = state_->params[k].grad();
    if (!g.defined() || !g.placements()[dp].is_partial()) continue;
    // Whole over a token dim: Partial there with the value on the first coordinate
    // (local, no communication), so that one sum over every reduced dim is right.
    Placements partial = g.placements();
    for (int d : bucket.dims) {
      if (partial[d].is_replicate()) partial[d] = Partial();
    }
    if (partial != g.placements()) g = g.redistribute(partial);
    bucket.packed.push_back(k);
    grads.push_back(g.to_local());
    shapes.push_back(grads.back().shape());
  }
  if (bucket.packed.empty()) return;
  // The gradients one after another: FSDP's flat layout on one rank.
  bucket.layout = detail::FlatLayout(shapes, 1, 0);
  bucket.buffer = Tensor::empty({bucket.layout.unsharded_numel()}, grads[0].dtype(), grads[0].device());
  for (size_t i = 0; i < bucket.packed.size(); ++i) {
    bucket.layout.pack(i, grads[i], bucket.buffer, /*accumulate=*/false);
  }
  TraceSpan span("ddp_all_reduce_launch", "comm");
  const Group& group = bucket.mesh->group();
  bucket.work = all_reduce_async(group, bucket.buffer, bucket.buffer, ReduceOp::Sum);
  ++stats_.all_reduces;
  if (state_->outstanding > 0) ++stats_.launched_during_backward;
}

void DistributedDataParallel::wait_for_gradients() {
  for (const DistTensor& p : state_->params) {
    const std::string& note = replaced_note(p);
    DT_CHECK_ARG(note.empty(), "DistributedDataParallel", note,
                 " after DDP took the module's parameters; change parameters (parallelize_module, fully_shard, "
                 "Module::to) before wrapping the module in DDP");
  }
  const DeviceMesh& mesh = state_->params[0].mesh();
  for (size_t b = 0; b < state_->buckets.size(); ++b) {
    State::Bucket& bucket = state_->buckets[b];
    // Gradients that never arrived (unused parameters) are the same on every rank,
    // so every rank launches the same late buckets in the same order.
    if (!bucket.launched) launch(b);
    if (bucket.packed.empty()) continue;
    const double scale = options_.average_gradients ? 1.0 / static_cast<double>(bucket.mesh->size()) : 1.0;
    TraceSpan span("ddp_all_reduce_wait", "comm");
    bucket.work.wait();
    for (size_t i = 0; i < bucket.packed.size(); ++i) {
      const DistTensor& p = state_->params[bucket.packed[i]];
      const DistTensor g = p.grad();
      Tensor reduced = bucket.layout.unsharded_view(bucket.buffer, i).clone();
      if (scale != 1.0) reduced = mul(reduced, scale);
      Placements placements = g.placements();
      for (int d : bucket.dims) placements[d] = Replicate();
      p.set_grad(DistTensor::from_local(reduced, mesh, placements, g.shape()));
    }
  }
  for (State::Bucket& bucket : state_->buckets) {
    bucket.ready = 0;
    bucket.launched = false;
    bucket.buffer = Tensor();
    bucket.packed.clear();
    bucket.layout = detail::FlatLayout();
    bucket.work = Work();
  }
  state_->ready.assign(state_->params.size(), false);
  state_->outstanding = state_->params.size();
}

}  // namespace dtensor::parallel
