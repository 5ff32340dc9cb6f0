// dropout: the mask is never stored. Forward reserves numel Philox words at
// (gen.seed, offset); backward regenerates the same mask from (seed, offset),
// so the node keeps two integers instead of a mask tensor.
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  const Device device = kernel_device("dropout", {&x});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat("dropout: expected a floating tensor, got ", x.desc()));
  if (!(p >= 0.0 && p < 1.0))
    throw Error(detail::concat("dropout: p must be in [0, 1), got ", p, " for ", x.desc()));
  // Identity draws no numbers, so evaluation leaves the generator untouched.
  if (!training || p == 0.0) return x;
  const uint64_t seed = gen.seed;
  const uint64_t offset = gen.take(uint64_t(x.numel()));
  const Tensor xc = x.detach().contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::DropoutKey key;
  key.p = p;
  key.seed = seed;
  key.offset = offset;
  launch::dropout(device, xc, out, key);
  return record("dropout", out, {&x}, [key](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor dx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
    launch::dropout(gc.device(), gc, dx, key);
    return std::vector<Tensor>{dx};
  });
}

}  // namespace roformer
