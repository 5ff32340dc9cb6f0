#include "layers/module.h"

#include <unordered_map>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"

namespace roformer {

void Module::check_name(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error("Module: a member name must be non-empty and without dots, got '" + name + "'");
  for (const auto& p : params_)
    if (p.name == name) throw Error("Module: '" + name + "' registered twice");
  for (const auto& b : buffers_)
    if (b.name == name) throw Error("Module: '" + name + "' registered twice");
  for (const auto& c : children_)
    if (c.first == name) throw Error("Module: '" + name + "' registered twice");
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_name(name);
  if (!value.defined()) throw Error("Module: parameter '" + name + "' is undefined");
  value.set_requires_grad(true);
  params_.push_back({name, value});
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_name(name);
  if (!value.defined()) throw Error("Module: buffer '" + name + "' is undefined");
  buffers_.push_back({name, value});
  return value;
}

void Module::add_child(const std::string& name, Module* child) {
  check_name(name);
  children_.emplace_back(name, child);
}

template <class Fn>
void Module::visit(const std::string& prefix, Fn&& fn) const {
  fn(prefix, *this);
  for (const auto& [name, child] : children_) child->visit(prefix + name + ".", fn);
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out;
  visit("", [&](const std::string& prefix, const Module& m) {
    for (const auto& p : m.params_) out.push_back({prefix + p.name, p.tensor});
  });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

std::vector<NamedTensor> Module::named_buffers() const {
  std::vector<NamedTensor> out;
  visit("", [&](const std::string& prefix, const Module& m) {
    for (const auto& b : m.buffers_) out.push_back({prefix + b.name, b.tensor});
  });
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.tensor.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict out = named_parameters();
  for (auto& b : named_buffers()) out.push_back(std::move(b));
  return out;
}

Tensor Module::find(const std::string& name) const {
  for (const auto& e : state_dict())
    if (e.name == name) return e.tensor;
  throw Error("Module: no parameter or buffer named '" + name + "'");
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict own = state_dict();
  std::unordered_map<std::string, const Tensor*> given;
  std::vector<std::string> problems, unexpected;
  for (const auto& e : state) {
    if (!given.emplace(e.name, &e.tensor).second)
      problems.push_back("duplicate entry '" + e.name + "'");
  }
  std::unordered_set<std::string> own_names;
  std::vector<std::string> missing;
  for (const auto& e : own) {
    own_names.insert(e.name);
    auto it = given.find(e.name);
    if (it == given.end()) {
      missing.push_back(e.name);
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined()) {
      problems.push_back("'" + e.name + "' is undefined");
    } else if (src.shape() != e.tensor.shape()) {
      problems.push_back("'" + e.name + "' has shape " + shape_str(src.shape()) +
                         ", the model expects " + shape_str(e.tensor.shape()));
    } else if (is_floating(src.dtype()) != is_floating(e.tensor.dtype())) {
      problems.push_back("'" + e.name + "' is " + src.desc() + ", the model expects " +
                         e.tensor.desc());
    }
  }
  for (const auto& e : state)
    if (!own_names.count(e.name)) unexpected.push_back(e.name);
  std::string message;
  auto list = [&](const char* what, const std::vector<std::string>& items) {
    if (items.empty()) return;
    message += detail::concat("\n  ", items.size(), " ", what, ":");
    for (const auto& s : items) message += "\n    " + s;
  };
  if (strict) {
    list("missing", missing);
    list("unexpected", unexpected);
  }
  list("mismatched", problems);
  if (!message.empty())
    throw InputError("load_state_dict: the state does not fit the model" + message);

  NoGradGuard no_grad;
  for (const auto& e : own) {
    auto it = given.find(e.name);
    if (it == given.end()) continue;
    Tensor dst = e.tensor;
    dst.copy_(*it->second);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& child : children_) child.second->train(on);
}

void Module::zero_grad() {
  if (flat_) {
    flat_->zero_grad();
    return;
  }
  for (const auto& p : named_parameters()) p.tensor.zero_grad();
}

FlatParameters& Module::flatten_parameters() {
  if (!flat_) flat_ = FlatParameters::create(parameters());
  return *flat_;
}

void Module::to(Device device) {
  // Copy everything first, so a failure leaves the module as it was; then
  // point each tensor's implementation at its copy (every handle follows).
  std::vector<std::pair<Tensor, Tensor>> moves;
  auto plan = [&](const Tensor& t) {
    if (t.defined() && t.device() != device) moves.emplace_back(t, t.to(device));
  };
  if (!flat_)
    for (const Tensor& p : parameters()) {
      plan(p);
      plan(p.grad());
    }
  for (const NamedTensor& b : named_buffers()) plan(b.tensor);
  if (flat_) flat_->to(device);
  for (auto& [from, to] : moves) {
    TensorImpl& impl = from.impl();
    impl.storage = to.impl().storage;
    impl.offset = to.offset();
    impl.strides = to.strides();
  }
}

void Module::init_own(Generator&) {}

void Module::reset_parameters(Generator& gen) {
  init_own(gen);
  for (const auto& child : children_) child.second->reset_parameters(gen);
}

}  // namespace roformer
