// Define-by-run reverse-mode autograd. A differentiable op that runs while
// grad mode is on and sees an input that requires grad records one Node: the
// function that maps the output's gradient to its inputs' gradients, holding
// only what that needs. backward() walks the nodes in reverse topological
// order without recursion.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace roformer {

// Where a node sends each input's gradient: another node, or a leaf tensor
// that accumulates it in .grad, or nowhere (input needs no gradient).
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<TensorImpl> leaf;
  bool active() const { return node || leaf; }
};

class FlatParameters;

// What a leaf can carry beyond .grad (TensorImpl::grad_slot):
// - `buffer`: persistent gradient memory of the leaf's shape (a view into a
//   flat gradient buffer). Backward copies the first contribution after a
//   zero_grad into it and adds later ones in place; .grad then points at it.
//   Invariant: the buffer is all zeros while .grad is undefined.
// - `ready_hook`: run once per backward pass, right after the leaf's last
//   gradient contribution of that pass was accumulated (every edge into the
//   leaf from the graph being run has been processed), so a data-parallel
//   reduction can start on it while the rest of backward runs. A leaf the
//   graph does not reach gets no call.
struct GradSlot {
  Tensor buffer;
  std::function<void()> ready_hook;
  std::weak_ptr<FlatParameters> owner;  // the flat set the leaf lives in, if any
  size_t index = 0;                     // its position there
};

// Sets (or, with an empty function, removes) the leaf's gradient-ready hook.
void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook);

class Node {
 public:
  explicit Node(std::string name) : name_(std::move(name)) {}
  // Frees the nodes only this one owns without recursion (deep graphs).
  virtual ~Node();
  // Gradients for each input edge given the output's gradient; an undefined
  // tensor means "no gradient". `partial` (one per edge, or empty) holds the
  // gradients already collected for inputs a backward may add into in place
  // (see AccumulatingBackwardFn); only nodes whose takes_partial() is true get any.
  virtual std::vector<Tensor> backward(const Tensor& grad_output,
                                       const std::vector<Tensor>& partial) = 0;
  virtual bool takes_partial() const { return false; }
  // Frees what was saved for backward (after a backward without retain_graph).
  virtual void release() = 0;
  const std::string& name() const { return name_; }
  std::vector<Edge>& edges() { return edges_; }
  bool released() const { return released_; }
  void mark_released() { released_ = true; }

 private:
  std::string name_;
  std::vector<Edge> edges_;
  bool released_ = false;
};

// A tensor kept for backward, with the version it had when saved: using it
// after an in-place write is an error rather than a wrong gradient.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op)
      : tensor_(t.defined() ? t.detach() : Tensor()),
        version_(t.defined() ? t.version() : 0),
        op_(op) {}
  const Tensor& get() const;

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
  const char* op_ = "";
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

// A backward that can add an input's gradient into the sum already collected
// for that input, rather than return a new tensor for the engine to add in a
// pass of its own (a product does it with no extra pass: GEMM beta = 1).
// `partial` has one entry per input; partial[i] is defined only where the
// engine offers one: the input has
// history, earlier consumers' gradients for it were summed into a contiguous
// tensor nothing but the engine holds, and the input is this node's input
// once. A backward that adds its gradient for input i into partial[i]
// returns partial[i] itself there; the engine then adds nothing. Any other
// tensor it returns is added as usual.
using AccumulatingBackwardFn = std::function<std::vector<Tensor>(
    const Tensor& grad_output, const std::vector<Tensor>& partial)>;

// Whether backward offers partial sums to AccumulatingBackwardFn nodes (on
// by default; off, every gradient is added by the engine: the A/B of
// benchmarks and tests).
void set_accumulate_in_backward(bool on);
bool accumulate_in_backward();

// Is grad mode on for this thread?
bool grad_enabled();

// Turns grad mode off for its scope (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when recording `op` on these inputs would be needed.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<const Tensor*>& inputs);

// Attaches a node computing input gradients with `fn` to `output` if any
// input requires grad (and grad mode is on). `fn` returns one gradient per
// input, in order; it is destroyed (freeing what it captured) after backward.
Tensor record(const char* op, Tensor output, std::initializer_list<const Tensor*> inputs,
              BackwardFn fn);
Tensor record(const char* op, Tensor output, const std::vector<const Tensor*>& inputs,
              BackwardFn fn);
// The same for a backward that may add into its inputs' partial sums.
Tensor record_accumulating(const char* op, Tensor output,
                           std::initializer_list<const Tensor*> inputs, AccumulatingBackwardFn fn);
Tensor record_accumulating(const char* op, Tensor output, const std::vector<const Tensor*>& inputs,
                           AccumulatingBackwardFn fn);

// Runs reverse mode from `root` with `grad_root` as its gradient.
void run_backward(const Tensor& root, const Tensor& grad_root, bool retain_graph);

}  // namespace roformer
