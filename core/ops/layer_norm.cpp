// layer_norm over the last dim. Backward keeps the input, the weight and the
// per-row mean and variance: no normalised copy of the activations.
#include <cmath>

#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

namespace {
void check_param(const Tensor& p, const char* name, const Tensor& x) {
  if (!p.defined()) return;
  if (p.dim() != 1 || p.shape()[0] != x.shape().back() || p.dtype() != x.dtype())
    throw Error(detail::concat("layer_norm: ", name, " ", p.desc(), " does not match input ",
                               x.desc(), " (expected ", dtype_name(x.dtype()), "[",
                               x.shape().back(), "])"));
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  kernel_device("layer_norm", {&x, &weight, &bias});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat("layer_norm: expected a floating input, got ", x.desc()));
  if (x.dim() < 1 || x.shape().back() == 0)
    throw Error(detail::concat("layer_norm: expected a non-empty last dimension, got ", x.desc()));
  if (!(eps >= 0.0) || !std::isfinite(eps))
    throw Error(detail::concat("layer_norm: eps must be finite and >= 0, got ", eps));
  check_param(weight, "weight", x);
  check_param(bias, "bias", x);
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  const DType stat_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor xc = x.detach().contiguous();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, stat_dtype, x.device());
  Tensor var = Tensor::empty({rows}, stat_dtype, x.device());
  launch::layer_norm_forward(x.device(), xc, w, b, eps, y, mean, var);
  if (!needs_grad({&x, &weight, &bias})) return y;

  const SavedTensor saved_x(xc, "layer_norm"), saved_w(w, "layer_norm");
  const bool has_bias = bias.defined();
  return record("layer_norm", y, {&x, &weight, &bias}, [=](const Tensor& g) {
    const Tensor& xs = saved_x.get();
    const Tensor& ws = saved_w.get();
    const Tensor gc = g.to(xs.dtype()).contiguous();
    Tensor dx = Tensor::empty(xs.shape(), xs.dtype(), xs.device());
    Tensor dw = ws.defined() ? Tensor::empty({cols}, xs.dtype(), xs.device()) : Tensor();
    Tensor db = has_bias ? Tensor::empty({cols}, xs.dtype(), xs.device()) : Tensor();
    launch::layer_norm_backward(xs.device(), xs, ws, mean, var, gc, eps, dx, dw, db);
    return std::vector<Tensor>{dx, dw, db};
  });
}

}  // namespace roformer
