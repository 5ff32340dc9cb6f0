// sum, mean, max/argmax over dims, and sum_to (broadcasting's inverse).
#include <algorithm>

#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

namespace {
// Normalised reduced-dim mask; an empty list means every dim.
std::vector<bool> reduced_mask(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> mask(size_t(a.dim()), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, a.dim(), op);
    if (mask[w] && !dims.empty())
      throw Error(detail::concat(op, ": dimension ", d, " listed twice for ", a.desc()));
    mask[w] = true;
  }
  return mask;
}

Shape keepdim_shape(const Tensor& a, const std::vector<bool>& mask) {
  Shape s = a.shape();
  for (size_t d = 0; d < s.size(); ++d)
    if (mask[d]) s[d] = 1;
  return s;
}

Shape dropped_shape(const Tensor& a, const std::vector<bool>& mask) {
  Shape s;
  for (size_t d = 0; d < mask.size(); ++d)
    if (!mask[d]) s.push_back(a.shape()[d]);
  return s;
}
}  // namespace

Tensor sum(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  kernel_device("sum", {&a});
  const std::vector<bool> mask = reduced_mask(a, dims, "sum");
  const Shape kshape = keepdim_shape(a, mask);
  Tensor out = Tensor::empty(kshape, a.dtype(), a.device());
  if (a.dim() == 0) {
    out.copy_(a);
  } else {
    if (a.dim() > 32) throw Error("sum: more than 32 dimensions in " + a.desc());
    uint32_t bits = 0;
    for (size_t d = 0; d < mask.size(); ++d)
      if (mask[d]) bits |= uint32_t(1) << d;
    launch::sum(a.device(), a, bits, out);
  }
  if (!keepdim)
    out = make_view(out, dropped_shape(a, mask), contiguous_strides(dropped_shape(a, mask)), 0);
  const Shape in_shape = a.shape();
  return record("sum", out, {&a}, [in_shape, kshape](const Tensor& g) {
    return std::vector<Tensor>{g.reshape(kshape).expand(in_shape).contiguous()};
  });
}

Tensor sum(const Tensor& a) {
  return sum(a, {}, false);
}

Tensor mean(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  const std::vector<bool> mask = reduced_mask(a, dims, "mean");
  int64_t count = 1;
  for (size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) count *= a.shape()[d];
  return mul(sum(a, dims, keepdim), 1.0 / double(std::max<int64_t>(count, 1)));
}

Tensor mean(const Tensor& a) {
  return mean(a, {}, false);
}

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  kernel_device("max", {&a});
  dim = wrap_dim(dim, a.dim(), "max");
  if (a.shape()[dim] == 0) throw Error("max: empty dimension in " + a.desc());
  std::vector<bool> mask(size_t(a.dim()), false);
  mask[dim] = true;
  const Shape kshape = keepdim_shape(a, mask);
  Tensor values = Tensor::empty(kshape, a.dtype(), a.device());
  Tensor indices = Tensor::empty(kshape, DType::i64, a.device());
  launch::max(a.device(), a, int32_t(dim), values, indices);
  if (!keepdim) {
    values = values.detach().squeeze(dim);
    indices = indices.squeeze(dim);
  }
  const Shape in_shape = a.shape();
  const DType dt = a.dtype();
  Tensor idx_keep = indices.reshape(kshape);
  values = record("max", values, {&a}, [=](const Tensor& g) {
    Tensor grad = Tensor::zeros(in_shape, dt, g.device());
    launch::scatter_along(g.device(), g.reshape(kshape), idx_keep, int32_t(dim), grad);
    return std::vector<Tensor>{grad};
  });
  return {values, indices};
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return max(a, dim, keepdim).second;
}

Tensor sum_to(const Tensor& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  const int64_t lead = a.dim() - int64_t(shape.size());
  if (lead < 0)
    throw Error(detail::concat("sum_to: cannot reduce ", a.desc(), " to ", shape_str(shape)));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && a.shape()[d] != 1) {
      dims.push_back(d);
    } else if (shape[d - lead] != a.shape()[d]) {
      throw Error(detail::concat("sum_to: cannot reduce ", a.desc(), " to ", shape_str(shape)));
    }
  }
  if (dims.empty()) return a.reshape(shape);
  return sum(a, dims, true).reshape(shape);
}

}  // namespace roformer
