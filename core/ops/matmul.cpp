// matmul and linear on oneDNN's matmul primitive. Backward passes transposed
// views of the saved operands straight to the kernel: no transposed copies.
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

namespace {

// Plain product without history: out = a x b (+ bias), a/b at least 2-D with
// broadcastable batch dims.
Tensor product(const Tensor& a, const Tensor& b, const Tensor& bias, const char* op) {
  if (a.dim() < 2 || b.dim() < 2)
    throw Error(detail::concat(op, ": operands must have at least 2 dimensions, got ", a.desc(),
                               " and ", b.desc()));
  if (a.dtype() != b.dtype())
    throw Error(detail::concat(op, ": dtype mismatch, ", a.desc(), " vs ", b.desc()));
  const int64_t K = a.shape().back();
  if (b.shape()[size_t(b.dim() - 2)] != K)
    throw Error(detail::concat(op, ": inner dimensions differ, ", a.desc(), " x ", b.desc()));
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2);
  const Shape batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape shape = broadcast_shapes(batch_a, batch_b, op);
  Shape shape_a = shape, shape_b = shape;
  shape_a.insert(shape_a.end(), {a.shape()[size_t(a.dim() - 2)], K});
  shape_b.insert(shape_b.end(), {K, b.shape().back()});
  shape.insert(shape.end(), {a.shape()[size_t(a.dim() - 2)], b.shape().back()});
  NoGradGuard no_grad;
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  launch::matmul(a.device(), a.expand(shape_a), b.expand(shape_b), bias, out);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  kernel_device("matmul", {&a, &b});
  Tensor out = product(a, b, Tensor(), "matmul");
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  SavedTensor saved_a(gb ? a : Tensor(), "matmul"), saved_b(ga ? b : Tensor(), "matmul");
  const Shape sa = a.shape(), sb = b.shape();
  return record("matmul", out, {&a, &b}, [=](const Tensor& g) {
    Tensor grad_a, grad_b;
    if (ga) grad_a = sum_to(product(g, saved_b.get().transpose(-1, -2), Tensor(), "matmul"), sa);
    if (gb) grad_b = sum_to(product(saved_a.get().transpose(-1, -2), g, Tensor(), "matmul"), sb);
    return std::vector<Tensor>{grad_a, grad_b};
  });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  kernel_device("linear", {&x, &weight, &bias});
  if (weight.dim() != 2 || x.dim() < 1 || x.shape().back() != weight.shape()[1])
    throw Error(detail::concat("linear: input ", x.desc(), " does not match weight ", weight.desc(),
                               " (expected input [..., ", weight.shape().back(),
                               "], weight [out, in])"));
  if (x.dtype() != weight.dtype() || (bias.defined() && bias.dtype() != weight.dtype()))
    throw Error(detail::concat("linear: dtype mismatch, input ", x.desc(), ", weight ",
                               weight.desc(), ", bias ", bias.desc()));
  if (bias.defined() && (bias.dim() != 1 || bias.shape()[0] != weight.shape()[0]))
    throw Error(
        detail::concat("linear: bias ", bias.desc(), " does not match weight ", weight.desc()));
  const int64_t in = weight.shape()[1], out_features = weight.shape()[0];
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor x2, out;
  {
    NoGradGuard no_grad;
    x2 = x.reshape({-1, in});
    out = product(x2, weight.transpose(0, 1), bias, "linear").view(out_shape);
  }
  const bool gx = x.requires_grad(), gw = weight.requires_grad();
  const bool gbias = bias.defined() && bias.requires_grad();
  SavedTensor saved_x(gw ? x2 : Tensor(), "linear"), saved_w(gx ? weight : Tensor(), "linear");
  const Shape x_shape = x.shape();
  return record("linear", out, {&x, &weight, &bias}, [=](const Tensor& g) {
    const Tensor g2 = g.reshape({-1, out_features});
    Tensor grad_x, grad_w, grad_b;
    if (gx) grad_x = product(g2, saved_w.get(), Tensor(), "linear").view(x_shape);
    if (gw) grad_w = product(g2.transpose(0, 1), saved_x.get(), Tensor(), "linear");
    if (gbias) grad_b = sum(g2, {0});
    return std::vector<Tensor>{grad_x, grad_w, grad_b};
  });
}

}  // namespace roformer
