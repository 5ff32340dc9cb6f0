// gelu (erf form). Backward keeps the input: dx = dy * (Phi(x) + x phi(x)).
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

Tensor gelu(const Tensor& x) {
  kernel_device("gelu", {&x});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat("gelu: expected a floating tensor, got ", x.desc()));
  const Tensor xc = x.detach().contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch::gelu_forward(x.device(), xc, y);
  if (!needs_grad({&x})) return y;
  const SavedTensor saved(xc, "gelu");
  return record("gelu", y, {&x}, [saved](const Tensor& g) {
    const Tensor& xs = saved.get();
    const Tensor gc = g.to(xs.dtype()).contiguous();
    Tensor dx = Tensor::empty(xs.shape(), xs.dtype(), xs.device());
    launch::gelu_backward(xs.device(), xs, gc, dx);
    return std::vector<Tensor>{dx};
  });
}

}  // namespace roformer
