// matmul, linear and the tanh-GELU feed-forward block on the matmul kernels
// (oneDNN on the CPU, cuBLASLt on CUDA). Backward passes transposed
// views of the saved operands straight to the kernel: no transposed copies.
// Under a bf16 MatmulPrecisionScope (core/precision.h) f32 operands are cast
// to bf16 (weights through the per-step cache), the products accumulate in
// f32 and write f32 (or bf16 activations, when linear is asked for them);
// the bf16 operands are what backward keeps.
#include <algorithm>
#include <atomic>
#include <tuple>
#include <utility>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/precision.h"

namespace roformer {

namespace {

// Plain product without history: out = a x b (+ bias), a/b at least 2-D with
// broadcastable batch dims; bf16 operands accumulate in f32 and write f32 or
// bf16 (out_dtype; the mixed precision cases).
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

// Whether autocast runs a product of input x with f32 weight in bf16: an f32
// or bf16 x (bf16 activations) on a device with bf16 products.
bool autocast_product(const Tensor& x, const Tensor& weight) {
  return weight.dtype() == DType::f32 && autocast_active(x.device()) &&
         (x.dtype() == DType::f32 || x.dtype() == DType::bf16);
}

std::atomic<bool> g_bias_grad_in_product{false};

// A linear's weight gradient g^T x [N, K] in w_dtype and, when asked for,
// its bias gradient (g's column sums in g's dtype, then widened, as under
// torch's autocast); g [T, N] as the backward got it, eg the product's
// operand (g, or its bf16 cast under autocast), x [T, K]. Both come from one
// kernel (on CUDA, with bias_grad_in_product(), one pass over eg: cuBLASLt's
// BGRADB) where the product reads g itself; a bf16 cast of an f32 g keeps
// its sums over the f32 g.
std::pair<Tensor, Tensor> weight_grads(const Tensor& g, const Tensor& eg, const Tensor& x,
                                       DType w_dtype, bool want_w, bool want_b, const char* op) {
  if (want_w && want_b && eg.dtype() == g.dtype()) {
    Tensor dw = Tensor::empty({eg.size(1), x.size(1)}, w_dtype, eg.device());
    Tensor db = Tensor::empty({eg.size(1)}, eg.dtype(), eg.device());
    launch::linear_weight_grads(eg.device(), eg, x, dw, db, bias_grad_in_product());
    return {dw, db.to(w_dtype)};
  }
  Tensor dw, db;
  if (want_w) dw = product(eg.transpose(0, 1), x, Tensor(), op, w_dtype);
  if (want_b) db = sum(g, {0}).to(w_dtype);
  return {dw, db};
}

// A linear's input gradient eg w [.., K] in x's dtype and shape; added into
// `partial` (the gradient summed so far for x, when autograd offers one that
// fits) by the product itself, and partial returned (AccumulatingBackwardFn).
Tensor input_grad(const Tensor& eg, const Tensor& w, const Tensor& partial, DType x_dtype,
                  const Shape& x_shape, const char* op) {
  if (partial.defined() && partial.dtype() == x_dtype && partial.shape() == x_shape &&
      partial.device() == eg.device()) {
    Tensor sum = partial;
    launch::matmul_accumulate(eg.device(), eg, w, sum.view({eg.size(0), w.size(1)}));
    sum.bump_version();
    return sum;
  }
  return product(eg, w, Tensor(), op, x_dtype).view(x_shape);
}

// linear() and stacked_linear(): x [..., in] times the weights stacked along
// their output dimension (one part: linear itself), as one product.
Tensor stacked_linear(const char* op, const Tensor& x, const std::vector<Tensor>& weights,
                      const std::vector<Tensor>& biases, DType out_dtype) {
  std::vector<const Tensor*> inputs{&x};
  for (const Tensor& w : weights) inputs.push_back(&w);
  for (const Tensor& b : biases) inputs.push_back(&b);
  kernel_device(op, inputs);
  if (weights.empty() || biases.size() != weights.size())
    throw Error(detail::concat(op, ": expected one bias (or undefined) per weight, got ",
                               weights.size(), " weights and ", biases.size(), " biases"));
  const Tensor& first = weights.front();
  const int64_t in = first.dim() == 2 ? first.shape()[1] : -1;
  if (x.dim() < 1 || x.shape().back() != in)
    throw Error(detail::concat(op, ": input ", x.desc(), " does not match weight ", first.desc(),
                               " (expected input [..., ",
                               first.shape().empty() ? 0 : first.shape().back(),
                               "], weight [out, in])"));
  // Under autocast an f32 weight takes f32 input or bf16 activations (see
  // core/precision.h) and writes either; otherwise one dtype throughout.
  const bool low = autocast_product(x, first);
  const bool out_ok =
      low ? (out_dtype == DType::f32 || out_dtype == DType::bf16) : out_dtype == x.dtype();
  std::vector<int64_t> offsets{0};
  for (size_t i = 0; i < weights.size(); ++i) {
    const Tensor &w = weights[i], &b = biases[i];
    if (w.dim() != 2 || w.shape()[1] != in || w.dtype() != first.dtype())
      throw Error(detail::concat(op, ": weight ", w.desc(), " does not stack with ", first.desc(),
                                 " (expected [out, ", in, "] of one dtype)"));
    if ((!low && x.dtype() != w.dtype()) || (b.defined() && b.dtype() != w.dtype()) || !out_ok)
      throw Error(
          detail::concat(op, ": dtype mismatch, input ", x.desc(), ", weight ", w.desc(), ", bias ",
                         b.desc(), ", output ", dtype_name(out_dtype),
                         " (bf16 input or output needs run.precision: bf16 and f32 weights)"));
    if (b.defined() != biases.front().defined() ||
        (b.defined() && (b.dim() != 1 || b.shape()[0] != w.shape()[0])))
      throw Error(detail::concat(op, ": bias ", b.desc(), " does not match weight ", w.desc(),
                                 " (biases all defined or all undefined)"));
    offsets.push_back(offsets.back() + w.shape()[0]);
  }
  const int64_t out_features = offsets.back();
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  const DType x_dtype = x.dtype(), w_dtype = first.dtype();
  const bool has_bias = biases.front().defined();
  Tensor x2, w, out;
  {
    NoGradGuard no_grad;
    x2 = low ? to_bf16(x).reshape({-1, in}) : x.reshape({-1, in});
    // The parts side by side (bf16 under autocast), stacked once per
    // optimizer step; a bf16 result takes the bias in bf16 too (cuBLASLt's
    // default bias type).
    w = stacked_weight(weights, low);
    const Tensor b = has_bias ? stacked_weight(biases, low && out_dtype == DType::bf16) : Tensor();
    out = product(x2, w.transpose(0, 1), b, op, out_dtype).view(out_shape);
  }
  const bool gx = x.requires_grad();
  const size_t parts = weights.size();
  std::vector<bool> wanted;  // per weight, then per bias
  for (const Tensor& t : weights) wanted.push_back(t.requires_grad());
  for (const Tensor& t : biases) wanted.push_back(t.defined() && t.requires_grad());
  const bool gw = std::find(wanted.begin(), wanted.begin() + parts, true) != wanted.begin() + parts;
  const bool gbias = std::find(wanted.begin() + parts, wanted.end(), true) != wanted.end();
  SavedTensor saved_x(gw ? x2 : Tensor(), op), saved_w(gx ? w : Tensor(), op);
  const Shape x_shape = x.shape();
  return record_accumulating(
      op, out, inputs, [=](const Tensor& g, const std::vector<Tensor>& partial) {
        const Tensor g2 = g.reshape({-1, out_features});
        const Tensor eg = low ? to_bf16(g2) : g2;
        std::vector<Tensor> grads(1 + 2 * parts);
        // Each gradient in its input's dtype (the bias's summed in g's, as
        // under torch's autocast, then widened). x's last: it may add into
        // the sum autograd holds, which must stay as it was if this throws.
        const auto [dw, db] =
            weight_grads(g2, eg, gw ? saved_x.get() : Tensor(), w_dtype, gw, gbias, op);
        // Each part's gradient: its rows of the stacked ones.
        auto part = [&](const Tensor& whole, size_t i) {
          return parts == 1 ? whole : whole.narrow(0, offsets[i], offsets[i + 1] - offsets[i]);
        };
        for (size_t i = 0; i < parts; ++i) {
          if (wanted[i]) grads[1 + i] = part(dw, i);
          if (wanted[parts + i]) grads[1 + parts + i] = part(db, i);
        }
        if (gx) grads[0] = input_grad(eg, saved_w.get(), partial[0], x_dtype, x_shape, op);
        return grads;
      });
}

}  // namespace

void set_bias_grad_in_product(bool on) {
  g_bias_grad_in_product.store(on);
}

bool bias_grad_in_product() {
  return g_bias_grad_in_product.load();
}

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
  return linear(x, weight, bias, x.dtype());
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType out_dtype) {
  return stacked_linear("linear", x, {weight}, {bias}, out_dtype);
}

Tensor stacked_linear(const Tensor& x, const std::vector<Tensor>& weights,
                      const std::vector<Tensor>& biases, DType out_dtype) {
  return stacked_linear("stacked_linear", x, weights, biases, out_dtype);
}

Tensor gelu_tanh_ffn(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                     const Tensor& b2) {
  return gelu_tanh_ffn(x, w1, b1, w2, b2, x.dtype());
}

Tensor gelu_tanh_ffn(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                     const Tensor& b2, DType out_dtype) {
  constexpr const char* op = "gelu_tanh_ffn";
  kernel_device(op, {&x, &w1, &b1, &w2, &b2});
  if (w1.dim() != 2 || w2.dim() != 2 || x.dim() < 1 || x.shape().back() != w1.size(1) ||
      w2.size(1) != w1.size(0) || !b1.defined() || b1.dim() != 1 || b1.size(0) != w1.size(0) ||
      !b2.defined() || b2.dim() != 1 || b2.size(0) != w2.size(0))
    throw Error(detail::concat(op, ": expected x [..., in], w1 [inner, in], b1 [inner], w2 [out, ",
                               "inner], b2 [out]; got x ", x.desc(), ", w1 ", w1.desc(), ", b1 ",
                               b1.desc(), ", w2 ", w2.desc(), ", b2 ", b2.desc()));
  // As linear: under autocast f32 parameters take an f32 or bf16 x, and a
  // bf16 result keeps the inner activations (pre, h) in bf16 too; otherwise
  // one dtype throughout.
  const bool low = autocast_product(x, w1);
  for (const Tensor* t : {&w1, &b1, &w2, &b2})
    if (t->dtype() != (low ? DType::f32 : x.dtype()) || !is_floating(x.dtype()))
      throw Error(detail::concat(op, ": expected floating tensors of one dtype, got x ", x.desc(),
                                 " and ", t->desc()));
  if (low ? out_dtype != DType::f32 && out_dtype != DType::bf16 : out_dtype != x.dtype())
    throw Error(detail::concat(op, ": cannot write ", dtype_name(out_dtype), " for x ", x.desc(),
                               " (bf16 activations need run.precision: bf16)"));
  const int64_t in = w1.size(1), inner = w1.size(0), out_features = w2.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  const DType x_dtype = x.dtype(), w_dtype = w1.dtype();
  const bool bf16_inner = low && out_dtype == DType::bf16;
  const DType dt = bf16_inner ? DType::bf16 : w_dtype;  // pre and h
  Tensor x2, we1, we2, pre, h, out;
  {
    NoGradGuard no_grad;
    x2 = low ? to_bf16(x).reshape({-1, in}) : x.reshape({-1, in});
    we1 = low ? bf16_weight(w1) : w1;
    we2 = low ? bf16_weight(w2) : w2;
    pre = Tensor::empty({x2.size(0), inner}, dt, x.device());
    h = Tensor::empty({x2.size(0), inner}, dt, x.device());
    // pre = x w1^T + b1 (kept for backward), h = gelu_tanh(pre); the bias in
    // the epilogue's dtype (pre's).
    const Tensor eb1 = bf16_inner ? bf16_weight(b1) : b1.contiguous();
    const Tensor eb2 = bf16_inner ? bf16_weight(b2) : b2;
    launch::gemm_gelu_forward(x.device(), x2, we1.transpose(0, 1), eb1, pre, h);
    if (low) h = to_bf16(h);
    out = product(h, we2.transpose(0, 1), eb2, op, out_dtype).view(out_shape);
  }
  const bool gx = x.requires_grad(), gw1 = w1.requires_grad(), gb1 = b1.requires_grad();
  const bool gw2 = w2.requires_grad(), gb2 = b2.requires_grad();
  const bool inner_grad = gx || gw1 || gb1;
  SavedTensor saved_x(gw1 ? x2 : Tensor(), op), saved_w1(gx ? we1 : Tensor(), op);
  SavedTensor saved_pre(inner_grad ? pre : Tensor(), op), saved_h(gw2 ? h : Tensor(), op);
  SavedTensor saved_w2(inner_grad ? we2 : Tensor(), op);
  const Shape x_shape = x.shape();
  return record_accumulating(
      op, out, {&x, &w1, &b1, &w2, &b2}, [=](const Tensor& g, const std::vector<Tensor>& partial) {
        const Tensor g2 = g.reshape({-1, out_features});
        const Tensor eg = low ? to_bf16(g2) : g2;
        Tensor dx, dw1, db1, dw2, db2;
        // Each gradient in its input's dtype (b1's and b2's summed in dt and
        // g's, then widened).
        std::tie(dw2, db2) =
            weight_grads(g2, eg, gw2 ? saved_h.get() : Tensor(), w_dtype, gw2, gb2, op);
        if (inner_grad) {
          // dpre = (g w2) * gelu_tanh'(pre), and b1's gradient in the same pass.
          const Tensor& p = saved_pre.get();
          Tensor dpre = Tensor::empty(p.shape(), dt, p.device());
          Tensor dbias = Tensor::empty({inner}, dt, p.device());
          launch::gemm_dgelu_backward(p.device(), eg, saved_w2.get(), p, dpre, dbias);
          if (gb1) db1 = dbias.to(w_dtype);
          const Tensor ed = low ? to_bf16(dpre) : dpre;
          if (gw1) dw1 = product(ed.transpose(0, 1), saved_x.get(), Tensor(), op, w_dtype);
          if (gx) dx = input_grad(ed, saved_w1.get(), partial[0], x_dtype, x_shape, op);
        }
        return std::vector<Tensor>{dx, dw1, db1, dw2, db2};
      });
}

}  // namespace roformer
