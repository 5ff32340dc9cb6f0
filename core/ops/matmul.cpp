// matmul and linear on oneDNN's matmul primitive. Backward passes transposed
// views of the saved operands straight to the kernel: no transposed copies.
// Under a bf16 MatmulPrecisionScope (core/precision.h) f32 operands are cast
// to bf16 (weights through the per-step cache), the products accumulate in
// f32 and write f32; the bf16 casts are what backward keeps.
#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"

namespace roformer {

namespace {

// Plain product without history: out = a x b (+ bias), a/b at least 2-D with
// broadcastable batch dims; out_dtype f32 with bf16 operands is the mixed
// precision case (f32 accumulation and result).
Tensor product(const Tensor& a, const Tensor& b, const Tensor& bias, const char* op,
               DType out_dtype) {
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
  Tensor out = Tensor::empty(shape, out_dtype, a.device());
  launch::matmul(a.device(), a.expand(shape_a), b.expand(shape_b), bias, out);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  kernel_device("matmul", {&a, &b});
  const bool low = a.dtype() == b.dtype() && autocast_bf16(a.device(), a.dtype());
  const Tensor ea = low ? to_bf16(a) : a, eb = low ? to_bf16(b) : b;
  const DType dt = a.dtype();
  Tensor out = product(ea, eb, Tensor(), "matmul", dt);
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  SavedTensor saved_a(gb ? ea : Tensor(), "matmul"), saved_b(ga ? eb : Tensor(), "matmul");
  const Shape sa = a.shape(), sb = b.shape();
  return record("matmul", out, {&a, &b}, [=](const Tensor& g) {
    const Tensor eg = low ? to_bf16(g) : g;
    Tensor grad_a, grad_b;
    if (ga)
      grad_a = sum_to(product(eg, saved_b.get().transpose(-1, -2), Tensor(), "matmul", dt), sa);
    if (gb)
      grad_b = sum_to(product(saved_a.get().transpose(-1, -2), eg, Tensor(), "matmul", dt), sb);
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
  const bool low = autocast_bf16(x.device(), x.dtype());
  const DType dt = x.dtype();
  Tensor x2, w, out;
  {
    NoGradGuard no_grad;
    x2 = low ? to_bf16(x).reshape({-1, in}) : x.reshape({-1, in});
    w = low ? bf16_weight(weight) : weight;
    out = product(x2, w.transpose(0, 1), bias, "linear", dt).view(out_shape);
  }
  const bool gx = x.requires_grad(), gw = weight.requires_grad();
  const bool gbias = bias.defined() && bias.requires_grad();
  SavedTensor saved_x(gw ? x2 : Tensor(), "linear"), saved_w(gx ? w : Tensor(), "linear");
  const Shape x_shape = x.shape();
  return record("linear", out, {&x, &weight, &bias}, [=](const Tensor& g) {
    const Tensor g2 = g.reshape({-1, out_features});
    const Tensor eg = low ? to_bf16(g2) : g2;
    Tensor grad_x, grad_w, grad_b;
    if (gx) grad_x = product(eg, saved_w.get(), Tensor(), "linear", dt).view(x_shape);
    if (gw) grad_w = product(eg.transpose(0, 1), saved_x.get(), Tensor(), "linear", dt);
    if (gbias) grad_b = sum(g2, {0});
    return std::vector<Tensor>{grad_x, grad_w, grad_b};
  });
}

}  // namespace roformer
