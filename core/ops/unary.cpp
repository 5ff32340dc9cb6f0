// neg, exp, log, sqrt, rsqrt, tanh, pow, elu+1: backward written with the
// same ops (it runs under no-grad, so it records nothing).
#include "core/ops.h"
#include "core/ops/dispatch.h"

namespace roformer {

namespace {
Tensor unary_forward(kernels::UnaryOp op, const char* name, const Tensor& a, double s = 0.0) {
  const Device device = kernel_device(name, {&a});
  if (!is_floating(a.dtype()) && op != kernels::UnaryOp::neg)
    throw Error(detail::concat(name, ": expected a floating tensor, got ", a.desc()));
  Tensor out = Tensor::empty(a.shape(), a.dtype(), device);
  launch::unary(device, op, a, out, s);
  return out;
}
}  // namespace

Tensor neg(const Tensor& a) {
  return record("neg", unary_forward(kernels::UnaryOp::neg, "neg", a), {&a},
                [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
}

Tensor exp(const Tensor& a) {
  Tensor out = unary_forward(kernels::UnaryOp::exp, "exp", a);
  SavedTensor saved(out, "exp");
  return record("exp", out, {&a},
                [saved](const Tensor& g) { return std::vector<Tensor>{mul(g, saved.get())}; });
}

Tensor log(const Tensor& a) {
  SavedTensor saved(a, "log");
  return record("log", unary_forward(kernels::UnaryOp::log, "log", a), {&a},
                [saved](const Tensor& g) { return std::vector<Tensor>{div(g, saved.get())}; });
}

Tensor sqrt(const Tensor& a) {
  Tensor out = unary_forward(kernels::UnaryOp::sqrt, "sqrt", a);
  SavedTensor saved(out, "sqrt");
  return record("sqrt", out, {&a}, [saved](const Tensor& g) {
    return std::vector<Tensor>{div(mul(g, 0.5), saved.get())};
  });
}

Tensor rsqrt(const Tensor& a) {
  Tensor out = unary_forward(kernels::UnaryOp::rsqrt, "rsqrt", a);
  SavedTensor saved(out, "rsqrt");
  return record("rsqrt", out, {&a}, [saved](const Tensor& g) {
    const Tensor& y = saved.get();  // d/dx x^-1/2 = -1/2 y^3
    return std::vector<Tensor>{mul(mul(g, pow(y, 3.0)), -0.5)};
  });
}

Tensor tanh(const Tensor& a) {
  Tensor out = unary_forward(kernels::UnaryOp::tanh, "tanh", a);
  SavedTensor saved(out, "tanh");
  return record("tanh", out, {&a}, [saved](const Tensor& g) {
    const Tensor& y = saved.get();
    return std::vector<Tensor>{mul(g, rsub(mul(y, y), 1.0))};
  });
}

Tensor pow(const Tensor& a, double exponent) {
  SavedTensor saved(a, "pow");
  return record(
      "pow", unary_forward(kernels::UnaryOp::pow, "pow", a, exponent), {&a},
      [saved, exponent](const Tensor& g) {
        return std::vector<Tensor>{mul(g, mul(pow(saved.get(), exponent - 1.0), exponent))};
      });
}

Tensor elu_plus_one(const Tensor& a) {
  SavedTensor saved(a, "elu_plus_one");
  return record("elu_plus_one", unary_forward(kernels::UnaryOp::elu_plus_one, "elu_plus_one", a),
                {&a}, [saved](const Tensor& g) {
                  const Tensor& x = saved.get();
                  Tensor d = Tensor::empty(x.shape(), x.dtype(), x.device());
                  launch::unary(x.device(), kernels::UnaryOp::elu_plus_one_grad, x, d, 0.0);
                  return std::vector<Tensor>{mul(g, d)};
                });
}

}  // namespace roformer
