// embedding: rows of weight [V, D] gathered by ids of any shape. Backward keeps
// only the ids and scatter-adds the output gradient into a zero [V, D].
#include "core/cpu/embedding.h"

#include "core/ops.h"

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
  kernel_device("embedding", {&weight, &ids});
  if (weight.dim() != 2 || !is_floating(weight.dtype()))
    throw Error(detail::concat("embedding: expected a floating weight [V, D], got ", weight.desc(),
                               " (ids ", ids.desc(), ")"));
  if (ids.dtype() != DType::i32 && ids.dtype() != DType::i64)
    throw Error(detail::concat("embedding: ids must be i32 or i64, got ", ids.desc(), " (weight ",
                               weight.desc(), ")"));
  const int64_t vocab = weight.shape()[0], dim = weight.shape()[1];
  const Tensor idc = ids.contiguous();
  const int64_t bad = cpu::embedding_first_bad_id(idc, vocab);
  if (bad >= 0)
    throw Error(detail::concat("embedding: id ", idc.to_vector<int64_t>()[size_t(bad)],
                               " at position ", position_str(bad, ids.shape()),
                               " is out of range for vocabulary size ", vocab, " (weight ",
                               weight.desc(), ", ids ", ids.desc(), ")"));
  Shape shape = ids.shape();
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  cpu::embedding_forward(weight.detach().contiguous(), idc, out);
  if (!needs_grad({&weight})) return out;
  const SavedTensor saved_ids(idc, "embedding");
  const DType dtype = weight.dtype();
  return record("embedding", out, {&weight}, [saved_ids, vocab, dim, dtype](const Tensor& g) {
    const Tensor& id = saved_ids.get();
    Tensor grad = Tensor::zeros({vocab, dim}, dtype, g.device());
    cpu::embedding_backward(g.to(dtype).contiguous(), id, grad);
    return std::vector<Tensor>{grad};
  });
}

}  // namespace roformer
