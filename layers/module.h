// Module: a node of the model tree holding named parameters, buffers and
// child modules. Full names are the dotted path from the root
// ("roformer.encoder.layer.0.attention.self.query.weight"), so the model's
// names are Hugging Face's and checkpoints move both ways without a table of
// renames.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/flat_parameters.h"
#include "core/tensor.h"

namespace roformer {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};
// Parameters then buffers, in registration order (which is also the order
// initialisation draws random numbers in).
using StateDict = std::vector<NamedTensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Children are registered by address: a module stays where it was built.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  // Parameters (tensors that require grad) of this module and its children.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // Buffers: state that is saved but not trained.
  std::vector<NamedTensor> named_buffers() const;
  int64_t num_parameters() const;  // total elements
  // The parameter or buffer with this full name; throws naming it if absent.
  Tensor find(const std::string& name) const;

  // Copies of nothing: the returned tensors share storage with the module.
  StateDict state_dict() const;
  // Copies `state` into the module's tensors (converting floating dtypes).
  // Checks every name and shape first and throws one InputError listing every
  // missing, unexpected and mis-shaped entry; nothing is copied then. With
  // strict = false, missing and unexpected names are allowed (shape
  // mismatches never are).
  void load_state_dict(const StateDict& state, bool strict = true);

  // Training mode (dropout on) for this module and its children.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Drops the accumulated gradient of every parameter (one fill of the flat
  // gradient buffer once flattened).
  void zero_grad();

  // Moves every parameter of the tree into one contiguous f32 buffer, with a
  // persistent gradient buffer of the same layout (core/flat_parameters.h), in
  // named_parameters() order; a tied weight is one parameter. Names, order,
  // values and the handles layers hold are unchanged. Call it once the tree
  // is built (the models do, at the end of their constructors); calling it
  // again returns the same set.
  FlatParameters& flatten_parameters();
  // The flat set made by flatten_parameters() on this module, or null.
  const std::shared_ptr<FlatParameters>& flat_parameters() const { return flat_; }

  // Moves parameters, their gradients and buffers to `device`; every handle
  // follows. Throws Tensor::to's error (e.g. a device this build lacks),
  // leaving the module where it was.
  void to(Device device);

  // Re-initialises this module and its children in registration order,
  // drawing from `gen` (BERT's scheme: normal(0, initializer_range) weights,
  // zero biases, LayerNorm 1 / 0).
  void reset_parameters(Generator& gen);

 protected:
  // Registers a leaf tensor under `name` (no dots); parameters are marked
  // requires_grad. Returns the same handle.
  Tensor register_parameter(const std::string& name, Tensor value);
  Tensor register_buffer(const std::string& name, Tensor value);
  // Registers a child whose lifetime is at least this module's.
  template <class M>
  M& register_module(const std::string& name, M& child) {
    add_child(name, &child);
    return child;
  }
  // Initialises this module's own tensors (children are visited by
  // reset_parameters). Default: nothing.
  virtual void init_own(Generator& gen);

 private:
  void add_child(const std::string& name, Module* child);
  void check_name(const std::string& name) const;
  template <class Fn>
  void visit(const std::string& prefix, Fn&& fn) const;

  std::vector<NamedTensor> params_, buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::shared_ptr<FlatParameters> flat_;
  bool training_ = true;
};

}  // namespace roformer
