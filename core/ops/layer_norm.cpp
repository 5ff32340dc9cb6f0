// layer_norm over the last dim, and add_layer_norm(x, residual) =
// layer_norm(x + residual) with the add inside the kernel (a transformer's
// residual connection: one pass fewer). Backward keeps the normalised input
// (x, or the sum), the weight and the per-row mean and variance: no
// normalised copy of the activations.
//
// bf16 activations (core/precision.h): add_layer_norm takes a bf16 x with an
// f32 residual (the sum is formed in f32 by the kernel, and x's gradient
// comes back in bf16); layer_norm takes a bf16 x with f32 parameters through
// a cast to f32. Either normalises in f32 and writes f32.
//
// dropout_add_layer_norm(x, residual) = add_layer_norm(dropout(x), residual):
// the kernels apply the mask as they read x and write x's gradient, so a
// residual block's end makes one pass each way instead of two.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "core/ops.h"
#include "core/ops/dispatch.h"
#include "core/ops/dropout_checks.h"
#include "core/precision.h"

namespace roformer {

namespace {
void check_param(const Tensor& p, const char* name, const Tensor& x) {
  if (!p.defined()) return;
  if (p.dim() != 1 || p.shape()[0] != x.shape().back() || p.dtype() != x.dtype())
    throw Error(detail::concat("layer_norm: ", name, " ", p.desc(), " does not match input ",
                               x.desc(), " (expected ", dtype_name(x.dtype()), "[",
                               x.shape().back(), "])"));
}

// layer_norm(x + residual) when `residual` is defined (the sum is made by the
// kernel and kept for backward), else layer_norm(x); x dropped first by
// `drop` (p > 0, with a residual; `tokens` as the kernels take them).
Tensor normalise(const char* op, const Tensor& x, const Tensor& residual, const Tensor& weight,
                 const Tensor& bias, double eps, const kernels::ResidualDropout& drop = {},
                 const Tensor& tokens = Tensor()) {
  kernel_device(op, {&x, &residual, &weight, &bias, &tokens});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat(op, ": expected a floating input, got ", x.desc()));
  if (x.dim() < 1 || x.shape().back() == 0)
    throw Error(detail::concat(op, ": expected a non-empty last dimension, got ", x.desc()));
  // bf16 x with an f32 residual: the sum (and everything after it) is f32.
  const bool mixed =
      residual.defined() && x.dtype() == DType::bf16 && residual.dtype() == DType::f32;
  if (residual.defined() &&
      (residual.shape() != x.shape() || (residual.dtype() != x.dtype() && !mixed)))
    throw Error(detail::concat(op, ": residual ", residual.desc(),
                               " must have x's shape and dtype (", x.desc(),
                               "), or be f32 for a bf16 x"));
  if (!(eps >= 0.0) || !std::isfinite(eps))
    throw Error(detail::concat(op, ": eps must be finite and >= 0, got ", eps));
  const DType dtype = mixed ? DType::f32 : x.dtype();  // of the sum, y and the parameters
  const Tensor as_output = mixed ? residual : x;
  check_param(weight, "weight", as_output);
  check_param(bias, "bias", as_output);
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  const DType stat_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
  const Tensor xc = x.detach().contiguous();
  const Tensor rc = residual.defined() ? residual.detach().contiguous() : Tensor();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  const Tensor sum = rc.defined() ? Tensor::empty(x.shape(), dtype, x.device()) : Tensor();
  Tensor mean = Tensor::empty({rows}, stat_dtype, x.device());
  Tensor var = Tensor::empty({rows}, stat_dtype, x.device());
  // Under bf16 activations a residual block's f32 output is next read by a
  // product, in bf16: the kernel writes that copy too, and to_bf16 serves it.
  const Tensor y_low = rc.defined() && dtype == DType::f32 && activation_dtype(y) == DType::bf16
                           ? Tensor::empty(x.shape(), DType::bf16, x.device())
                           : Tensor();
  launch::layer_norm_forward(x.device(), xc, rc, w, b, eps, drop, tokens, y, y_low, sum, mean, var);
  if (y_low.defined()) remember_bf16_cast(y, y_low);
  if (!needs_grad({&x, &residual, &weight, &bias})) return y;

  // Backward reads the rows that were normalised: the sum, or x.
  const SavedTensor saved_x(rc.defined() ? sum : xc, op), saved_w(w, op);
  const bool has_bias = bias.defined(), has_residual = rc.defined();
  const DType x_dtype = x.dtype();
  auto grads = [=](const Tensor& g) {
    const Tensor& xs = saved_x.get();
    const Tensor& ws = saved_w.get();
    const Tensor gc = g.to(xs.dtype()).contiguous();
    Tensor dx = Tensor::empty(xs.shape(), xs.dtype(), xs.device());
    Tensor dw = ws.defined() ? Tensor::empty({cols}, xs.dtype(), xs.device()) : Tensor();
    Tensor db = has_bias ? Tensor::empty({cols}, xs.dtype(), xs.device()) : Tensor();
    // d(x + residual) reaches the residual unchanged and x in x's dtype,
    // through the dropout's mask: written by the same kernel, not by a cast
    // or dropout pass of its own.
    const bool own_x_grad = mixed || drop.p > 0.0;
    const Tensor dx_x = own_x_grad ? Tensor::empty(xs.shape(), x_dtype, xs.device()) : Tensor();
    launch::layer_norm_backward(xs.device(), xs, ws, mean, var, gc, eps, drop, tokens, dx, dx_x, dw,
                                db);
    if (!has_residual) return std::vector<Tensor>{dx, dw, db};
    return std::vector<Tensor>{own_x_grad ? dx_x : dx, dx, dw, db};
  };
  if (has_residual) return record(op, y, {&x, &residual, &weight, &bias}, grads);
  return record(op, y, {&x, &weight, &bias}, grads);
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const bool f32_params = (weight.defined() && weight.dtype() == DType::f32) ||
                          (bias.defined() && bias.dtype() == DType::f32);
  if (x.dtype() == DType::bf16 && f32_params)
    return normalise("layer_norm", cast(x, DType::f32), Tensor(), weight, bias, eps);
  return normalise("layer_norm", x, Tensor(), weight, bias, eps);
}

Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                      const Tensor& bias, double eps) {
  if (!residual.defined())
    throw Error(detail::concat("add_layer_norm: residual is undefined (x ", x.desc(), ")"));
  return normalise("add_layer_norm", x, residual, weight, bias, eps);
}

Tensor dropout_add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                              const Tensor& bias, double eps, double p, bool training,
                              DropoutContext& ctx, const Tensor& tokens) {
  const char* op = "dropout_add_layer_norm";
  if (!residual.defined())
    throw Error(detail::concat(op, ": residual is undefined (x ", x.desc(), ")"));
  check_dropout_arguments(op, x, p, tokens);
  // Identity dropout takes no site, as dropout() does.
  if (!training || p == 0.0) return normalise(op, x, residual, weight, bias, eps);
  // The kernels' rows must be dropout's tokens: x [T, features] on a token
  // stream, [B, S, features] or [B, features] padded. Other shapes (and
  // fusion switched off) run the pair.
  const bool rows_are_tokens = tokens.defined() ? x.dim() == 2 : x.dim() >= 1 && x.dim() <= 3;
  if (!rows_are_tokens || !fused_residual_dropout()) {
    const Tensor dropped =
        tokens.defined() ? dropout(x, p, training, ctx, tokens) : dropout(x, p, training, ctx);
    return normalise(op, dropped, residual, weight, bias, eps);
  }
  // A device's kernels may pick their form by the operands' alignment, and
  // the pair's layer norm reads dropout's fresh output: a contiguous view of
  // x that starts off a 16-byte boundary is read from a fresh copy, as the
  // pair's (a strided x gets one from normalise's contiguous()).
  const bool aligned = reinterpret_cast<uintptr_t>(x.data()) % 16 == 0;
  const Tensor xa = aligned || !x.is_contiguous() ? x : x.clone();
  // [B, 0, F] has no rows: one position a row is as good as none.
  const int64_t positions = x.dim() >= 3 ? std::max<int64_t>(1, x.size(1)) : 1;
  const kernels::ResidualDropout drop{p, ctx.next_site_key(), positions};
  return normalise(op, xa, residual, weight, bias, eps, drop,
                   tokens.defined() ? tokens.detach().contiguous() : Tensor());
}

namespace {
std::atomic<bool> g_fused_residual_dropout{true};
}

void set_fused_residual_dropout(bool on) {
  g_fused_residual_dropout.store(on);
}

bool fused_residual_dropout() {
  return g_fused_residual_dropout.load(std::memory_order_relaxed);
}

}  // namespace roformer
