#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu/onednn.h"
#include "core/cpu/strided_loop.h"

namespace roformer::kernels::cpu {

namespace {

// Forward and backward primitives for one (kind, dtype, rows, cols). `ok` is
// false when oneDNN has no implementation (e.g. bf16 on an old CPU): the loop
// runs instead.
struct SoftmaxPrimitives {
  bool ok = false;
  dnnl::memory::desc desc;
  dnnl::primitive forward, backward;
};

std::shared_ptr<SoftmaxPrimitives> primitives(bool log, DType dtype, int64_t rows, int64_t cols) {
  const std::string key =
      detail::concat(log ? "logsoftmax|" : "softmax|", dtype_name(dtype), '|', rows, ',', cols);
  return cached_primitive<SoftmaxPrimitives>(key, [&] {
    count_primitive_built();
    SoftmaxPrimitives p;
    p.desc = onednn_desc({rows, cols}, {cols, 1}, dtype);
    const dnnl::engine& engine = onednn_engine();
    try {
      if (log) {
        dnnl::logsoftmax_forward::primitive_desc fwd({dnnl::prop_kind::forward_training, p.desc, 1},
                                                     engine);
        dnnl::logsoftmax_backward::primitive_desc bwd({p.desc, p.desc, 1}, engine, fwd);
        p.forward = dnnl::logsoftmax_forward(fwd);
        p.backward = dnnl::logsoftmax_backward(bwd);
      } else {
        dnnl::softmax_forward::primitive_desc fwd({dnnl::prop_kind::forward_training, p.desc, 1},
                                                  engine);
        dnnl::softmax_backward::primitive_desc bwd({p.desc, p.desc, 1}, engine, fwd);
        p.forward = dnnl::softmax_forward(fwd);
        p.backward = dnnl::softmax_backward(bwd);
      }
      p.ok = true;
    } catch (const dnnl::error&) {
      p.ok = false;
    }
    return p;
  });
}

template <class T>
void forward_loop(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  parallel_rows(rows, cols, [&](int64_t r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, A(xr[c]));
    A s = 0;
    for (int64_t c = 0; c < cols; ++c) s += std::exp(A(xr[c]) - m);
    if (log) {
      const A shift = m + std::log(s);
      for (int64_t c = 0; c < cols; ++c) yr[c] = T(A(xr[c]) - shift);
    } else {
      const A inv = A(1) / s;
      for (int64_t c = 0; c < cols; ++c) yr[c] = T(std::exp(A(xr[c]) - m) * inv);
    }
  });
}

template <class T>
void backward_loop(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  parallel_rows(rows, cols, [&](int64_t r) {
    const T* yr = y + r * cols;
    const T* gr = dy + r * cols;
    T* dr = dx + r * cols;
    A s = 0;
    if (log) {  // dx = dy - softmax * sum(dy), softmax = exp(y)
      for (int64_t c = 0; c < cols; ++c) s += A(gr[c]);
      for (int64_t c = 0; c < cols; ++c) dr[c] = T(A(gr[c]) - std::exp(A(yr[c])) * s);
    } else {  // dx = y * (dy - sum(dy * y))
      for (int64_t c = 0; c < cols; ++c) s += A(gr[c]) * A(yr[c]);
      for (int64_t c = 0; c < cols; ++c) dr[c] = T(A(yr[c]) * (A(gr[c]) - s));
    }
  });
}

void execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args) {
  prim.execute(onednn_stream(), args);
  onednn_stream().wait();
}

}  // namespace

void softmax_forward(Stream, KT x_kt, KT y_kt, bool log) {
  const View x(x_kt), y(y_kt);
  if (x.numel() == 0) return;
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  if (x.dtype() != DType::f64) {
    auto p = primitives(log, x.dtype(), rows, cols);
    if (p->ok) {
      execute(p->forward, {{DNNL_ARG_SRC, onednn_memory(p->desc, x)},
                           {DNNL_ARG_DST, onednn_memory(p->desc, y)}});
      return;
    }
  }
  dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    forward_loop<T>(static_cast<const T*>(x.data()), static_cast<T*>(y.data()), rows, cols, log);
  });
}

void softmax_backward(Stream, KT y_kt, KT dy_kt, KT dx_kt, bool log) {
  const View y(y_kt), dy(dy_kt), dx(dx_kt);
  if (y.numel() == 0) return;
  const int64_t cols = y.shape().back(), rows = y.numel() / cols;
  if (y.dtype() != DType::f64) {
    auto p = primitives(log, y.dtype(), rows, cols);
    if (p->ok) {
      execute(p->backward, {{DNNL_ARG_DST, onednn_memory(p->desc, y)},
                            {DNNL_ARG_DIFF_DST, onednn_memory(p->desc, dy)},
                            {DNNL_ARG_DIFF_SRC, onednn_memory(p->desc, dx)}});
      return;
    }
  }
  dispatch_floating(y.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    backward_loop<T>(static_cast<const T*>(y.data()), static_cast<const T*>(dy.data()),
                     static_cast<T*>(dx.data()), rows, cols, log);
  });
}

}  // namespace roformer::kernels::cpu
