// Rotary position embedding (paper eq. 34). A rotation is orthogonal, so the
// backward is the same kernel rotating the gradient by minus the angle; the
// node keeps only the (shared, cached) cos/sin table, no activations.
#include "core/cpu/rope.h"

#include "core/ops.h"

namespace roformer {

Tensor rope(const Tensor& x, const Tensor& positions, double base, RopeLayout layout) {
  kernel_device("rope", {&x, &positions});
  if (!is_floating(x.dtype()))
    throw Error(detail::concat("rope: expected a floating tensor, got ", x.desc()));
  if (x.dim() < 2) throw Error(detail::concat("rope: expected x [..., S, D], got ", x.desc()));
  const int64_t S = x.shape()[size_t(x.dim() - 2)], D = x.shape().back();
  if (D % 2 != 0)
    throw Error(detail::concat("rope: head dimension ", D, " must be even (x is ", x.desc(), ")"));
  dispatch_index(positions.dtype(), "rope positions", [](auto) {});
  if (positions.dim() != 1 || positions.shape()[0] != S)
    throw Error(detail::concat("rope: positions ", positions.desc(), " do not match x ", x.desc(),
                               " (expected [", S, "] for the sequence dimension)"));
  if (!(base > 0.0)) throw Error(detail::concat("rope: base must be positive, got ", base));

  const auto table = cpu::rope_table(positions.to_vector<int64_t>(), D, base);
  const bool interleaved = layout == RopeLayout::interleaved;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  cpu::rope(x, *table, interleaved, /*inverse=*/false, out);
  return record("rope", out, {&x}, [table, interleaved](const Tensor& g) {
    Tensor grad = Tensor::empty(g.shape(), g.dtype(), g.device());
    cpu::rope(g, *table, interleaved, /*inverse=*/true, grad);
    return std::vector<Tensor>{grad};
  });
}

}  // namespace roformer
