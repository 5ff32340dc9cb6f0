// concat, stack, split, where, masked_fill, cast, index_select.
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) throw Error("concat: no tensors given");
  const Tensor& first = tensors[0];
  dim = wrap_dim(dim, first.dim(), "concat");
  Shape shape = first.shape();
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    kernel_device("concat", {&first, &t});
    bool same = t.dim() == first.dim() && t.dtype() == first.dtype();
    for (int64_t d = 0; same && d < t.dim(); ++d) same = d == dim || t.shape()[d] == shape[d];
    if (!same)
      throw Error(detail::concat("concat: ", t.desc(), " does not match ", first.desc(),
                                 " outside dimension ", dim));
    total += t.shape()[dim];
  }
  shape[dim] = total;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  std::vector<int64_t> sizes;
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (const Tensor& t : tensors) {
      launch::copy(out.device(), t, out.narrow(dim, start, t.shape()[dim]));
      start += t.shape()[dim];
      sizes.push_back(t.shape()[dim]);
    }
  }
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : tensors) inputs.push_back(&t);
  return record("concat", out, inputs, [sizes, dim](const Tensor& g) {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t s : sizes) {
      grads.push_back(g.narrow(dim, start, s));
      start += s;
    }
    return grads;
  });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) throw Error("stack: no tensors given");
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (const Tensor& t : tensors) expanded.push_back(t.unsqueeze(dim));
  return concat(expanded, dim);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != x.shape()[dim])
    throw Error(detail::concat("split: sizes add up to ", total, " but dimension ", dim, " of ",
                               x.desc(), " has ", x.shape()[dim]));
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(x.narrow(dim, start, s));
    start += s;
  }
  return parts;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Device device = kernel_device("where", {&cond, &a, &b});
  if (a.dtype() != b.dtype())
    throw Error(detail::concat("where: dtype mismatch, ", a.desc(), " vs ", b.desc()));
  const Shape shape =
      broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  {
    NoGradGuard no_grad;
    launch::where(device, cond.expand(shape), a.expand(shape), b.expand(shape), out);
  }
  const Tensor c = cond.detach();
  const Shape sa = a.shape(), sb = b.shape();
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  return record("where", out, {&a, &b}, [=](const Tensor& g) {
    const Tensor zero = Tensor::zeros({}, g.dtype(), g.device());
    return std::vector<Tensor>{ga ? sum_to(where(c, g, zero), sa) : Tensor(),
                               gb ? sum_to(where(c, zero, g), sb) : Tensor()};
  });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const Tensor fill = Tensor::full({}, value, x.dtype(), x.device());
  if (broadcast_shapes(x.shape(), mask.shape(), "masked_fill") != x.shape())
    throw Error(
        detail::concat("masked_fill: mask ", mask.desc(), " does not broadcast to ", x.desc()));
  return where(mask, fill, x);
}

Tensor cast(const Tensor& x, DType dtype) {
  const Device device = kernel_device("cast", {&x});
  Tensor out = Tensor::empty(x.shape(), dtype, device);
  launch::copy(device, x, out);
  if (!is_floating(dtype)) return out;
  const DType from = x.dtype();
  return record("cast", out, {&x},
                [from](const Tensor& g) { return std::vector<Tensor>{g.to(from)}; });
}

Tensor index_select(const Tensor& x, const Tensor& indices) {
  const Device device = kernel_device("index_select", {&x, &indices});
  if (indices.dim() != 1 || x.dim() < 1)
    throw Error(detail::concat("index_select: expected x [N, ...] and indices [M], got ", x.desc(),
                               " and ", indices.desc()));
  dispatch_index(indices.dtype(), "index_select indices", [](auto) {});
  const int64_t rows = x.shape()[0], picked = indices.shape()[0];
  const int64_t row_elems = rows ? x.numel() / rows : 0;
  Shape shape = x.shape();
  shape[0] = picked;
  Tensor out = Tensor::empty(shape, x.dtype(), device);
  const Tensor idx = indices.contiguous();
  // The kernel checks the indices; a bad one is raised at the next sync point.
  const int32_t site =
      kernels::index_check_site(device, [desc = x.desc()](int64_t value, int64_t position) {
        return detail::concat("index_select: index ", value, " at position ", position,
                              " out of range for ", desc);
      });
  launch::gather_rows(device, x.detach().contiguous().view({rows, row_elems}), idx, site,
                      out.view({picked, row_elems}));
  if (!needs_grad({&x})) return out;
  const SavedTensor saved_idx(idx, "index_select");
  const Shape in_shape = x.shape();
  return record("index_select", out, {&x}, [=](const Tensor& g) {
    Tensor grad = Tensor::zeros(in_shape, g.dtype(), g.device());
    // Sequential over indices: repeated indices add up in a fixed order.
    launch::scatter_add_rows(g.device(), g.contiguous().view({picked, row_elems}), saved_idx.get(),
                             grad.view({rows, row_elems}));
    return std::vector<Tensor>{grad};
  });
}

}  // namespace roformer
