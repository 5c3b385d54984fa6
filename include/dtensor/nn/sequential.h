// nn::Sequential: named children run in order, each one's output the next one's input
// (torch.nn.Sequential with names). The container a pipeline splits into stages
// (parallel/pipeline_split.h): a stage is a slice of it, whose parameters keep the
// names they have in the whole model.
//
//   auto model = std::make_shared<nn::Sequential>();
//   model->append("input", std::make_shared<nn::Linear>(mesh, 6, 8, true, seed));
//   for (int i = 0; i < 4; ++i) model->append("blocks." + std::to_string(i), make_block(mesh, i));
//   model->append("output", std::make_shared<nn::Linear>(mesh, 8, 3, true, seed + 1));
//   DistTensor y = (*model)(x);   // named_parameters(): "input.weight", "blocks.0.fc1.weight", ...
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/nn/module.h"

namespace dtensor::nn {

class Sequential : public Module {
 public:
  using Entry = std::pair<std::string, std::shared_ptr<Module>>;

  Sequential() = default;
  // Appends `module` under `name` (dotted names such as "blocks.0" allowed; names are
  // unique) and returns it. A checkpointed child runs through nn::checkpoint: its
  // activations are recomputed in backward instead of kept.
  template <class M>
  std::shared_ptr<M> append(const std::string& name, std::shared_ptr<M> module, bool checkpointed = false) {
    check_new_name(name);
    entries_.emplace_back(name, module);
    checkpointed_.push_back(checkpointed);
    return register_module(name, std::move(module));
  }

  // Registers `module` under `name` as a child that forward does not run: a module
  // that a child uses too, such as the embedding a tied head multiplies by, in a
  // pipeline stage that holds the head but not the embedding's own entry. Registered
  // before that child, its parameters are listed under `name` (the name they have in
  // the whole model). Not an entry: entries(), slice() and index_of() skip it.
  template <class M>
  std::shared_ptr<M> share(const std::string& name, std::shared_ptr<M> module) {
    check_new_name(name);
    shared_.push_back(name);
    return register_module(name, std::move(module));
  }

  // The children in order; an empty Sequential returns its input.
  DistTensor forward(const DistTensor& x) override;

  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool checkpointed(size_t index) const { return checkpointed_.at(index); }
  // The position of the child named `name`; std::invalid_argument listing the names
  // when there is none.
  size_t index_of(const std::string& name) const;
  // Children [begin, end) in a new Sequential that shares them (the same modules, so
  // the same parameters under the same names, checkpointed as here).
  std::shared_ptr<Sequential> slice(size_t begin, size_t end) const;

 private:
  void check_new_name(const std::string& name) const;
  std::vector<Entry> entries_;
  std::vector<bool> checkpointed_;
  std::vector<std::string> shared_;  // names of the children share() registered
};

}  // namespace dtensor::nn
