// softmax and log_softmax over the last dim. Backward needs only the output:
// softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

namespace {

Tensor softmax_impl(const Tensor& x, bool log, const char* op) {
  kernel_device(op, {&x});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat(op, ": expected a floating tensor, got ", x.desc()));
  if (x.dim() < 1)
    throw Error(detail::concat(op, ": expected at least 1 dimension, got ", x.desc()));
  const Tensor xc = x.detach().contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  launch::softmax_forward(x.device(), xc, y, log);
  if (!needs_grad({&x})) return y;
  const SavedTensor saved(y, op);
  return record(op, y, {&x}, [saved, log](const Tensor& g) {
    const Tensor& out = saved.get();
    const Tensor gc = g.to(out.dtype()).contiguous();
    Tensor dx = Tensor::empty(out.shape(), out.dtype(), out.device());
    launch::softmax_backward(out.device(), out, gc, dx, log);
    return std::vector<Tensor>{dx};
  });
}

}  // namespace

Tensor softmax(const Tensor& x) {
  return softmax_impl(x, false, "softmax");
}

Tensor log_softmax(const Tensor& x) {
  return softmax_impl(x, true, "log_softmax");
}

}  // namespace roformer
