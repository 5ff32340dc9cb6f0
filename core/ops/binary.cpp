// add, sub, mul, div with NumPy broadcasting, and their scalar forms.
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw Error(detail::concat(op, ": shapes ", shape_str(a), " and ", shape_str(b),
                                 " cannot be broadcast together (dimension ", i, ": ", da, " vs ",
                                 db, ")"));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw Error(detail::concat(op, ": dtype mismatch, ", a.desc(), " vs ", b.desc()));
}

Tensor binary_forward(kernels::BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  const Device device = kernel_device(name, {&a, &b});
  check_same_dtype(name, a, b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  NoGradGuard no_grad;  // expand() here is plumbing, not part of the graph
  launch::binary(device, op, a.expand(shape), b.expand(shape), out);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(kernels::BinaryOp::add, "add", a, b);
  const Shape sa = a.shape(), sb = b.shape();
  return record("add", out, {&a, &b}, [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(kernels::BinaryOp::sub, "sub", a, b);
  const Shape sa = a.shape(), sb = b.shape();
  return record("sub", out, {&a, &b}, [sa, sb](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(neg(g), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(kernels::BinaryOp::mul, "mul", a, b);
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  SavedTensor sa_saved(gb ? a : Tensor(), "mul"), sb_saved(ga ? b : Tensor(), "mul");
  const Shape sa = a.shape(), sb = b.shape();
  return record("mul", out, {&a, &b}, [=](const Tensor& g) {
    return std::vector<Tensor>{ga ? sum_to(mul(g, sb_saved.get()), sa) : Tensor(),
                               gb ? sum_to(mul(g, sa_saved.get()), sb) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(kernels::BinaryOp::div, "div", a, b);
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  SavedTensor saved_b(b, "div"), saved_out(gb ? out : Tensor(), "div");
  const Shape sa = a.shape(), sb = b.shape();
  return record("div", out, {&a, &b}, [=](const Tensor& g) {
    const Tensor& bv = saved_b.get();
    Tensor grad_a = ga ? sum_to(div(g, bv), sa) : Tensor();
    // d(a/b)/db = -(a/b)/b
    Tensor grad_b = gb ? sum_to(neg(div(mul(g, saved_out.get()), bv)), sb) : Tensor();
    return std::vector<Tensor>{grad_a, grad_b};
  });
}

namespace {
Tensor scalar_op(kernels::UnaryOp op, const char* name, const Tensor& a, double s) {
  const Device device = kernel_device(name, {&a});
  Tensor out = Tensor::empty(a.shape(), a.dtype(), device);
  launch::unary(device, op, a, out, s);
  return out;
}
}  // namespace

Tensor add(const Tensor& a, double s) {
  return record("add_scalar", scalar_op(kernels::UnaryOp::add_scalar, "add_scalar", a, s), {&a},
                [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor sub(const Tensor& a, double s) {
  return add(a, -s);
}

Tensor rsub(const Tensor& a, double s) {
  return record("rsub_scalar", scalar_op(kernels::UnaryOp::rsub_scalar, "rsub_scalar", a, s), {&a},
                [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
}

Tensor mul(const Tensor& a, double s) {
  return record("mul_scalar", scalar_op(kernels::UnaryOp::mul_scalar, "mul_scalar", a, s), {&a},
                [s](const Tensor& g) { return std::vector<Tensor>{mul(g, s)}; });
}

Tensor div(const Tensor& a, double s) {
  return mul(a, 1.0 / s);
}

}  // namespace roformer
