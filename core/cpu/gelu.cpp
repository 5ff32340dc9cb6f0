#include <cmath>

#include "core/cpu/onednn.h"
#include "core/cpu/strided_loop.h"

namespace roformer::kernels::cpu {

namespace {

struct GeluPrimitives {
  bool ok = false;  // false: oneDNN has no kernel for this dtype here; the loop runs
  dnnl::memory::desc desc;
  dnnl::eltwise_forward forward;
  dnnl::eltwise_backward backward;
};

// Elementwise, so every tensor is seen as flat [numel].
std::shared_ptr<GeluPrimitives> primitives(DType dtype, int64_t n) {
  const std::string key = detail::concat("gelu|", dtype_name(dtype), '|', n);
  return cached_primitive<GeluPrimitives>(key, [&] {
    count_primitive_built();
    GeluPrimitives p;
    p.desc = onednn_desc({n}, {1}, dtype);
    try {
      const auto alg = dnnl::algorithm::eltwise_gelu_erf;
      dnnl::eltwise_forward::primitive_desc fwd({dnnl::prop_kind::forward_training, alg, p.desc},
                                                onednn_engine());
      dnnl::eltwise_backward::primitive_desc bwd({alg, p.desc, p.desc}, onednn_engine(), fwd);
      p.forward = dnnl::eltwise_forward(fwd);
      p.backward = dnnl::eltwise_backward(bwd);
      p.ok = true;
    } catch (const dnnl::error&) {
      p.ok = false;
    }
    return p;
  });
}

void execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args) {
  prim.execute(onednn_stream(), args);
  onednn_stream().wait();
}

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

void gelu_forward(Stream, KT x_kt, KT y_kt) {
  const View x(x_kt), y(y_kt);
  const int64_t n = x.numel();
  if (n == 0) return;
  if (x.dtype() != DType::f64) {
    auto p = primitives(x.dtype(), n);
    if (p->ok) {
      execute(p->forward, {{DNNL_ARG_SRC, onednn_memory(p->desc, x)},
                           {DNNL_ARG_DST, onednn_memory(p->desc, y)}});
      return;
    }
  }
  dispatch_floating(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data());
    T* py = static_cast<T*>(y.data());
    parallel_rows(n, 1, [&](int64_t i) {
      const A v = A(px[i]);
      py[i] = T(A(0.5) * v * (A(1) + std::erf(v * A(kInvSqrt2))));
    });
  });
}

void gelu_backward(Stream, KT x_kt, KT dy_kt, KT dx_kt) {
  const View x(x_kt), dy(dy_kt), dx(dx_kt);
  const int64_t n = x.numel();
  if (n == 0) return;
  if (x.dtype() != DType::f64) {
    auto p = primitives(x.dtype(), n);
    if (p->ok) {
      execute(p->backward, {{DNNL_ARG_SRC, onednn_memory(p->desc, x)},
                            {DNNL_ARG_DIFF_DST, onednn_memory(p->desc, dy)},
                            {DNNL_ARG_DIFF_SRC, onednn_memory(p->desc, dx)}});
      return;
    }
  }
  dispatch_floating(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data());
    const T* pg = static_cast<const T*>(dy.data());
    T* pd = static_cast<T*>(dx.data());
    // d/dx = Phi(x) + x * phi(x).
    parallel_rows(n, 1, [&](int64_t i) {
      const A v = A(px[i]);
      const A cdf = A(0.5) * (A(1) + std::erf(v * A(kInvSqrt2)));
      const A pdf = A(kInvSqrt2Pi) * std::exp(A(-0.5) * v * v);
      pd[i] = T(A(pg[i]) * (cdf + v * pdf));
    });
  });
}

}  // namespace roformer::kernels::cpu
