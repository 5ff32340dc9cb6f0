#include "core/autograd.h"

#include <atomic>
#include <unordered_map>

#include "core/ops.h"
#include "core/profile.h"

namespace roformer {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<bool> g_accumulate_in_backward{true};

// The node for a recorded op: the backward closure and what it captured.
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : Node(name), fn_(std::move(fn)) {}
  FunctionNode(const char* name, AccumulatingBackwardFn fn)
      : Node(name), accumulating_fn_(std::move(fn)) {}
  std::vector<Tensor> backward(const Tensor& grad_output,
                               const std::vector<Tensor>& partial) override {
    return accumulating_fn_ ? accumulating_fn_(grad_output, partial) : fn_(grad_output);
  }
  bool takes_partial() const override { return bool(accumulating_fn_); }
  void release() override {
    fn_ = nullptr;
    accumulating_fn_ = nullptr;
  }

 private:
  BackwardFn fn_;
  AccumulatingBackwardFn accumulating_fn_;
};

// The gradient collected so far for each input of `node` that its backward
// may add into (AccumulatingBackwardFn's contract), or none at all.
std::vector<Tensor> offered_partials(Node& node, const std::unordered_map<Node*, Tensor>& grads) {
  if (!node.takes_partial()) return {};
  const std::vector<Edge>& edges = node.edges();
  std::vector<Tensor> partial(edges.size());  // one per edge, undefined where none is offered
  if (!g_accumulate_in_backward.load()) return partial;
  for (size_t i = 0; i < edges.size(); ++i) {
    Node* input = edges[i].node.get();
    if (!input) continue;
    size_t uses = 0;
    for (const Edge& e : edges) uses += e.node.get() == input;
    auto it = grads.find(input);
    if (uses != 1 || it == grads.end() || !it->second.defined()) continue;
    const Tensor& sum = it->second;
    // Nothing else may see the write: add passes one gradient to both its
    // inputs, and a view or a saved copy shares the storage.
    const bool exclusive = sum.impl_ptr().use_count() == 1 && sum.impl().storage.use_count() == 1 &&
                           sum.is_contiguous();
    if (exclusive) partial[i] = sum;
  }
  return partial;
}

// dst += src for same-shaped tensors of one dtype and device (dst contiguous).
void add_in_place(Tensor& dst, const Tensor& src) {
  if (dst.device().is_cpu() && src.device().is_cpu() && dst.dtype() == DType::f32 &&
      src.dtype() == DType::f32 && src.is_contiguous()) {
    float* d = dst.data_as<float>();
    const float* s = src.data_as<float>();
    const int64_t n = dst.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    dst.bump_version();
    return;
  }
  dst.copy_(add(dst, src));
}

// Adds a gradient into a leaf's .grad.
void accumulate_into_leaf(TensorImpl& leaf, const Tensor& g) {
  Tensor grad = g;
  if (grad.dtype() != leaf.dtype) grad = grad.to(leaf.dtype);
  if (grad.shape() != leaf.shape)
    throw Error(detail::concat("autograd: gradient ", grad.desc(), " does not match leaf ",
                               dtype_name(leaf.dtype), shape_str(leaf.shape)));
  if (leaf.grad_slot && leaf.grad_slot->buffer.defined()) {
    // Persistent buffer (flat parameters): accumulate in place, no allocation.
    Tensor buffer = leaf.grad_slot->buffer;
    if (!leaf.grad) {
      buffer.copy_(grad);
      leaf.grad = buffer.impl_ptr();
    } else {
      add_in_place(buffer, grad);
    }
    return;
  }
  if (!leaf.grad) {
    // Keep the tensor only if nothing else can see it: add passes one gradient
    // to both inputs, and a root gradient is the caller's. .grad is written in
    // place later (clipping, zeroing), so shared storage would leak across.
    const bool exclusive = grad.is_contiguous() && grad.impl().storage.use_count() == 1 &&
                           grad.impl_ptr().use_count() <= 2;  // `g`'s owner and `grad`
    leaf.grad = (exclusive ? grad : grad.clone()).impl_ptr();
  } else {
    leaf.grad = add(Tensor(leaf.grad), grad).impl_ptr();
  }
}

bool has_ready_hook(const TensorImpl& leaf) {
  return leaf.grad_slot && leaf.grad_slot->ready_hook;
}

void fire_ready_hook(const TensorImpl& leaf) {
  const std::function<void()> hook = leaf.grad_slot->ready_hook;  // may replace itself
  if (hook) hook();
}
}  // namespace

Node::~Node() {
  // A chain of N nodes would otherwise be freed by N nested destructor calls
  // and overflow the stack: detach the inputs this node solely owns and free
  // them one at a time, each after its own sole-owned inputs were detached.
  std::vector<std::shared_ptr<Node>> orphans;
  auto detach_inputs = [&orphans](Node& n) {
    for (Edge& e : n.edges_)
      if (e.node && e.node.use_count() == 1) orphans.push_back(std::move(e.node));
  };
  detach_inputs(*this);
  while (!orphans.empty()) {
    std::shared_ptr<Node> n = std::move(orphans.back());
    orphans.pop_back();
    detach_inputs(*n);
  }
}

const Tensor& SavedTensor::get() const {
  if (tensor_.defined() && tensor_.version() != version_)
    throw Error(
        detail::concat("autograd: a tensor saved for the backward of '", op_, "' (", tensor_.desc(),
                       ") was modified in place after it was saved (version ", tensor_.version(),
                       ", expected ", version_, "); clone it before modifying it"));
  return tensor_;
}

void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook) {
  if (!leaf.is_leaf())
    throw Error("set_grad_ready_hook: " + leaf.desc() + " is not a leaf (it has history)");
  TensorImpl& impl = leaf.impl();
  if (!impl.grad_slot) impl.grad_slot = std::make_shared<GradSlot>();
  impl.grad_slot->ready_hook = std::move(hook);
}

bool grad_enabled() {
  return t_grad_enabled;
}

NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) {
  t_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  t_grad_enabled = previous_;
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  return needs_grad(std::vector<const Tensor*>(inputs));
}

bool needs_grad(const std::vector<const Tensor*>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

Tensor record(const char* op, Tensor output, std::initializer_list<const Tensor*> inputs,
              BackwardFn fn) {
  return record(op, std::move(output), std::vector<const Tensor*>(inputs), std::move(fn));
}

void set_accumulate_in_backward(bool on) {
  g_accumulate_in_backward.store(on);
}

bool accumulate_in_backward() {
  return g_accumulate_in_backward.load();
}

namespace {
Tensor attach(std::shared_ptr<Node> node, Tensor output, const std::vector<const Tensor*>& inputs) {
  for (const Tensor* t : inputs) {
    Edge edge;
    if (t && t->defined() && t->requires_grad()) {
      if (t->grad_fn()) {
        edge.node = t->grad_fn();
      } else {
        edge.leaf = t->impl_ptr();
      }
    }
    node->edges().push_back(std::move(edge));
  }
  output.impl().requires_grad = true;
  output.impl().grad_fn = std::move(node);
  return output;
}
}  // namespace

Tensor record(const char* op, Tensor output, const std::vector<const Tensor*>& inputs,
              BackwardFn fn) {
  if (!needs_grad(inputs)) return output;
  return attach(std::make_shared<FunctionNode>(op, std::move(fn)), std::move(output), inputs);
}

Tensor record_accumulating(const char* op, Tensor output,
                           std::initializer_list<const Tensor*> inputs, AccumulatingBackwardFn fn) {
  return record_accumulating(op, std::move(output), std::vector<const Tensor*>(inputs),
                             std::move(fn));
}

Tensor record_accumulating(const char* op, Tensor output, const std::vector<const Tensor*>& inputs,
                           AccumulatingBackwardFn fn) {
  if (!needs_grad(inputs)) return output;
  return attach(std::make_shared<FunctionNode>(op, std::move(fn)), std::move(output), inputs);
}

void run_backward(const Tensor& root, const Tensor& grad_root, bool retain_graph) {
  if (!root.requires_grad())
    throw Error("backward: " + root.desc() + " does not require grad and has no history");
  NoGradGuard no_grad;  // gradients themselves are not differentiated
  if (!root.grad_fn()) {
    accumulate_into_leaf(root.impl(), grad_root);
    if (has_ready_hook(root.impl())) fire_ready_hook(root.impl());
    return;
  }
  // Count, for every node reachable from the root, how many edges lead into
  // it; a node runs once all of its consumers have passed their gradient.
  // Leaves with a ready hook are counted the same way: the hook fires when
  // the last edge into the leaf has been processed (a weight used twice, as
  // the tied embedding is, has two).
  std::unordered_map<Node*, int> pending;
  std::unordered_map<TensorImpl*, int> leaf_pending;
  std::vector<Node*> stack{root.grad_fn().get()};
  pending[root.grad_fn().get()] = 0;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->edges()) {
      if (e.leaf && has_ready_hook(*e.leaf)) ++leaf_pending[e.leaf.get()];
      if (!e.node) continue;
      auto [it, inserted] = pending.try_emplace(e.node.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.node.get());
    }
  }
  std::unordered_map<Node*, Tensor> grads;
  grads[root.grad_fn().get()] = grad_root;
  std::vector<Node*> ready{root.grad_fn().get()};
  while (!ready.empty()) {
    Node* node = ready.back();
    ready.pop_back();
    if (node->released() && grads.count(node) && grads[node].defined())
      throw Error(detail::concat("backward: the graph through '", node->name(),
                                 "' was already freed by an earlier backward; pass "
                                 "retain_graph=true to the first call to go through it twice"));
    Tensor g = std::move(grads[node]);
    grads.erase(node);
    // A node no gradient reached still releases its inputs' pending counts.
    std::vector<Tensor> input_grads(node->edges().size());
    std::vector<Tensor> partial;
    if (g.defined()) {
      partial = offered_partials(*node, grads);
      ProfileScope profile(node->name().c_str(), /*backward=*/true);  // ROFORMER_PROFILE=1
      input_grads = node->backward(g, partial);
    }
    if (input_grads.size() != node->edges().size())
      throw Error(detail::concat("autograd: '", node->name(), "' returned ", input_grads.size(),
                                 " gradients for ", node->edges().size(), " inputs"));
    for (size_t i = 0; i < input_grads.size(); ++i) {
      const Edge& e = node->edges()[i];
      if (e.leaf) {
        if (input_grads[i].defined()) accumulate_into_leaf(*e.leaf, input_grads[i]);
        auto it = leaf_pending.find(e.leaf.get());
        if (it != leaf_pending.end() && --it->second == 0) fire_ready_hook(*e.leaf);
      }
      if (!e.node) continue;
      const bool added_in_place = i < partial.size() && partial[i].defined() &&
                                  input_grads[i].impl_ptr() == partial[i].impl_ptr();
      if (input_grads[i].defined() && !added_in_place) {
        auto it = grads.find(e.node.get());
        if (it == grads.end() || !it->second.defined()) {
          grads[e.node.get()] = input_grads[i];
        } else {
          it->second = add(it->second, input_grads[i]);
        }
      }
      if (--pending[e.node.get()] == 0) ready.push_back(e.node.get());
    }
    if (!retain_graph) {
      node->release();
      node->mark_released();
    }
  }
}

}  // namespace roformer
