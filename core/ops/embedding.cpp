// embedding: rows of weight [V, D] gathered by ids of any shape. Backward keeps
// only the ids and scatter-adds the output gradient into a zero [V, D].
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

namespace {
// "[i, j, ...]" for flat index n of a tensor of `shape`.
std::string position_str(int64_t n, const Shape& shape) {
  Shape index(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    index[d] = n % shape[d];
    n /= shape[d];
  }
  return shape_str(index);
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  const Device device = kernel_device("embedding", {&weight, &ids});
  if (weight.dim() != 2 || !is_floating(weight.dtype()))
    throw Error(detail::concat("embedding: expected a floating weight [V, D], got ", weight.desc(),
                               " (ids ", ids.desc(), ")"));
  if (ids.dtype() != DType::i32 && ids.dtype() != DType::i64)
    throw Error(detail::concat("embedding: ids must be i32 or i64, got ", ids.desc(), " (weight ",
                               weight.desc(), ")"));
  const int64_t vocab = weight.shape()[0], dim = weight.shape()[1];
  const Tensor idc = ids.contiguous();
  // The kernel checks the ids on the device; a bad one is raised, with this
  // message, at the next sync point (item, to_vector, check_kernel_errors).
  const int32_t site = kernels::index_check_site(
      device, [vocab, ids_shape = ids.shape(), weight_desc = weight.desc(), ids_desc = ids.desc()](
                  int64_t value, int64_t position) {
        return detail::concat("embedding: id ", value, " at position ",
                              position_str(position, ids_shape),
                              " is out of range for vocabulary size ", vocab, " (weight ",
                              weight_desc, ", ids ", ids_desc, ")");
      });
  Shape shape = ids.shape();
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape, weight.dtype(), device);
  launch::gather_rows(device, weight.detach().contiguous(), idc, site, out);
  if (!needs_grad({&weight})) return out;
  const SavedTensor saved_ids(idc, "embedding");
  const DType dtype = weight.dtype();
  return record("embedding", out, {&weight}, [saved_ids, vocab, dim, dtype](const Tensor& g) {
    const Tensor& id = saved_ids.get();
    Tensor grad = Tensor::zeros({vocab, dim}, dtype, g.device());
    launch::scatter_add_rows(g.device(), g.to(dtype).contiguous(), id, grad);
    return std::vector<Tensor>{grad};
  });
}

}  // namespace roformer
